"""Scheduled jobs and their runs: the use cases behind ``Memory``'s jobs section (M9, SC1, T2).

A host creates a job (its memory source is created with it), starts a run when the job is
due, hands the run's :class:`~fermix.model.JobCaller` to the memory tools while its model
works, and finishes the run with its output or its error. Every write goes through the
process's :class:`~fermix.runtime.writer.Writer`; the schedule is the host's to keep.

:func:`check_caller` is how a :class:`~fermix.model.JobCaller` is admitted: against the
database, not its type. Its memory source must exist, be a job's, and belong to the
caller's agent and owner; its run, when it names one, must be a running run of that job.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

from fermix import validate
from fermix.errors import AccessDeniedError, InvalidInputError, NotFoundError
from fermix.model import JobCaller, JobRun, MemorySource, ScheduledJob
from fermix.storage import Reads, Writes

MAX_ID = 2**63 - 1
MAX_RUNS_LISTED = 10_000

T = TypeVar("T")


class Reading(Protocol):
    """What the reads here need: read sessions (a store, or the runtime)."""

    def read(self) -> AbstractContextManager[Reads]: ...


class Writing(Protocol):
    """What the writes here need: the one write path (a writer, or the runtime)."""

    def write(self, unit: Callable[[Writes], T], *, label: str) -> T: ...


def create_job(
    writer: Writing,
    *,
    agent_id: str,
    name: str,
    schedule: str,
    prompt: str,
    owner_id: str = "",
) -> ScheduledJob:
    """Create a job and its memory source in one commit (a second job of that name of the
    agent is an :class:`InvalidInputError`)."""
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    validate.text("name", name, max_chars=200, allow_empty=False)
    return writer.write(
        lambda w: w.create_job(
            agent_id=agent_id, name=name, schedule=schedule, prompt=prompt, owner_id=owner_id
        ),
        label=f"create job {name!r} of {agent_id}",
    )


def get_job(db: Reading, job_id: int) -> ScheduledJob | None:
    """The job ``job_id``, or None."""
    validate.positive_int("job_id", job_id, maximum=MAX_ID)
    with db.read() as reads:
        try:
            return reads.job(job_id)
        except NotFoundError:
            return None


def list_jobs(db: Reading, *, agent_id: str | None = None) -> list[ScheduledJob]:
    """Every job, or the jobs of ``agent_id``, oldest first."""
    if agent_id is not None:
        validate.identifier("agent_id", agent_id)
    with db.read() as reads:
        return reads.jobs(agent_id=agent_id)


def start_run(writer: Writing, job_id: int) -> JobRun:
    """Record that a run of ``job_id`` started (:class:`NotFoundError` for no such job)."""
    validate.positive_int("job_id", job_id, maximum=MAX_ID)
    return writer.write(lambda w: w.start_run(job_id), label=f"start a run of job {job_id}")


def caller_for_run(db: Reading, run_id: int) -> JobCaller:
    """The tools' caller for run ``run_id``: its job's memory source, agent and owner.

    :class:`NotFoundError` for no such run; :class:`InvalidInputError` for a run that
    already finished.
    """
    validate.positive_int("run_id", run_id, maximum=MAX_ID)
    with db.read() as reads:
        run = reads.run(run_id)
        if run is None:
            raise NotFoundError(f"no job run with id {run_id}")
        if run.status != "running":
            raise InvalidInputError(f"job run {run_id} already finished ({run.status})")
        job = reads.job(run.job_id)
    return JobCaller(job.agent_id, job.memory_source_id, job.owner_id, run_id=run.id)


def finish_run(
    writer: Writing, run_id: int, *, status: str, output: str = "", error: str | None = None
) -> JobRun:
    """Record the outcome of a running run: ``succeeded`` with its output, or ``failed``
    with its error (and any partial output). Once only."""
    validate.positive_int("run_id", run_id, maximum=MAX_ID)
    return writer.write(
        lambda w: w.finish_run(run_id, status=status, output=output, error=error),
        label=f"finish job run {run_id}",
    )


def list_runs(db: Reading, job_id: int, *, limit: int = 20) -> list[JobRun]:
    """The newest ``limit`` runs of ``job_id``, newest first (:class:`NotFoundError` for no
    such job)."""
    validate.positive_int("job_id", job_id, maximum=MAX_ID)
    validate.positive_int("limit", limit, maximum=MAX_RUNS_LISTED)
    with db.read() as reads:
        reads.job(job_id)
        return reads.runs(job_id, limit=limit)


def check_caller(reads: Reads, caller: JobCaller) -> MemorySource:
    """The memory source ``caller`` stands in, once the database vouches for it (SC3, T2).

    Refused with :class:`AccessDeniedError`, naming the source: a source that does not
    exist, is not a scheduled job's, or belongs to another agent or owner; a run that does
    not exist, is not a run of that source's job, or has finished. Call it in the same
    read or write unit as the work it admits.
    """
    source_id = caller.memory_source_id
    source = reads.source(source_id)
    if source is None:
        raise AccessDeniedError(f"job caller refused: memory source {source_id} does not exist")
    if source.source_type != "job":
        raise AccessDeniedError(
            f"job caller refused: memory source {source_id} is a {source.source_type} source,"
            " not a scheduled job's"
        )
    if (source.agent_id, source.owner_id) != (caller.agent_id, caller.owner_id):
        raise AccessDeniedError(
            f"job caller refused: memory source {source_id} belongs to agent"
            f" {source.agent_id!r}, owner {source.owner_id!r}, not agent {caller.agent_id!r},"
            f" owner {caller.owner_id!r}"
        )
    if caller.run_id is not None:
        run = reads.run(caller.run_id)
        job = None if run is None else reads.job(run.job_id)
        if run is None or job is None or job.memory_source_id != source_id:
            raise AccessDeniedError(
                f"job caller refused: run {caller.run_id} is not a run of the job of memory"
                f" source {source_id}"
            )
        if run.status != "running":
            raise AccessDeniedError(
                f"job caller refused: run {caller.run_id} of memory source {source_id}"
                f" already finished ({run.status})"
            )
    return source
