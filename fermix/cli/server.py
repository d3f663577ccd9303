"""``fermix server start | stop | status``: the memory server as a background service (A8).

``fermix supervisor start | stop | status``, the commands' old name, still works: a
deprecated alias that prints a one-line notice on stderr first.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from fermix.cli.context import CommandContext
from fermix.cli.output import FittedTable, console, print_json, table
from fermix.server import service


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``server`` command group, and ``supervisor``, its deprecated alias (unlisted)."""
    _add_commands(sub.add_parser("server", help="run the memory server as a background service"))
    # No help: argparse lists only the subparsers given one, so the alias stays unlisted.
    alias = sub.add_parser("supervisor", description="deprecated: use `fermix server`")
    alias.set_defaults(deprecated=DEPRECATED_ALIAS)
    _add_commands(alias)


DEPRECATED_ALIAS = "`fermix supervisor` is deprecated; use `fermix server`"
"""The notice ``fermix supervisor ...`` prints on stderr before it runs."""


def _add_commands(group: argparse.ArgumentParser) -> None:
    cmds = group.add_subparsers(dest="server_command", required=True, metavar="COMMAND")

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
    """``fermix server start``."""
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
    console().print(f"server started (pid {pid}); log: {service.ServicePaths.of(ctx.home).log}")
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
    """``fermix server stop``."""
    pid = service.stop(ctx.home, timeout=args.timeout)
    console().print("server was not running" if pid is None else f"server stopped (pid {pid})")
    return 0


def cmd_status(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix server status``: exit 0 when it runs, 1 when it does not (N7).

    The running server's status document (its ``status()``, asked over ``supervisor.sock``)
    with ``running`` added; ``--json`` prints it whole, otherwise a table says since when
    and where it serves, what it holds, its rates over the last complete seconds, the
    reviews and compactions in flight, and its last errors.
    """
    paths = service.ServicePaths.of(ctx.home)
    pid = service.running_pid(paths)
    data: dict[str, Any] = {"running": pid is not None, "pid": pid}
    if pid is not None:
        data.update(service.query_status(paths))
    if args.json:
        print_json(data)
    elif pid is None:
        console().print("server is not running")
    else:
        console().print(table("server", ["", ""], status_rows(data, now=time.time())))
        errors = data.get("last_errors") or []
        if errors:
            console().print(errors_table(errors))
    return 0 if pid is not None else 1


def status_rows(data: dict[str, Any], *, now: float) -> list[tuple[str, object]]:
    """The rows of the status table, from the status document (fields it lacks are left
    out, so an older server's document still renders)."""
    rows: list[tuple[str, object]] = [("pid", data.get("pid"))]
    started = data.get("started_at")
    if isinstance(started, int | float):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        rows.append(("running since", f"{since} (up {_duration(now - started)})"))
    if data.get("url"):
        rows.append(("address", data["url"]))
    if data.get("home"):
        rows.append(("home", data["home"]))
    if data.get("storage"):
        rows.append(("storage", data["storage"]))
    if "live_conversations" in data:
        rows.append(("live conversations", data["live_conversations"]))
    if "passivated" in data:
        rows.append(("passivated", data["passivated"]))
    per_second, totals = data.get("per_second") or {}, data.get("totals") or {}
    window = data.get("rate_window_s")
    over = f" (last {window} s)" if window else ""
    for name in ("requests", "appends"):
        if name in per_second:
            rows.append(
                (f"{name} per second{over}", f"{per_second[name]:g} ({totals.get(name, 0)} in all)")
            )
    latency = data.get("latency") or {}
    for name in ("append", "compose"):
        seen = latency.get(name)
        if isinstance(seen, dict) and seen.get("count"):
            rows.append(
                (
                    f"{name} latency (last {latency.get('window_s', 60):g} s)",
                    f"p50 {seen['p50_ms']:g} ms, p99 {seen['p99_ms']:g} ms"
                    f" ({seen['count']} {name}s)",
                )
            )
    for kind in ("reviews", "compactions"):
        if f"{kind}_running" in data:
            rows.append(
                (
                    f"{kind} in flight",
                    f"{data[f'{kind}_running']} running, {data.get(f'{kind}_queued', 0)} queued",
                )
            )
    if "children" in data:
        rows.append(("children", ", ".join(map(str, data["children"]))))
    if data.get("replica") is not None:
        rows.append(("replica", _describe(data["replica"])))
    if data.get("failure"):
        rows.append(("FAILURE", data["failure"]))
    rows.append(("last errors", len(data.get("last_errors") or []) or "none"))
    return rows


def errors_table(errors: list[dict[str, Any]]) -> FittedTable:
    """The last errors the server answered with a 5xx or logged, oldest first."""
    rows = [
        (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("at", 0)))),
            e.get("where", ""),
            e.get("message", ""),
        )
        for e in errors
    ]
    return FittedTable("last errors", ["when", "where", "message"], rows, wrap=("message",))


def _duration(seconds: float) -> str:
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)
