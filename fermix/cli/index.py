"""``fermix index status|rebuild``: the vectors of recall (Q2).

``status`` shows the configured embedding model, the one the stored vectors are of, and how
many messages and live memory rows have a vector. ``rebuild`` drops every vector and
computes them all again with the configured model, here and now, behind a progress bar
(``--missing``: only the rows without one). A running host embeds in the background by
itself; this is for a model change, a home copied from elsewhere, or impatience.
"""

from __future__ import annotations

import argparse
from typing import Any

from fermix.cli.context import CommandContext
from fermix.errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``index`` command group."""
    p = sub.add_parser("index", help="the vectors of recall: status, rebuild")
    group = p.add_subparsers(dest="index_command", metavar="COMMAND", required=True)
    status = group.add_parser("status", help="vector coverage and the model they are of")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=cmd_status)
    rebuild = group.add_parser(
        "rebuild", help="compute every vector again with the configured model"
    )
    rebuild.add_argument(
        "--missing", action="store_true", help="only the rows that have no vector yet"
    )
    rebuild.add_argument("--json", action="store_true", help="print JSON, no progress bar")
    rebuild.set_defaults(handler=cmd_rebuild)


def _status(ctx: CommandContext) -> dict[str, Any]:
    from fermix.config import load_config
    from fermix.embedding import WORDLLAMA, WordLlamaEmbedder

    config = load_config(ctx.home.config_path).embedding
    with ctx.db().read() as reads:
        found = reads.vector_coverage()
    configured = WordLlamaEmbedder.name if config.model == WORDLLAMA else f"litellm/{config.model}"
    return {
        "enabled": config.enabled,
        "configured_model": configured,
        "recorded_model": found.model,
        "dim": found.dim,
        "model_matches": found.model == configured,
        "messages": found.messages,
        "message_vectors": found.message_vectors,
        "memory_rows": found.memories,
        "memory_row_vectors": found.memory_vectors,
    }


def _share(done: int, total: int) -> str:
    return f"{done} of {total}" + (f" ({100 * done / total:.1f} %)" if total else "")


def cmd_status(ctx: CommandContext, args: argparse.Namespace) -> int:
    """Print the coverage of the vectors and the model they are of."""
    from fermix.cli.output import console, print_json, table

    status = _status(ctx)
    if args.json:
        print_json(status)
        return 0
    rows = [
        ("embedding", "on" if status["enabled"] else "off ([fermix_core.embedding] enabled)"),
        ("configured model", status["configured_model"]),
        (
            "vectors of",
            f"{status['recorded_model']} ({status['dim']} dims)"
            if status["recorded_model"]
            else "none yet",
        ),
        ("messages", _share(status["message_vectors"], status["messages"])),
        ("memory rows", _share(status["memory_row_vectors"], status["memory_rows"])),
    ]
    console().print(table("index", ("", "value"), rows))
    if status["recorded_model"] and not status["model_matches"]:
        console().print("the vectors are of another model: `fermix index rebuild` redoes them")
    return 0


def cmd_rebuild(ctx: CommandContext, args: argparse.Namespace) -> int:
    """Compute the vectors again (or the missing ones) with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from fermix.cli.output import console, print_json

    indexer = ctx.services().indexer
    if indexer is None:
        raise ConfigError("embedding is off: set [fermix_core.embedding] enabled = true")
    indexer.record()
    if not args.missing:
        ctx.writer().write(lambda w: w.reset_vectors(), label="index rebuild")
    before = _status(ctx)
    total = before["messages"] - before["message_vectors"]
    total += before["memory_rows"] - before["memory_row_vectors"]
    with Progress(
        TextColumn("embedding"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console(),
        transient=True,
        disable=args.json,
    ) as progress:
        task = progress.add_task("embedding", total=total)
        done = indexer.catch_up(lambda n: progress.advance(task, n))
    after = _status(ctx)
    if args.json:
        print_json({"embedded": done, **after})
    else:
        console().print(
            f"embedded {done} rows with {after['recorded_model']}: messages"
            f" {_share(after['message_vectors'], after['messages'])}, memory rows"
            f" {_share(after['memory_row_vectors'], after['memory_rows'])}"
        )
    return 0
