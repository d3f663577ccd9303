"""``memory_sources``, ``scheduled_jobs`` and ``job_runs`` (S6, SC1), written once for both
adapters (:class:`~fermix.storage.sql.Sql`).

A scheduled job owns a memory source; rows the job writes live at job scope with that
source's id as scope id, so a run sees only its own memories (T2).

What SQLite's single writer gives for free holds on PostgreSQL too, where services write at
once (READ COMMITTED: each statement sees the commits made before it):

- :func:`ensure_source` reads first (one statement when the source exists, the usual
  case); a missing one is inserted with ``ON CONFLICT DO NOTHING`` and read again when
  another service committed it meanwhile.
- :func:`create_job` checks the name before it inserts, and inserts with ``ON CONFLICT DO
  NOTHING``: a name taken, even by another service a moment before, is an
  :class:`InvalidInputError`, never a unique violation.
- :func:`finish_run` updates only a running run.

PostgreSQL gives back no identity a rollback or ``ON CONFLICT DO NOTHING`` drew, so no insert
known to conflict is tried: one process alone gets SQLite's ids. Across services, or when
the group commit runs a batch again without a failed unit, ids may skip numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import RUN_STATUSES, SOURCE_TYPES, JobRun, MemorySource, ScheduledJob
from fermix.storage.sql import Sql

SOURCE_COLUMNS = "id, agent_id, owner_id, source_type, name, description, created_at"


JOB_COLUMNS = (
    "id, agent_id, owner_id, name, schedule, prompt, memory_source_id, enabled, next_run_at,"
    " created_at, updated_at"
)


RUN_COLUMNS = "id, job_id, status, output, error, started_at, finished_at"


def check_source(
    *, agent_id: str, owner_id: str, source_type: str, name: str, description: str
) -> None:
    """Refuse, before anything is written, a source :func:`ensure_source` may not store."""
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    validate.text("name", name, max_chars=200, allow_empty=False)
    validate.text("description", description, max_chars=2000)
    if source_type not in SOURCE_TYPES:
        raise InvalidInputError(f"source_type must be one of {SOURCE_TYPES}, not {source_type!r}")


def check_job(*, schedule: str, prompt: str) -> None:
    """Refuse, before anything is written, a job :func:`create_job` may not store."""
    validate.text("schedule", schedule, max_chars=200, allow_empty=False)
    validate.text("prompt", prompt, max_chars=100_000, allow_empty=False)


def check_finish(*, status: str, output: str, error: str | None) -> None:
    """Refuse, before the run is read, an outcome :func:`finish_run` may not record: a
    failed run says why, a succeeded one has no error."""
    if status not in RUN_STATUSES[1:]:
        raise InvalidInputError(f"a finished run's status is succeeded or failed, not {status!r}")
    validate.text("output", output, max_chars=MAX_RUN_TEXT)
    if status == "failed":
        validate.text("error", error, max_chars=MAX_RUN_TEXT, allow_empty=False)
    elif error is not None:
        raise InvalidInputError("a succeeded run has no error: finish it as failed instead")


def job_of(row: Sequence[Any]) -> ScheduledJob:
    """The job of one ``SELECT`` of :data:`JOB_COLUMNS`."""
    values = list(row)
    values[7] = bool(values[7])
    return ScheduledJob(*values)


MAX_RUN_TEXT = 100_000
"""The longest output or error a run records, in characters."""


def _now(now: int | None) -> int:
    return now_ms() if now is None else now


_SOURCE_BY_NAME = (
    f"SELECT {SOURCE_COLUMNS} FROM memory_sources"
    " WHERE agent_id = ? AND source_type = ? AND name = ?"
)


def ensure_source(
    sql: Sql,
    *,
    agent_id: str,
    source_type: str,
    name: str,
    owner_id: str = "",
    description: str = "",
    now: int | None = None,
) -> MemorySource:
    """The source with this agent, type and name, created if missing (caller's transaction)."""
    check_source(
        agent_id=agent_id,
        owner_id=owner_id,
        source_type=source_type,
        name=name,
        description=description,
    )
    unique = (agent_id, source_type, name)
    rows = sql.rows(_SOURCE_BY_NAME, unique)
    if not rows:
        rows = sql.rows(
            "INSERT INTO memory_sources (agent_id, owner_id, source_type, name, description,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (agent_id, source_type, name) DO NOTHING"
            f" RETURNING {SOURCE_COLUMNS}",
            (agent_id, owner_id, source_type, name, description, _now(now)),
        )
    if not rows:  # another transaction committed it after the read above
        rows = sql.rows(_SOURCE_BY_NAME, unique)
    return MemorySource(*rows[0])


def get_source(sql: Sql, source_id: int) -> MemorySource | None:
    """The source with ``source_id``, or None."""
    rows = sql.rows(f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE id = ?", (source_id,))
    return MemorySource(*rows[0]) if rows else None


def list_sources(sql: Sql, *, agent_id: str, owner_id: str | None = None) -> list[MemorySource]:
    """Sources of an agent; with ``owner_id``, those of that owner and the agent's shared ones."""
    select = f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE agent_id = ?"
    params: list[Any] = [agent_id]
    if owner_id is not None:
        select += " AND owner_id IN (?, '')"
        params.append(owner_id)
    return [MemorySource(*r) for r in sql.rows(select + " ORDER BY id", params)]


def create_job(
    sql: Sql,
    *,
    agent_id: str,
    name: str,
    schedule: str,
    prompt: str,
    owner_id: str = "",
    now: int | None = None,
) -> ScheduledJob:
    """Create a scheduled job and its memory source, in the caller's transaction."""
    check_job(schedule=schedule, prompt=prompt)
    ts = _now(now)
    source = ensure_source(
        sql, agent_id=agent_id, source_type="job", name=name, owner_id=owner_id, now=ts
    )
    if source.owner_id != owner_id:  # a job source of that name exists for another owner
        raise InvalidInputError(
            f"agent {agent_id!r} already has a job source named {name!r} of another owner"
        )
    # Checked first: PostgreSQL does not give back an id that ON CONFLICT DO NOTHING drew.
    taken = sql.rows(
        "SELECT 1 FROM scheduled_jobs WHERE agent_id = ? AND name = ?", (agent_id, name)
    )
    rows = (
        []
        if taken
        else sql.rows(
            "INSERT INTO scheduled_jobs (agent_id, owner_id, name, schedule, prompt,"
            " memory_source_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            f" ON CONFLICT (agent_id, name) DO NOTHING RETURNING {JOB_COLUMNS}",
            (agent_id, owner_id, name, schedule, prompt, source.id, ts, ts),
        )
    )
    if not rows:
        raise InvalidInputError(f"agent {agent_id!r} already has a job named {name!r}")
    return job_of(rows[0])


def get_job(sql: Sql, job_id: int) -> ScheduledJob:
    """The job with ``job_id``, or :class:`NotFoundError`."""
    rows = sql.rows(f"SELECT {JOB_COLUMNS} FROM scheduled_jobs WHERE id = ?", (job_id,))
    if not rows:
        raise NotFoundError(f"no scheduled job with id {job_id}")
    return job_of(rows[0])


def list_jobs(sql: Sql, *, agent_id: str | None = None) -> list[ScheduledJob]:
    """Scheduled jobs, of one agent when given."""
    select = f"SELECT {JOB_COLUMNS} FROM scheduled_jobs"
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        select += " WHERE agent_id = ?"
        params = (agent_id,)
    return [job_of(r) for r in sql.rows(select + " ORDER BY id", params)]


def get_run(sql: Sql, run_id: int) -> JobRun | None:
    """The run with ``run_id``, or None."""
    rows = sql.rows(f"SELECT {RUN_COLUMNS} FROM job_runs WHERE id = ?", (run_id,))
    return JobRun(*rows[0]) if rows else None


def start_run(sql: Sql, job_id: int, *, now: int | None = None) -> JobRun:
    """Record that a run of ``job_id`` started (caller's transaction)."""
    get_job(sql, job_id)
    rows = sql.rows(
        "INSERT INTO job_runs (job_id, status, started_at) VALUES (?, 'running', ?)"
        f" RETURNING {RUN_COLUMNS}",
        (job_id, _now(now)),
    )
    return JobRun(*rows[0])


def finish_run(
    sql: Sql,
    run_id: int,
    *,
    status: str,
    output: str = "",
    error: str | None = None,
    now: int | None = None,
) -> JobRun:
    """Record a run's outcome (caller's transaction), once.

    A failed run says why (``error``); a succeeded one has no error. A run that already
    finished, here or in another service, is refused, its outcome kept: only a running run
    is updated, so two services finishing one run at once finish it once.
    """
    check_finish(status=status, output=output, error=error)
    rows = sql.rows(
        "UPDATE job_runs SET status = ?, output = ?, error = ?, finished_at = ?"
        f" WHERE id = ? AND status = 'running' RETURNING {RUN_COLUMNS}",
        (status, output, error, _now(now), run_id),
    )
    if rows:
        return JobRun(*rows[0])
    run = get_run(sql, run_id)
    if run is None:
        raise NotFoundError(f"no job run with id {run_id}")
    raise InvalidInputError(f"job run {run_id} already finished ({run.status})")


def list_runs(sql: Sql, job_id: int, *, limit: int = 20) -> list[JobRun]:
    """The most recent runs of a job, newest first (a negative ``limit``: all of them)."""
    select = (
        f"SELECT {RUN_COLUMNS} FROM job_runs WHERE job_id = ? ORDER BY started_at DESC, id DESC"
    )
    if limit < 0:
        return [JobRun(*r) for r in sql.rows(select, (job_id,))]
    return [JobRun(*r) for r in sql.rows(select + " LIMIT ?", (job_id, limit))]
