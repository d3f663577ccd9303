"""``fermix doctor [--json] [--fix] [--full] [--model-check]``: is this home healthy (S1, S2,
S4, C5, E2)?

One line per check (pass, info, warn, fail or skip) with a hint under anything that is not
a pass; exit 1 when a check fails. ``--fix`` repairs what :mod:`fermix.cli.doctor_checks` can
repair safely, says what it did, and reports the state after. ``--full`` runs the slow,
thorough database checks. No model code is imported unless ``--model-check`` asks for one
tiny call. While the checks run, the one running is named on standard error when that is a
terminal (never with ``--json``): on a large home they take seconds.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.text import Text

from fermix.cli.context import CommandContext
from fermix.cli.doctor_checks import diagnosis, outcome
from fermix.cli.output import console, print_json, when
from fermix.clock import now_ms

_STYLE = {"pass": "green", "info": "cyan", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``doctor`` command."""
    p = sub.add_parser(
        "doctor",
        help="check the home's health; --fix repairs what is safe",
        description="Check the home: database and migrations, integrity, FTS mirrors, prompt"
        " files, review claims and gates, disk space (and the model route with --model-check)."
        " Exit 1 when a check fails.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--fix",
        action="store_true",
        help="rebuild FTS mirrors, re-render prompt files, release expired claims, migrate",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="the thorough database checks: SQLite's integrity_check instead of quick_check,"
        " and every FTS row's terms against its content (slower on a large home)",
    )
    p.add_argument(
        "--model-check",
        action="store_true",
        help="also make one tiny call through the configured model route",
    )
    p.set_defaults(handler=cmd_doctor)


def _detail(check: outcome.Check, item: dict[str, object]) -> str:
    """One line for one detail row of a check."""
    if check.name == "review gates":
        last = item["last_reviewed_at"]
        backoff = item["backoff_until"]
        return (
            f"{item['conversation']}: {item['pending']} pending, gate {item['gate']},"
            f" last reviewed {when(last) if isinstance(last, int) else 'never'}"
            + (f", backing off until {when(backoff)}" if isinstance(backoff, int) else "")
            + (", last review failed" if item["last_failed_at"] is not None else "")
        )
    if check.name == "review claims":
        expired = item["expired_at"]
        return (
            f"{item['conversation']}: expired {when(expired) if isinstance(expired, int) else ''}"
        )
    if check.name == "prompt files":
        return f"{item['file']} ({item['state']})"
    return ", ".join(f"{k}={v}" for k, v in item.items())


def print_report(report: outcome.Report) -> None:
    """The report for people: a line per check, its hint and details, then the totals."""
    out = console()
    out.soft_wrap = True  # one line per check, whatever the width: easy to copy and grep

    def say(markup: str) -> None:
        out.print(markup, emoji=False)  # "telegram:100:" is a chat id, not an emoji code

    say(f"fermix doctor: {escape(str(report.home))}")
    for done in report.fixed:
        say(f"  [bold]fixed[/]  {escape(done)}")
    for check in report.checks:
        tag = f"[{_STYLE[check.status]}]{check.status:>4}[/]"
        say(f"  {tag}  {escape(check.name):<14} {escape(check.summary)}")
        if check.status != "pass":
            for item in check.details[:5]:
                say(f"        {'':<14} - {escape(_detail(check, item))}")
            if check.hint:
                say(f"        {'':<14} [dim]hint:[/] {escape(check.hint)}")
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in _STYLE}
    totals = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = "[bold red]unhealthy[/]" if report.failed else "[green]healthy[/]"
    say(f"{verdict}: {totals}")


@contextlib.contextmanager
def progress(*, quiet: bool) -> Iterator[outcome.Progress]:
    """Name what runs on standard error, when that is a terminal and ``quiet`` is false."""
    err = Console(stderr=True, highlight=False)
    if quiet or not err.is_terminal:
        yield outcome.quiet
        return
    spinner = Spinner("dots", Text("fermix doctor: starting"))
    with Live(spinner, console=err, transient=True, refresh_per_second=12.5) as live:

        def show(text: str) -> None:
            spinner.update(text=Text(f"fermix doctor: {text}..."))
            live.refresh()  # now, not at the next tick: a slow check is named as it starts

        yield show


def cmd_doctor(ctx: CommandContext, args: argparse.Namespace) -> int:
    """Run the checks (fixing first with ``--fix``); exit 1 when any check fails."""
    with progress(quiet=args.json) as show:
        report = diagnosis.diagnose(
            ctx.home,
            now=now_ms(),
            fix=args.fix,
            full=args.full,
            model_check=args.model_check,
            progress=show,
        )
    if args.json:
        print_json(report.as_dict())
    else:
        print_report(report)
    return 1 if report.failed else 0
