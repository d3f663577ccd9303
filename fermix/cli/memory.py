"""``fermix memory list | show | search | restore``: memory rows for operators (S7, E10)."""

from __future__ import annotations

import argparse

from fermix import model
from fermix.cli import review
from fermix.cli.context import CommandContext
from fermix.cli.output import FittedTable, clip, console, print_json, table, when
from fermix.core import categories
from fermix.core.render import file_spec
from fermix.errors import InvalidInputError, WriteFailedError
from fermix.model import MemoryRow, Scope


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``memory`` command group."""
    group = sub.add_parser("memory", help="inspect and restore long-term memory rows")
    cmds = group.add_subparsers(dest="memory_command", required=True, metavar="COMMAND")

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--agent", help="only rows of this agent id")
        p.add_argument("--owner", help="only rows of this owner id")
        p.add_argument(
            "--scope",
            metavar="TYPE[:ID]",
            help="only rows of this scope type (owner, agent, conversation, job), or one scope",
        )
        p.add_argument("--category", choices=model.CATEGORIES, help="only this category")
        p.add_argument(
            "--archived",
            action="store_true",
            help="show archived rows instead of live ones",
        )
        p.add_argument("--limit", type=int, default=100, help="at most this many rows (100)")
        p.add_argument("--json", action="store_true", help="print JSON")

    p = cmds.add_parser("list", help="list memory rows, most recently updated first")
    filters(p)
    p.set_defaults(handler=cmd_list)

    p = cmds.add_parser("search", help="full-text search over keys and values")
    p.add_argument("text", help="any text; FTS syntax in it is treated as plain words")
    filters(p)
    p.set_defaults(handler=cmd_search)

    p = cmds.add_parser("show", help="show every field of one row")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_show)

    p = cmds.add_parser("restore", help="un-archive a row and rebuild its agent's prompt files")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_restore)

    review.add_command(cmds)


def _scope_filter(text: str | None) -> tuple[str | None, list[Scope] | None]:
    if text is None:
        return None, None
    kind, _, scope_id = text.partition(":")
    if kind not in model.SCOPE_TYPES:
        raise InvalidInputError(
            f"--scope must start with one of {', '.join(model.SCOPE_TYPES)}, not {kind!r}"
        )
    return (kind, None) if not scope_id else (None, [Scope(kind, scope_id)])


def _limit(value: int) -> int:
    if not 1 <= value <= 100_000:
        raise InvalidInputError(f"--limit must be between 1 and 100000, not {value}")
    return value


def _renders_in(row: MemoryRow) -> str:
    """Where ``row`` renders for its own agent and owner: USER.md, MEMORY.md or a dash."""
    target = categories.render_target(row)
    return "—" if target is None else file_spec(target).filename


def _scope_shown(row: MemoryRow) -> str:
    """The row's scope as the table shows it: the bare type when it is the row's own owner
    or agent scope (the owner and agent say whose), else ``type:id``."""
    own = {"owner": categories.owner_scope_id(row.owner_id), "agent": row.agent_id}
    if own.get(row.scope_type) == row.scope_id:
        return row.scope_type
    return f"{row.scope_type}:{row.scope_id}"


def rows_table(title: str, rows: list[MemoryRow]) -> FittedTable:
    """The table of ``memory list`` and ``memory search`` (at least one row).

    Made to be read at 80 columns: the agent or owner, when every row has the same, is
    said once in the title instead of in a column; id, category, renders and updated are
    never cut or wrapped; agent, owner and scope are cut with an ellipsis when the width
    runs short; only the key and the value wrap. ``--json`` has every field in full.
    """
    columns = ["id", "agent", "owner", "scope", "category", "key", "value", "renders", "updated"]
    agents = {r.agent_id for r in rows}
    owners = {r.owner_id for r in rows}
    if len(agents) == 1:
        title += f" · agent {next(iter(agents))}"
        columns.remove("agent")
    if len(owners) == 1:
        owner = next(iter(owners))
        title += f" · owner {owner}" if owner else " · the single-user owner"
        columns.remove("owner")
    cells = [
        {
            "id": r.id,
            "agent": r.agent_id,
            "owner": r.owner_id,
            "scope": _scope_shown(r),
            "category": r.category,
            "key": clip(r.key, 30),
            "value": clip(r.value, 50),
            "renders": _renders_in(r),
            "updated": when(r.updated_at),
        }
        for r in rows
    ]
    return FittedTable(
        title,
        columns,
        [[row[c] for c in columns] for row in cells],
        wrap=("key", "value"),
        cut=("agent", "owner", "scope"),
    )


def _print_rows(title: str, rows: list[MemoryRow], as_json: bool) -> None:
    if as_json:
        print_json([{**row.as_dict(), "renders_in": categories.render_target(row)} for row in rows])
        return
    out = console()
    if not rows:
        out.print(f"{title}: no rows", markup=False)
        return
    out.print(rows_table(title, rows))


def cmd_list(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory list``."""
    scope_type, scopes = _scope_filter(args.scope)
    with ctx.db().read() as reads:
        rows = reads.rows(
            agent_id=args.agent,
            owner_id=args.owner,
            scope_type=scope_type,
            scopes=scopes,
            category=args.category,
            archived=args.archived,
            limit=_limit(args.limit),
        )
    _print_rows("archived memory rows" if args.archived else "memory rows", rows, args.json)
    return 0


def cmd_search(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory search TEXT``."""
    scope_type, scopes = _scope_filter(args.scope)
    with ctx.db().read() as reads:
        rows = reads.search_rows(
            args.text,
            agent_id=args.agent,
            owner_id=args.owner,
            scope_type=scope_type,
            scopes=scopes,
            category=args.category,
            archived=args.archived,
            limit=_limit(args.limit),
        )
    archived = "archived " if args.archived else ""
    _print_rows(f"{archived}rows matching {clip(args.text, 40)!r}", rows, args.json)
    return 0


def cmd_show(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory show ID``."""
    with ctx.db().read() as reads:
        row = reads.require_row(args.id)
    if args.json:
        print_json(row.as_dict())
        return 0
    out = console()
    data = row.as_dict()
    out.print(table(f"memory row {row.id}", ["field", "value"], list(data.items())))
    return 0


def cmd_restore(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory restore ID``: clear the archive fields, then rebuild prompt files."""
    # The row may show again in its agent's prompt files (C5): the writer rebuilds every
    # file it shows in (a shared agent-scoped row: every owner's MEMORY.md).
    written = ctx.writer().write_rows(
        lambda w: [w.require_row(args.id), w.restore_row(args.id)],
        label=f"restore of row {args.id}",
        reason=f"restore:{args.id}",
    )
    if written.error is not None:
        raise WriteFailedError(written.error)
    before, row = written.rows
    changed = [
        {"agent_id": r.agent_id, "owner_id": r.owner_id, "name": f.name, "file": str(f.path)}
        for r in written.files
        for f in r.files
        if f.written or f.revision is not None
    ]
    if args.json:
        print_json({"restored": row.as_dict(), "was_archived": before.archived, "rebuilt": changed})
    else:
        out = console()
        state = "restored" if before.archived else "was not archived; nothing to restore"
        out.print(f"memory row {row.id} ({row.key!r}) {state}", markup=False)
        for item in changed:
            out.print(f"rebuilt {item['file']}", markup=False)
    return 0
