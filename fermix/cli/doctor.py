"""``fermix doctor [--json] [--fix] [--model-check]``: is this home healthy (S1, S2, S4, C5, E2)?

One line per check (pass, info, warn, fail or skip) with a hint under anything that is not
a pass; exit 1 when a check fails. ``--fix`` repairs what :mod:`fermix.doctor` can repair
safely, says what it did, and reports the state after. No model code is imported unless
``--model-check`` asks for one tiny call.
"""

from __future__ import annotations

import argparse

from rich.markup import escape

from fermix import doctor
from fermix.cli.context import CommandContext
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
        "--model-check",
        action="store_true",
        help="also make one tiny call through the configured model route",
    )
    p.set_defaults(handler=cmd_doctor)


def _detail(check: doctor.Check, item: dict[str, object]) -> str:
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


def print_report(report: doctor.Report) -> None:
    """The report for people: a line per check, its hint and details, then the totals."""
    out = console()
    out.soft_wrap = True  # one line per check, whatever the width: easy to copy and grep
    out.print(f"fermix doctor: {escape(str(report.home))}")
    for done in report.fixed:
        out.print(f"  [bold]fixed[/]  {escape(done)}")
    for check in report.checks:
        tag = f"[{_STYLE[check.status]}]{check.status:>4}[/]"
        out.print(f"  {tag}  {escape(check.name):<14} {escape(check.summary)}")
        if check.status != "pass":
            for item in check.details[:5]:
                out.print(f"        {'':<14} - {escape(_detail(check, item))}")
            if check.hint:
                out.print(f"        {'':<14} [dim]hint:[/] {escape(check.hint)}")
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in _STYLE}
    totals = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = "[bold red]unhealthy[/]" if report.failed else "[green]healthy[/]"
    out.print(f"{verdict}: {totals}")


def cmd_doctor(ctx: CommandContext, args: argparse.Namespace) -> int:
    """Run the checks (fixing first with ``--fix``); exit 1 when any check fails."""
    report = doctor.diagnose(ctx.home, now=now_ms(), fix=args.fix, model_check=args.model_check)
    if args.json:
        print_json(report.as_dict())
    else:
        print_report(report)
    return 1 if report.failed else 0
