"""``fermix memory review --now``: run the reviewer from the command line (E10)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fermix.cli.context import CommandContext
from fermix.errors import InvalidInputError

if TYPE_CHECKING:
    from fermix.core.review import ReviewResult


def add_command(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``review`` to the ``memory`` command group."""
    p = cmds.add_parser(
        "review", help="distil facts from new user messages now (every conversation by default)"
    )
    p.add_argument(
        "--now",
        action="store_true",
        required=True,
        help="run now, past the review interval and the failure backoff",
    )
    p.add_argument("--conversation", metavar="CHANNEL:CHAT_ID", help="only this conversation")
    p.add_argument("--agent", help="only conversations of this agent id")
    p.add_argument("--owner", help="only conversations of this owner id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_review)


def cmd_review(ctx: CommandContext, args: argparse.Namespace) -> int:
    """Review every matching conversation with new user messages; exit 1 if one failed."""
    # Imported here: the rest of ``fermix memory`` must start fast (no model code).
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from fermix.cli.output import console, print_json, table

    channel = chat_id = None
    if args.conversation is not None:
        channel, sep, chat_id = args.conversation.partition(":")
        if not sep or not channel or not chat_id:
            raise InvalidInputError("--conversation must look like CHANNEL:CHAT_ID")
    services = ctx.services()
    with services.storage.read() as reads:
        pending = reads.with_new_user_messages(
            agent_id=args.agent, owner_id=args.owner, channel=channel, chat_id=chat_id
        )
    reviewing = services.reviewing
    results: list[ReviewResult] = []
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        console=console(),
        transient=True,
        disable=args.json,
    ) as progress:
        task = progress.add_task("reviewing", total=len(pending))
        for state, count in pending:
            progress.update(
                task, description=f"reviewing {state.key.scope_id} ({count} new messages)"
            )
            results.append(reviewing.review(state.key, force=True))
            progress.advance(task)
    failed = [r for r in results if r.status == "failed"]
    if args.json:
        print_json({"reviews": [r.as_dict() for r in results], "failed": len(failed)})
    elif not results:
        console().print("no conversation has new user messages to review")
    else:
        console().print(
            table(
                "memory review",
                [
                    "conversation",
                    "status",
                    "msgs",
                    "added",
                    "replaced",
                    "archived",
                    "refused",
                    "model / error",
                ],
                [
                    (
                        f"{r.key.agent_id}/{r.key.scope_id}",
                        r.status if r.skip is None else f"skipped: {r.skip.value}",
                        r.messages,
                        r.added,
                        r.replaced,
                        r.archived,
                        len(r.refused),
                        r.error or r.model or "",
                    )
                    for r in results
                ],
            )
        )
    return 1 if failed else 0
