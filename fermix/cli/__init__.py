"""The ``fermix`` command line: operator commands over a home.

Typed errors become one-line messages and exit codes: 0 success, 1 a failure, 2 bad
usage or input, 3 something asked for does not exist. No command here imports litellm
unless it calls a model. ``fermix`` alone prints the help; ``--home DIR`` is accepted
before the command and after it, at every level.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from fermix.errors import FermixError, InvalidInputError, NotFoundError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
HOME_HELP = "fermix home directory (default: $FERMIX_HOME, else ~/.fermix)"


class CommandParser(argparse.ArgumentParser):
    """The parser of a command or command group: also takes ``--home DIR``.

    Its default is suppressed, so a command that was not given ``--home`` leaves the value
    given before the command (or None) as it is; given in both places, the later one wins.
    Subcommand parsers are made of the same class (argparse uses the parent's class), so
    every level of every command group takes it without registering it itself.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--home", metavar="DIR", default=argparse.SUPPRESS, help=HOME_HELP)


def version() -> str:
    """The installed distribution's version, or ``unknown`` when fermix is not installed."""
    from importlib import metadata

    try:
        return metadata.version("fermix")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, every command group registered."""
    from fermix.cli import (
        chat,
        config_cmd,
        doctor,
        hermes_cmd,
        index,
        job,
        mcp_cmd,
        memory,
        owner,
        resource,
        restore,
        server,
        setup,
        token,
    )

    parser = argparse.ArgumentParser(
        prog="fermix",
        description="Durable conversation memory and long-term user facts for chat-bot hosts.",
    )
    parser.add_argument("--home", metavar="DIR", help=HOME_HELP)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    command_parser: type[argparse.ArgumentParser] = CommandParser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=command_parser)
    chat.register(sub)
    memory.register(sub)
    owner.register(sub)
    job.register(sub)
    mcp_cmd.register(sub)
    resource.register(sub)
    server.register(sub)
    config_cmd.register(sub)
    doctor.register(sub)
    setup.register(sub)
    restore.register(sub)
    token.register(sub)
    index.register(sub)
    hermes_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code."""
    from fermix.cli.context import CommandContext
    from fermix.home import Home

    arguments = list(sys.argv[1:] if argv is None else argv)
    for argument in arguments:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            print(f"fermix: argument {argument!r} is not valid UTF-8 text", file=sys.stderr)
            return EXIT_USAGE
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.version:
        print(f"fermix {version()}")
        return EXIT_OK
    if args.command is None:  # ``fermix`` alone: what there is to run, not an error
        parser.print_help()
        return EXIT_OK
    if notice := getattr(args, "deprecated", None):
        print(f"fermix: {notice}", file=sys.stderr)
    try:
        ctx = CommandContext(Home.resolve(args.home))
        try:
            code: int = args.handler(ctx, args)
        finally:
            ctx.close()
    except NotFoundError as exc:
        print(f"fermix: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except InvalidInputError as exc:
        print(f"fermix: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FermixError as exc:
        print(f"fermix: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        print(f"fermix: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("fermix: interrupted", file=sys.stderr)
        return 130
    return code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
