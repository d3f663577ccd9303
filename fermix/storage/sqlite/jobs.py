"""``memory_sources``, ``scheduled_jobs`` and ``job_runs`` (S6, SC1).

A scheduled job owns a memory source; rows the job writes live at job scope with that
source's id as scope id, so a run sees only its own memories (T2).
"""

from __future__ import annotations

from typing import Any

import apsw

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
from fermix.storage.sqlite.connection import fetch_rows


def ensure_source(
    conn: apsw.Connection,
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
    conn.execute(
        "INSERT INTO memory_sources (agent_id, owner_id, source_type, name, description,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent_id, source_type, name)"
        " DO NOTHING",
        (agent_id, owner_id, source_type, name, description, now_ms() if now is None else now),
    )
    row = fetch_rows(
        conn,
        f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE agent_id = ? AND source_type = ?"
        " AND name = ?",
        (agent_id, source_type, name),
    )[0]
    return MemorySource(*row)


def get_source(conn: apsw.Connection, source_id: int) -> MemorySource | None:
    """The source with ``source_id``, or None."""
    rows = fetch_rows(
        conn, f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE id = ?", (source_id,)
    )
    return MemorySource(*rows[0]) if rows else None


def list_sources(
    conn: apsw.Connection, *, agent_id: str, owner_id: str | None = None
) -> list[MemorySource]:
    """Sources of an agent; with ``owner_id``, those of that owner and the agent's shared ones."""
    sql = f"SELECT {SOURCE_COLUMNS} FROM memory_sources WHERE agent_id = ?"
    params: list[Any] = [agent_id]
    if owner_id is not None:
        sql += " AND owner_id IN (?, '')"
        params.append(owner_id)
    return [MemorySource(*r) for r in fetch_rows(conn, sql + " ORDER BY id", params)]


def create_job(
    conn: apsw.Connection,
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
    ts = now_ms() if now is None else now
    source = ensure_source(
        conn, agent_id=agent_id, source_type="job", name=name, owner_id=owner_id, now=ts
    )
    if source.owner_id != owner_id:  # a job source of that name exists for another owner
        raise InvalidInputError(
            f"agent {agent_id!r} already has a job source named {name!r} of another owner"
        )
    try:
        row = fetch_rows(
            conn,
            "INSERT INTO scheduled_jobs (agent_id, owner_id, name, schedule, prompt,"
            " memory_source_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            f" RETURNING {JOB_COLUMNS}",
            (agent_id, owner_id, name, schedule, prompt, source.id, ts, ts),
        )[0]
    except apsw.ConstraintError:
        raise InvalidInputError(f"agent {agent_id!r} already has a job named {name!r}") from None
    return job_of(row)


def get_job(conn: apsw.Connection, job_id: int) -> ScheduledJob:
    """The job with ``job_id``, or :class:`NotFoundError`."""
    rows = fetch_rows(conn, f"SELECT {JOB_COLUMNS} FROM scheduled_jobs WHERE id = ?", (job_id,))
    if not rows:
        raise NotFoundError(f"no scheduled job with id {job_id}")
    return job_of(rows[0])


def list_jobs(conn: apsw.Connection, *, agent_id: str | None = None) -> list[ScheduledJob]:
    """Scheduled jobs, of one agent when given."""
    sql = f"SELECT {JOB_COLUMNS} FROM scheduled_jobs"
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = ?"
        params = (agent_id,)
    return [job_of(r) for r in fetch_rows(conn, sql + " ORDER BY id", params)]


def get_run(conn: apsw.Connection, run_id: int) -> JobRun | None:
    """The run with ``run_id``, or None."""
    rows = fetch_rows(conn, f"SELECT {RUN_COLUMNS} FROM job_runs WHERE id = ?", (run_id,))
    return JobRun(*rows[0]) if rows else None


def start_run(conn: apsw.Connection, job_id: int, *, now: int | None = None) -> JobRun:
    """Record that a run of ``job_id`` started (caller's transaction)."""
    get_job(conn, job_id)
    row = fetch_rows(
        conn,
        f"INSERT INTO job_runs (job_id, status, started_at) VALUES (?, 'running', ?)"
        f" RETURNING {RUN_COLUMNS}",
        (job_id, now_ms() if now is None else now),
    )[0]
    return JobRun(*row)


def finish_run(
    conn: apsw.Connection,
    run_id: int,
    *,
    status: str,
    output: str = "",
    error: str | None = None,
    now: int | None = None,
) -> JobRun:
    """Record a run's outcome (caller's transaction), once.

    A failed run says why (``error``); a succeeded one has no error. A run that already
    finished is refused, its outcome kept.
    """
    check_finish(status=status, output=output, error=error)
    run = get_run(conn, run_id)
    if run is None:
        raise NotFoundError(f"no job run with id {run_id}")
    if run.status != "running":
        raise InvalidInputError(f"job run {run_id} already finished ({run.status})")
    rows = fetch_rows(
        conn,
        "UPDATE job_runs SET status = ?, output = ?, error = ?, finished_at = ? WHERE id = ?"
        f" RETURNING {RUN_COLUMNS}",
        (status, output, error, now_ms() if now is None else now, run_id),
    )
    return JobRun(*rows[0])


def list_runs(conn: apsw.Connection, job_id: int, *, limit: int = 20) -> list[JobRun]:
    """The most recent runs of a job, newest first."""
    return [
        JobRun(*r)
        for r in conn.execute(
            f"SELECT {RUN_COLUMNS} FROM job_runs WHERE job_id = ? ORDER BY started_at DESC, id DESC"
            " LIMIT ?",
            (job_id, limit),
        )
    ]
