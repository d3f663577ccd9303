"""``fermix token create | list | revoke``: the memory server's bearer tokens (N2).

Tokens are made here only, never over HTTP: whoever can run ``fermix`` on the home can
read its database anyway, so the command line is the one place a new secret can come from
without a token to ask for it first. ``create`` prints the secret once (the database keeps
only its hash, so it cannot be shown again); ``list`` shows each token's first characters
to tell them apart, never a secret; ``revoke`` refuses a token from its next request on.
"""

from __future__ import annotations

import argparse
import sys

from fermix.cli.context import CommandContext
from fermix.cli.output import FittedTable, console, print_json, when
from fermix.runtime.access import Tokens
from fermix.wire import to_json

NOT_SHOWN_AGAIN = "This secret will not be shown again: store it now (only its hash is kept)."


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``token`` command group."""
    group = sub.add_parser("token", help="make, list and revoke the memory server's tokens")
    cmds = group.add_subparsers(dest="token_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("create", help="make a token; its secret is printed once")
    p.add_argument(
        "--agent",
        action="append",
        required=True,
        metavar="ID",
        help="an agent the token may act for (repeat for several)",
    )
    p.add_argument(
        "--operator",
        action="store_true",
        help="an operator token: operator trust, restores, rollbacks, status",
    )
    p.add_argument("--name", default="", metavar="TEXT", help="what the token is for")
    p.add_argument("--json", action="store_true", help="print JSON (the secret included)")
    p.set_defaults(handler=cmd_create)

    p = cmds.add_parser("list", help="list the tokens (never their secrets)")
    p.add_argument("--all", action="store_true", help="revoked tokens too")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_list)

    p = cmds.add_parser("revoke", help="revoke a token: refused from its next request on")
    p.add_argument("id", type=int)
    p.set_defaults(handler=cmd_revoke)


def _tokens(ctx: CommandContext) -> Tokens:
    return Tokens(ctx.db(), ctx.writer())


def cmd_create(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix token create``."""
    token, secret = _tokens(ctx).create(args.agent, operator=args.operator, name=args.name)
    if args.json:
        print_json({**to_json(token), "secret": secret, "note": NOT_SHOWN_AGAIN})
        return 0
    kind = "operator token" if token.operator else "token"
    # The secret goes alone on its line, plainly, so that it can be copied or cut out.
    sys.stdout.write(f"{secret}\n")
    sys.stdout.flush()
    console().print(
        f"{kind} {token.id} for {', '.join(token.agents)}"
        + (f" ({token.name})" if token.name else "")
    )
    console().print(NOT_SHOWN_AGAIN)
    return 0


def cmd_list(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix token list``."""
    tokens = _tokens(ctx).list(include_revoked=args.all)
    if args.json:
        print_json({"tokens": to_json(tokens)})
        return 0
    if not tokens:
        console().print("no tokens" if args.all else "no live tokens (--all shows revoked ones)")
        return 0
    rows = [
        (
            t.id,
            t.name,
            t.prefix + "…",
            ", ".join(t.agents),
            "yes" if t.operator else "",
            when(t.created_at),
            when(t.revoked_at),
        )
        for t in tokens
    ]
    columns = ["id", "name", "prefix", "agents", "operator", "created", "revoked"]
    console().print(FittedTable("tokens", columns, rows, cut=("name", "agents")))
    return 0


def cmd_revoke(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix token revoke ID``: exit 3 when there is no such token."""
    token = _tokens(ctx).revoke(args.id)
    console().print(f"token {token.id} revoked ({token.prefix}…)")
    return 0
