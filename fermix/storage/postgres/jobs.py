"""``memory_sources``, ``scheduled_jobs`` and ``job_runs`` on PostgreSQL: the operations of
:mod:`fermix.storage.sqlite.jobs`, with the same results and the same errors (S6, SC1).

What SQLite's single writer gave for free is explicit here:

- :func:`ensure_source` reads first (one statement when the source exists, the usual
  case); a missing one is inserted with ``ON CONFLICT DO NOTHING`` and read again when
  another service committed it meanwhile (READ COMMITTED: each statement sees the commits
  made before it).
- :func:`create_job` checks the name before it inserts, and inserts with ``ON CONFLICT DO
  NOTHING``: a name taken, even by another service a moment before, is the same
  :class:`InvalidInputError` as on SQLite, never a unique violation.
- :func:`finish_run` updates only a running run, so two services finishing one run at once
  finish it once: the second waits for the first's commit, re-checks, and is refused.

An identity is not given back by a rollback nor by ``ON CONFLICT DO NOTHING``, so no insert
that is known to conflict is tried: one process alone gets SQLite's ids. Across services,
or when the group commit runs a batch again without a failed unit, ids may skip numbers.
"""

from __future__ import annotations

from typing import Any

from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import JobRun, MemorySource, ScheduledJob
from fermix.storage.jobs import (
    JOB_COLUMNS,
    RUN_COLUMNS,
    SOURCE_COLUMNS,
    check_finish,
    check_job,
    check_source,
    job_of,
)
from fermix.storage.postgres.connection import Conn, fetch_rows

_SOURCE_BY_NAME = (
    f"SELECT {SOURCE_COLUMNS} FROM memory_sources"
    " WHERE agent_id = %s AND source_type = %s AND name = %s"
)


def ensure_source(
    conn: Conn,
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
    rows = fetch_rows(conn, _SOURCE_BY_NAME, unique)
    if not rows:
        rows = fetch_rows(
            conn,
            "INSERT INTO memory_sources (agent_id, owner_id, source_type, name, description,"
            " created_at) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (agent_id, source_type, name) DO NOTHING"
            f" RETURNING {SOURCE_COLUMNS}",
            (agent_id, owner_id, source_type, name, description, _now(now)),
        )
    if not rows:  # another transaction committed it after the read above
        rows = fetch_rows(conn, _SOURCE_BY_NAME, unique)
    return MemorySource(*rows[0])


def get_source(conn: Conn, source_id: int) -> MemorySource | None:
    """The source with ``source_id``, or None."""
    rows = fetch_rows(
        conn, f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE id = %s", (source_id,)
    )
    return MemorySource(*rows[0]) if rows else None


def list_sources(conn: Conn, *, agent_id: str, owner_id: str | None = None) -> list[MemorySource]:
    """Sources of an agent; with ``owner_id``, those of that owner and the agent's shared ones."""
    sql = f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE agent_id = %s"
    params: list[Any] = [agent_id]
    if owner_id is not None:
        sql += " AND owner_id IN (%s, '')"
        params.append(owner_id)
    return [MemorySource(*r) for r in fetch_rows(conn, sql + " ORDER BY id", params)]


def create_job(
    conn: Conn,
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
        conn, agent_id=agent_id, source_type="job", name=name, owner_id=owner_id, now=ts
    )
    if source.owner_id != owner_id:  # a job source of that name exists for another owner
        raise InvalidInputError(
            f"agent {agent_id!r} already has a job source named {name!r} of another owner"
        )
    taken = fetch_rows(
        conn, "SELECT 1 FROM scheduled_jobs WHERE agent_id = %s AND name = %s", (agent_id, name)
    )
    rows = (
        []
        if taken
        else fetch_rows(
            conn,
            "INSERT INTO scheduled_jobs (agent_id, owner_id, name, schedule, prompt,"
            " memory_source_id, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            f" ON CONFLICT (agent_id, name) DO NOTHING RETURNING {JOB_COLUMNS}",
            (agent_id, owner_id, name, schedule, prompt, source.id, ts, ts),
        )
    )
    if not rows:
        raise InvalidInputError(f"agent {agent_id!r} already has a job named {name!r}")
    return job_of(rows[0])


def get_job(conn: Conn, job_id: int) -> ScheduledJob:
    """The job with ``job_id``, or :class:`NotFoundError`."""
    rows = fetch_rows(conn, f"SELECT {JOB_COLUMNS} FROM scheduled_jobs WHERE id = %s", (job_id,))
    if not rows:
        raise NotFoundError(f"no scheduled job with id {job_id}")
    return job_of(rows[0])


def list_jobs(conn: Conn, *, agent_id: str | None = None) -> list[ScheduledJob]:
    """Scheduled jobs, of one agent when given."""
    sql = f"SELECT {JOB_COLUMNS} FROM scheduled_jobs"
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = %s"
        params = (agent_id,)
    return [job_of(r) for r in fetch_rows(conn, sql + " ORDER BY id", params)]


def get_run(conn: Conn, run_id: int) -> JobRun | None:
    """The run with ``run_id``, or None."""
    rows = fetch_rows(conn, f"SELECT {RUN_COLUMNS} FROM job_runs WHERE id = %s", (run_id,))
    return JobRun(*rows[0]) if rows else None


def start_run(conn: Conn, job_id: int, *, now: int | None = None) -> JobRun:
    """Record that a run of ``job_id`` started (caller's transaction)."""
    get_job(conn, job_id)
    rows = fetch_rows(
        conn,
        "INSERT INTO job_runs (job_id, status, started_at) VALUES (%s, 'running', %s)"
        f" RETURNING {RUN_COLUMNS}",
        (job_id, _now(now)),
    )
    return JobRun(*rows[0])


def finish_run(
    conn: Conn,
    run_id: int,
    *,
    status: str,
    output: str = "",
    error: str | None = None,
    now: int | None = None,
) -> JobRun:
    """Record a run's outcome (caller's transaction), once.

    A failed run says why (``error``); a succeeded one has no error. A run that already
    finished, here or in another service, is refused, its outcome kept.
    """
    check_finish(status=status, output=output, error=error)
    rows = fetch_rows(
        conn,
        "UPDATE job_runs SET status = %s, output = %s, error = %s, finished_at = %s"
        f" WHERE id = %s AND status = 'running' RETURNING {RUN_COLUMNS}",
        (status, output, error, _now(now), run_id),
    )
    if rows:
        return JobRun(*rows[0])
    run = get_run(conn, run_id)
    if run is None:
        raise NotFoundError(f"no job run with id {run_id}")
    raise InvalidInputError(f"job run {run_id} already finished ({run.status})")


def list_runs(conn: Conn, job_id: int, *, limit: int = 20) -> list[JobRun]:
    """The most recent runs of a job, newest first (a negative ``limit``: all, as SQLite)."""
    return [
        JobRun(*r)
        for r in fetch_rows(
            conn,
            f"SELECT {RUN_COLUMNS} FROM job_runs WHERE job_id = %s"
            " ORDER BY started_at DESC, id DESC LIMIT %s",
            (job_id, limit if limit >= 0 else None),
        )
    ]


def _now(now: int | None) -> int:
    return now_ms() if now is None else now
