"""``fermix supervisor start | stop | status``: the tree as a background service (A8)."""

from __future__ import annotations

import argparse
import sys
import time

from fermix.cli.context import CommandContext
from fermix.cli.output import console, print_json, table
from fermix.server import service


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``supervisor`` command group."""
    group = sub.add_parser("supervisor", help="run the actor tree as a background service")
    cmds = group.add_subparsers(dest="supervisor_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("start", help="start the service (in the background by default)")
    p.add_argument(
        "--foreground", action="store_true", help="run in this process (for systemd or a terminal)"
    )
    p.add_argument("--announce", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--host", help="address to listen on ([fermix_core.server] host)")
    p.add_argument("--port", type=int, help="TCP port ([fermix_core.server] port; 0: any free)")
    p.add_argument("--socket", metavar="PATH", help="listen on this Unix socket instead")
    p.add_argument(
        "--allow-public-bind",
        action="store_true",
        help="listen on a non-loopback address (only with TLS in front)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it (30)")
    p.set_defaults(handler=cmd_start)

    p = cmds.add_parser("stop", help="stop the service gracefully, finishing in-flight writes")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it (30)")
    p.set_defaults(handler=cmd_stop)

    p = cmds.add_parser("status", help="whether the service runs, since when, what it holds")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_status)


def cmd_start(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix supervisor start``."""
    if args.foreground:
        import logging

        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )

        def announce() -> None:
            if args.announce:
                # The parent waits for this line; later output goes to the log file.
                sys.stdout.write(service.READY_LINE + "\n")
                sys.stdout.flush()
                sys.stdout.close()

        from fermix.server import serving

        return serving.serve(
            ctx.home,
            announce=announce,
            host=args.host,
            port=args.port,
            socket=args.socket,
            allow_public=args.allow_public_bind,
        )
    pid = service.start_background(ctx.home, timeout=args.timeout, extra=_listen_args(args))
    console().print(f"supervisor started (pid {pid}); log: {service.ServicePaths.of(ctx.home).log}")
    return 0


def _listen_args(args: argparse.Namespace) -> list[str]:
    """The listen options of ``start``, passed on to the background process."""
    extra: list[str] = []
    for flag, value in (("--host", args.host), ("--port", args.port), ("--socket", args.socket)):
        if value is not None:
            extra += [flag, str(value)]
    if args.allow_public_bind:
        extra.append("--allow-public-bind")
    return extra


def cmd_stop(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix supervisor stop``."""
    pid = service.stop(ctx.home, timeout=args.timeout)
    console().print(
        "supervisor was not running" if pid is None else f"supervisor stopped (pid {pid})"
    )
    return 0


def cmd_status(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix supervisor status``: exit 0 when it runs, 1 when it does not."""
    paths = service.ServicePaths.of(ctx.home)
    pid = service.running_pid(paths)
    data: dict[str, object] = {"running": pid is not None, "pid": pid}
    if pid is not None:
        data.update(service.query_status(paths))
    if args.json:
        print_json(data)
    elif pid is None:
        console().print("supervisor is not running")
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(str(data["started_at"]))))
        rows = [
            ("pid", pid),
            ("running since", since),
            ("live conversations", data["live_conversations"]),
            ("passivated", data["passivated"]),
            ("children", ", ".join(map(str, data["children"]))),  # type: ignore[call-overload]
        ]
        console().print(table("supervisor", ["", ""], rows))
    return 0 if pid is not None else 1
