"""The tables of sources, jobs and runs: their columns, row mappings and argument checks, both
adapters alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fermix import validate
from fermix.errors import InvalidInputError
from fermix.model import RUN_STATUSES, SOURCE_TYPES, ScheduledJob

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
