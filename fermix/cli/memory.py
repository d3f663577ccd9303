"""``fermix memory list | show | search | restore``: memory rows for operators (S7, E10)."""

from __future__ import annotations

import argparse

from fermix import model
from fermix.cli import review
from fermix.cli.context import CommandContext
from fermix.cli.output import clip, console, print_json, table, when
from fermix.core import categories
from fermix.core.render import file_spec
from fermix.errors import InvalidInputError
from fermix.model import MemoryRow, Scope
from fermix.runtime import prompt_files
from fermix.storage import memories, transaction


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


def _print_rows(ctx: CommandContext, title: str, rows: list[MemoryRow], as_json: bool) -> None:
    if as_json:
        print_json([{**row.as_dict(), "renders_in": categories.render_target(row)} for row in rows])
        return
    out = console()
    if not rows:
        out.print(f"{title}: no rows", markup=False)
        return
    out.print(
        table(
            title,
            ["id", "agent", "owner", "scope", "category", "key", "value", "renders", "updated"],
            [
                (
                    r.id,
                    r.agent_id,
                    r.owner_id,
                    f"{r.scope_type}:{r.scope_id}",
                    r.category + (" (archived)" if r.archived else ""),
                    clip(r.key, 30),
                    clip(r.value, 50),
                    _renders_in(r),
                    when(r.updated_at),
                )
                for r in rows
            ],
        )
    )


def cmd_list(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory list``."""
    scope_type, scopes = _scope_filter(args.scope)
    rows = memories.list_rows(
        ctx.db(),
        agent_id=args.agent,
        owner_id=args.owner,
        scope_type=scope_type,
        scopes=scopes,
        category=args.category,
        archived=args.archived,
        limit=_limit(args.limit),
    )
    _print_rows(ctx, "archived memory rows" if args.archived else "memory rows", rows, args.json)
    return 0


def cmd_search(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory search TEXT``."""
    scope_type, scopes = _scope_filter(args.scope)
    rows = memories.search(
        ctx.db(),
        args.text,
        agent_id=args.agent,
        owner_id=args.owner,
        scope_type=scope_type,
        scopes=scopes,
        category=args.category,
        archived=args.archived,
        limit=_limit(args.limit),
    )
    _print_rows(ctx, f"rows matching {clip(args.text, 40)!r}", rows, args.json)
    return 0


def cmd_show(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory show ID``."""
    row = memories.require(ctx.db(), args.id)
    if args.json:
        print_json(row.as_dict())
        return 0
    out = console()
    data = row.as_dict()
    out.print(table(f"memory row {row.id}", ["field", "value"], list(data.items())))
    return 0


def cmd_restore(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix memory restore ID``: clear the archive fields, then rebuild prompt files."""
    conn = ctx.db()
    with transaction(conn):
        before = memories.require(conn, args.id)
        row = memories.restore(conn, args.id)
    # The row may show again in its agent's prompt files (C5); a shared agent-scoped row
    # shows in every owner's MEMORY.md, so rebuild_for_rows works out which files.
    rebuilt = prompt_files.rebuild_for_rows(conn, ctx.home, [row], reason=f"restore:{row.id}")
    ctx.after_memory_write(row.agent_id)
    changed = [
        {"agent_id": r.agent_id, "owner_id": r.owner_id, "name": f.name, "file": str(f.path)}
        for r in rebuilt
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
