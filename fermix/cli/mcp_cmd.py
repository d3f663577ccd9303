"""``fermix mcp``: the memory tools and prompt files over MCP on stdio (N5).

An MCP client (a desktop assistant, an IDE) starts ``fermix mcp --agent ID`` and talks
MCP over its stdin and stdout until it closes stdin. The command opens the home's memory
embedded, as a host would (several processes may share a home), and acts as the
conversation ``(agent, "mcp", chat)`` of ``--owner``. Stdout carries only the protocol:
logs go to stderr. The trust is a guest's unless ``--operator`` is given: the local user
running the command on their own home may say they are the operator, which lets it read
the prompt files of the agent's other owners too.
"""

from __future__ import annotations

import argparse
import logging
import sys

import anyio

from fermix.cli.context import CommandContext


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``mcp`` command."""
    p = sub.add_parser("mcp", help="serve the memory tools and prompt files over MCP (stdio)")
    p.add_argument("--agent", required=True, metavar="ID", help="the agent to act for")
    p.add_argument("--owner", default="", metavar="ID", help="the owner (default: the agent's)")
    p.add_argument(
        "--chat", default="", metavar="ID", help="the chat of the conversation (default: owner)"
    )
    p.add_argument(
        "--operator", action="store_true", help="act with the operator's trust (your own home)"
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="what to log to stderr (WARNING)",
    )
    p.set_defaults(handler=cmd_mcp)


def cmd_mcp(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix mcp``: serve until the client closes stdin."""
    from fermix.api import Memory
    from fermix.server.mcp import Identity, build_server, serve_stdio

    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    identity = Identity(
        args.agent, args.owner, args.chat, trust="operator" if args.operator else "guest"
    )
    with Memory(ctx.home) as memory:
        anyio.run(serve_stdio, build_server(memory, identity))
    return 0
