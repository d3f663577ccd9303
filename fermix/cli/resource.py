"""``fermix resource list | history | show | diff | rollback``: prompt-file revisions (P2)."""

from __future__ import annotations

import argparse
import sys

from fermix import model
from fermix.cli.context import CommandContext
from fermix.cli.output import console, print_json, table, when
from fermix.core import render
from fermix.core.render import file_spec
from fermix.errors import InvalidInputError
from fermix.model import Revision


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``resource`` command group."""
    group = sub.add_parser("resource", help="inspect and roll back prompt-file revisions")
    cmds = group.add_subparsers(dest="resource_command", required=True, metavar="COMMAND")

    def target(p: argparse.ArgumentParser, *, every: bool = False) -> None:
        if every:
            p.add_argument("--agent", help="only this agent (default: every agent)")
            p.add_argument("--owner", help="only this owner (default: every owner)")
        else:
            p.add_argument("--agent", required=True, help="the agent id")
            p.add_argument("--owner", default="", help='the owner id (default: "")')
        p.add_argument("--json", action="store_true", help="print JSON")

    def name(p: argparse.ArgumentParser) -> None:
        p.add_argument("name", choices=model.RESOURCE_NAMES, help="user_md or memory_md")

    p = cmds.add_parser("list", help="list prompt-file resources and their current revisions")
    target(p, every=True)
    p.set_defaults(handler=cmd_list)

    p = cmds.add_parser("history", help="list the revisions of one resource, newest first")
    name(p)
    p.add_argument("--limit", type=int, default=20, help="at most this many revisions (20)")
    target(p)
    p.set_defaults(handler=cmd_history)

    p = cmds.add_parser("show", help="print one revision's content")
    name(p)
    p.add_argument("rev", type=int, help="revision number")
    target(p)
    p.set_defaults(handler=cmd_show)

    p = cmds.add_parser("diff", help="unified diff between two revisions")
    name(p)
    p.add_argument("a", type=int, help="the older revision")
    p.add_argument("b", type=int, help="the newer revision")
    target(p)
    p.set_defaults(handler=cmd_diff)

    p = cmds.add_parser(
        "rollback", help="write an old revision back to the file (the next rebuild replaces it)"
    )
    name(p)
    p.add_argument("rev", type=int, help="revision number to restore")
    target(p)
    p.set_defaults(handler=cmd_rollback)


def _filename(name: str) -> str:
    return file_spec(name).filename


def _who(args: argparse.Namespace) -> str:
    owner = f", owner {args.owner!r}" if args.owner else ""
    return f"agent {args.agent!r}{owner}"


def cmd_list(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix resource list``."""
    with ctx.db().read() as reads:
        found = reads.resources(args.agent)
    if args.owner is not None:
        found = [r for r in found if r.owner_id == args.owner]
    if args.json:
        print_json(
            [
                {
                    "agent_id": r.agent_id,
                    "owner_id": r.owner_id,
                    "name": r.name,
                    "file": _filename(r.name),
                    "current_revision": r.current_revision,
                    "updated_at": r.updated_at,
                }
                for r in found
            ]
        )
        return 0
    out = console()
    if not found:
        out.print("resources: none yet (prompt files are recorded on their first rebuild)")
        return 0
    rows = [
        (r.agent_id, r.owner_id, r.name, _filename(r.name), r.current_revision, when(r.updated_at))
        for r in found
    ]
    out.print(table("resources", ["agent", "owner", "name", "file", "revision", "updated"], rows))
    return 0


def _limit(value: int) -> int:
    if not 1 <= value <= 100_000:
        raise InvalidInputError(f"--limit must be between 1 and 100000, not {value}")
    return value


def cmd_history(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix resource history NAME``."""
    with ctx.db().read() as reads:
        revisions = reads.revisions(
            args.agent, args.name, owner_id=args.owner, limit=_limit(args.limit)
        )
    if args.json:
        print_json([_summary(r) for r in revisions])
        return 0
    out = console()
    title = f"{args.name} of {_who(args)}"
    if not revisions:
        out.print(f"{title}: no revisions", markup=False)
        return 0
    rows = [
        (
            r.revision,
            r.reason,
            len(r.content.splitlines()),
            len(r.content.encode("utf-8")),
            r.content_sha1[:12],
            when(r.created_at),
        )
        for r in revisions
    ]
    out.print(table(title, ["rev", "reason", "lines", "bytes", "sha1", "created"], rows))
    return 0


def _summary(revision: Revision) -> dict[str, object]:
    data = revision.as_dict()
    del data["content"]
    data["bytes"] = len(revision.content.encode("utf-8"))
    return data


def _revision(ctx: CommandContext, args: argparse.Namespace, number: int) -> Revision:
    with ctx.db().read() as reads:
        return reads.revision(args.agent, args.name, number, owner_id=args.owner)


def cmd_show(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix resource show NAME REV``: the content, verbatim."""
    revision = _revision(ctx, args, args.rev)
    if args.json:
        print_json(revision.as_dict())
    else:
        # Written as is: stored text is never interpreted as console markup.
        sys.stdout.write(revision.content)
    return 0


def cmd_diff(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix resource diff NAME A B``: a unified diff from revision A to revision B."""
    old, new = _revision(ctx, args, args.a), _revision(ctx, args, args.b)
    text = render.revision_diff(old, new)
    if args.json:
        print_json({"name": args.name, "a": old.revision, "b": new.revision, "diff": text})
    else:
        sys.stdout.write(text)
    return 0


def cmd_rollback(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix resource rollback NAME REV``: write revision REV back to the file."""
    result = ctx.services().files.rollback(args.agent, args.name, args.rev, owner_id=args.owner)
    recorded = None if result.revision is None else result.revision.revision
    if args.json:
        print_json(
            {
                "name": args.name,
                "rolled_back_to": args.rev,
                "recorded_revision": recorded,
                "file": str(result.path),
                "written": result.written,
            }
        )
        return 0
    note = (
        f"recorded as revision {recorded}"
        if recorded is not None
        else "already the current revision"
    )
    console().print(
        f"{_filename(args.name)} of {_who(args)} rolled back to revision {args.rev} ({note})."
        " The next rebuild from the memory rows will write the rendered content again.",
        markup=False,
    )
    return 0
