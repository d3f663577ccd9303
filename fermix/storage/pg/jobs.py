"""``memory_sources``, ``scheduled_jobs`` and ``job_runs`` on PostgreSQL: the operations of
:mod:`fermix.storage.jobs`, with the same results and the same errors (S6, SC1).

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

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import RUN_STATUSES, SOURCE_TYPES, JobRun, MemorySource, ScheduledJob
from fermix.storage.jobs import MAX_RUN_TEXT
from fermix.storage.pg.connection import Conn, fetch_rows

_SOURCE_COLS = "id, agent_id, owner_id, source_type, name, description, created_at"
_JOB_COLS = (
    "id, agent_id, owner_id, name, schedule, prompt, memory_source_id, enabled, next_run_at,"
    " created_at, updated_at"
)
_RUN_COLS = "id, job_id, status, output, error, started_at, finished_at"
_SOURCE_BY_NAME = (
    f"SELECT {_SOURCE_COLS} FROM memory_sources"
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
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    validate.text("name", name, max_chars=200, allow_empty=False)
    validate.text("description", description, max_chars=2000)
    if source_type not in SOURCE_TYPES:
        raise InvalidInputError(f"source_type must be one of {SOURCE_TYPES}, not {source_type!r}")
    unique = (agent_id, source_type, name)
    rows = fetch_rows(conn, _SOURCE_BY_NAME, unique)
    if not rows:
        rows = fetch_rows(
            conn,
            "INSERT INTO memory_sources (agent_id, owner_id, source_type, name, description,"
            " created_at) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (agent_id, source_type, name) DO NOTHING"
            f" RETURNING {_SOURCE_COLS}",
            (agent_id, owner_id, source_type, name, description, _now(now)),
        )
    if not rows:  # another transaction committed it after the read above
        rows = fetch_rows(conn, _SOURCE_BY_NAME, unique)
    return MemorySource(*rows[0])


def get_source(conn: Conn, source_id: int) -> MemorySource | None:
    """The source with ``source_id``, or None."""
    rows = fetch_rows(
        conn, f"SELECT {_SOURCE_COLS} FROM memory_sources WHERE id = %s", (source_id,)
    )
    return MemorySource(*rows[0]) if rows else None


def list_sources(conn: Conn, *, agent_id: str, owner_id: str | None = None) -> list[MemorySource]:
    """Sources of an agent; with ``owner_id``, those of that owner and the agent's shared ones."""
    sql = f"SELECT {_SOURCE_COLS} FROM memory_sources WHERE agent_id = %s"
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
    validate.text("schedule", schedule, max_chars=200, allow_empty=False)
    validate.text("prompt", prompt, max_chars=100_000, allow_empty=False)
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
            f" ON CONFLICT (agent_id, name) DO NOTHING RETURNING {_JOB_COLS}",
            (agent_id, owner_id, name, schedule, prompt, source.id, ts, ts),
        )
    )
    if not rows:
        raise InvalidInputError(f"agent {agent_id!r} already has a job named {name!r}")
    return _job(rows[0])


def _job(row: tuple[Any, ...]) -> ScheduledJob:
    values = list(row)
    values[7] = bool(values[7])
    return ScheduledJob(*values)


def get_job(conn: Conn, job_id: int) -> ScheduledJob:
    """The job with ``job_id``, or :class:`NotFoundError`."""
    rows = fetch_rows(conn, f"SELECT {_JOB_COLS} FROM scheduled_jobs WHERE id = %s", (job_id,))
    if not rows:
        raise NotFoundError(f"no scheduled job with id {job_id}")
    return _job(rows[0])


def list_jobs(conn: Conn, *, agent_id: str | None = None) -> list[ScheduledJob]:
    """Scheduled jobs, of one agent when given."""
    sql = f"SELECT {_JOB_COLS} FROM scheduled_jobs"
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = %s"
        params = (agent_id,)
    return [_job(r) for r in fetch_rows(conn, sql + " ORDER BY id", params)]


def get_run(conn: Conn, run_id: int) -> JobRun | None:
    """The run with ``run_id``, or None."""
    rows = fetch_rows(conn, f"SELECT {_RUN_COLS} FROM job_runs WHERE id = %s", (run_id,))
    return JobRun(*rows[0]) if rows else None


def start_run(conn: Conn, job_id: int, *, now: int | None = None) -> JobRun:
    """Record that a run of ``job_id`` started (caller's transaction)."""
    get_job(conn, job_id)
    rows = fetch_rows(
        conn,
        "INSERT INTO job_runs (job_id, status, started_at) VALUES (%s, 'running', %s)"
        f" RETURNING {_RUN_COLS}",
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
    if status not in RUN_STATUSES[1:]:
        raise InvalidInputError(f"a finished run's status is succeeded or failed, not {status!r}")
    validate.text("output", output, max_chars=MAX_RUN_TEXT)
    if status == "failed":
        validate.text("error", error, max_chars=MAX_RUN_TEXT, allow_empty=False)
    elif error is not None:
        raise InvalidInputError("a succeeded run has no error: finish it as failed instead")
    rows = fetch_rows(
        conn,
        "UPDATE job_runs SET status = %s, output = %s, error = %s, finished_at = %s"
        f" WHERE id = %s AND status = 'running' RETURNING {_RUN_COLS}",
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
            f"SELECT {_RUN_COLS} FROM job_runs WHERE job_id = %s"
            " ORDER BY started_at DESC, id DESC LIMIT %s",
            (job_id, limit if limit >= 0 else None),
        )
    ]


def _now(now: int | None) -> int:
    return now_ms() if now is None else now
