"""``fermix owner forget | export | erasures``: a person's data, erased or handed back (F1,
F5, F6, F8).

``forget`` erases for good and asks for ``--yes`` first; ``export`` writes one JSON
document (to a file created owner-only, or to standard output); ``erasures`` lists the
audit records, and ``--finish`` finishes the ones a kill or a reader left (as ``fermix
doctor --fix`` does).
"""

from __future__ import annotations

import argparse
import sys

from fermix.cli.context import CommandContext
from fermix.cli.output import console, print_json, table, when
from fermix.errors import InvalidInputError
from fermix.model import ForgetReport


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``owner`` command group."""
    group = sub.add_parser("owner", help="forget or export everything of one owner (user)")
    cmds = group.add_subparsers(dest="owner_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("forget", help="erase every message, row and file of one owner")
    p.add_argument("owner_id", help="the owner's id, exactly (never a pattern)")
    p.add_argument("--agent", help="only this agent's data of the owner (default: every agent)")
    p.add_argument("--yes", action="store_true", help="erase for good: nothing is asked")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_forget)

    p = cmds.add_parser("export", help="write everything kept of one owner as one JSON document")
    p.add_argument("owner_id", help="the owner's id, exactly")
    p.add_argument("--agent", help="only this agent's data of the owner (default: every agent)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (made 0600); default stdout")
    p.set_defaults(handler=cmd_export)

    p = cmds.add_parser("erasures", help="the erasure records (the audit), newest first")
    p.add_argument("--limit", type=int, default=20, help="at most this many (20)")
    p.add_argument("--finish", action="store_true", help="finish erasures left unfinished")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_erasures)


def cmd_forget(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix owner forget ID [--agent ID] --yes``."""
    if not args.yes:
        raise InvalidInputError(
            f"forgetting {args.owner_id!r} erases their data for good: run again with --yes"
        )
    report = ctx.services().forgetting.forget_owner(args.owner_id, agent_id=args.agent)
    _print_report(report, json=args.json)
    return 0


def cmd_export(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix owner export ID [--agent ID] [-o FILE]``."""
    from fermix.runtime import exporting

    storage = ctx.db()
    if args.output is None:
        exporting.check_owner(storage, args.owner_id, args.agent)
        for piece in exporting.chunks(storage, args.owner_id, agent_id=args.agent):
            sys.stdout.buffer.write(piece)
        sys.stdout.buffer.flush()
        return 0
    written = exporting.write(storage, args.owner_id, args.output, agent_id=args.agent)
    print(f"wrote {written:,} bytes to {args.output}", file=sys.stderr)
    return 0


def cmd_erasures(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix owner erasures [--finish]``."""
    forgetting = ctx.services().forgetting
    finished = forgetting.resume() if args.finish else []
    with ctx.db().read() as reads:
        records = reads.erasures(limit=args.limit)
    if args.json:
        print_json(
            {
                "finished": [r.as_dict() for r in finished],
                "erasures": [e.as_dict() for e in records],
            }
        )
        return 0
    for report in finished:
        _print_report(report, json=False)
    rows = [
        (
            str(e.id),
            e.target,
            e.agent_id or "(every agent)",
            e.state,
            ", ".join(f"{k} {v}" for k, v in sorted(e.counts.items())) or "-",
            when(e.started_at),
            e.requested_by,
        )
        for e in records
    ]
    console().print(
        table("erasures", ["id", "target", "agent", "state", "erased", "started", "by"], rows)
    )
    return 0


def _print_report(report: ForgetReport, *, json: bool) -> None:
    if json:
        print_json(report.as_dict())
        return
    out = console()
    erased = ", ".join(f"{n} {kind}" for kind, n in sorted(report.counts.items())) or "nothing"
    out.print(f"erasure {report.erasure_id} ({report.target}): {report.state}; erased {erased}")
    if not report.done:
        out.print(f"left: {report.left}; `fermix owner erasures --finish` finishes it later")
