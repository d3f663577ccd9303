"""``fermix job list | show``: scheduled jobs and their runs for operators (M9)."""

from __future__ import annotations

import argparse
import dataclasses

from fermix.cli.context import CommandContext
from fermix.cli.output import FittedTable, clip, console, print_json, table, when
from fermix.errors import InvalidInputError
from fermix.model import JobRun, ScheduledJob

MAX_ID = 2**63 - 1
MAX_RUNS = 10_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``job`` command group."""
    group = sub.add_parser("job", help="inspect scheduled jobs and their runs")
    cmds = group.add_subparsers(dest="job_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("list", help="list scheduled jobs with their last run")
    p.add_argument("--agent", help="only jobs of this agent id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_list)

    p = cmds.add_parser("show", help="show one job and its most recent runs")
    p.add_argument("id", type=int)
    p.add_argument("--runs", type=int, default=20, metavar="N", help="at most N runs (20)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_show)


def _job_dict(job: ScheduledJob) -> dict[str, object]:
    return dataclasses.asdict(job)


def _run_dict(run: JobRun) -> dict[str, object]:
    return dataclasses.asdict(run)


def _last_run(run: JobRun | None) -> str:
    if run is None:
        return "never"
    return f"{run.status} {when(run.started_at)}"


def jobs_table(jobs: list[tuple[ScheduledJob, JobRun | None]]) -> FittedTable:
    """The table of ``job list`` (at least one job): the agent, when every job has the
    same, is said once in the title; the prompt wraps, identifiers are cut."""
    columns = ["id", "agent", "owner", "name", "schedule", "source", "last run", "prompt"]
    title = "scheduled jobs"
    agents = {job.agent_id for job, _ in jobs}
    if len(agents) == 1:
        title += f" · agent {next(iter(agents))}"
        columns.remove("agent")
    rows = [
        {
            "id": job.id,
            "agent": job.agent_id,
            "owner": job.owner_id or "—",
            "name": job.name,
            "schedule": job.schedule,
            "source": job.memory_source_id,
            "last run": _last_run(last),
            "prompt": clip(job.prompt, 60),
        }
        for job, last in jobs
    ]
    return FittedTable(
        title,
        columns,
        [[row[c] for c in columns] for row in rows],
        wrap=("prompt",),
        cut=("agent", "owner", "name", "schedule"),
    )


def runs_table(job: ScheduledJob, runs: list[JobRun]) -> FittedTable:
    """The runs of ``job``, newest first; output and error wrap."""
    columns = ["run", "status", "started", "finished", "output", "error"]
    cells = [
        [
            run.id,
            run.status,
            when(run.started_at),
            when(run.finished_at),
            clip(run.output, 60),
            clip(run.error or "", 60),
        ]
        for run in runs
    ]
    return FittedTable(
        f"runs of job {job.id}, newest first", columns, cells, wrap=("output", "error")
    )


def cmd_list(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix job list``."""
    with ctx.db().read() as reads:
        jobs = reads.jobs(agent_id=args.agent)
        listed = [(job, next(iter(reads.runs(job.id, limit=1)), None)) for job in jobs]
    if args.json:
        print_json(
            [
                {**_job_dict(job), "last_run": None if last is None else _run_dict(last)}
                for job, last in listed
            ]
        )
        return 0
    out = console()
    if not listed:
        agent = f" of agent {args.agent}" if args.agent is not None else ""
        out.print(f"scheduled jobs{agent}: no jobs", markup=False)
        return 0
    out.print(jobs_table(listed))
    return 0


def cmd_show(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix job show ID``: every field of the job, then its newest runs."""
    if not 1 <= args.id <= MAX_ID:
        raise InvalidInputError(f"a job id is between 1 and {MAX_ID}, not {args.id}")
    if not 1 <= args.runs <= MAX_RUNS:
        raise InvalidInputError(f"--runs must be between 1 and {MAX_RUNS}, not {args.runs}")
    with ctx.db().read() as reads:
        job = reads.job(args.id)
        source = reads.source(job.memory_source_id)
        runs = reads.runs(job.id, limit=args.runs)
    if args.json:
        print_json(
            {
                **_job_dict(job),
                "memory_source": None if source is None else source.as_dict(),
                "runs": [_run_dict(run) for run in runs],
            }
        )
        return 0
    out = console()
    fields = _job_dict(job)
    for stamp in ("next_run_at", "created_at", "updated_at"):
        value = fields[stamp]
        fields[stamp] = when(value) if isinstance(value, int) else ""
    out.print(table(f"scheduled job {job.id}", ["field", "value"], list(fields.items())))
    if not runs:
        out.print(f"job {job.id} has not run yet", markup=False)
    else:
        out.print(runs_table(job, runs))
    return 0
