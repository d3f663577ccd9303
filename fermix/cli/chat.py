"""``fermix chat``: the interactive terminal host (H2)."""

from __future__ import annotations

import argparse

from fermix.cli.context import CommandContext


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``chat`` command."""
    p = sub.add_parser("chat", help="chat in the terminal with an agent that has memory")
    p.add_argument("--model", help="litellm model name (replaces the configured route)")
    p.add_argument(
        "--fallback", action="append", metavar="MODEL", help="a fallback model (repeatable)"
    )
    p.add_argument("--api-base", help="an OpenAI-compatible server: llama.cpp, vLLM, Ollama...")
    p.add_argument("--agent", default="default", help="agent id (default: default)")
    p.add_argument("--chat-id", default="terminal", help="conversation id (default: terminal)")
    p.add_argument("--owner", default="", help="owner id (default: the single-user owner)")
    p.add_argument(
        "--trust",
        choices=("operator", "guest"),
        default="operator",
        help="your trust (default: operator: the terminal is the operator's own;"
        " guest tries the bot as a user would, M2)",
    )
    p.add_argument("--system", help="system prompt")
    p.set_defaults(handler=cmd_chat)


def cmd_chat(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix chat``."""
    from fermix.cli.chat_host import DEFAULT_SYSTEM, ChatOptions, run_chat
    from fermix.cli.output import console
    from fermix.config import load_config

    options = ChatOptions(
        agent_id=args.agent,
        chat_id=args.chat_id,
        owner_id=args.owner,
        trust=args.trust,
        model=args.model,
        fallbacks=tuple(args.fallback) if args.fallback else None,
        api_base=args.api_base,
        system=args.system or DEFAULT_SYSTEM,
    )
    return run_chat(ctx.home, load_config(ctx.home.config_path), options, console())
