"""What a write of a memory row stores, checked, for both adapters (S5, S7).

:func:`upsert_values` and :func:`replacement_values` are the values of
:func:`fermix.storage.sqlite.memories.upsert` and
:func:`~fermix.storage.sqlite.memories.replace_value`
in the order of their statements' columns, the same on SQLite and PostgreSQL
(:mod:`fermix.storage.postgres.memories` adds its search stems): one place for the limits and
the checks, so the two adapters cannot refuse different rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError
from fermix.model import PROMOTE_TARGETS, MemoryRow, Provenance, Scope, check_category

MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 10_000


def upsert_values(
    *,
    agent_id: str,
    owner_id: str,
    scope: Scope,
    category: str,
    key: str,
    value: str,
    promote_target: str | None,
    confidence: float,
    provenance: Provenance,
    now: int | None,
) -> tuple[Any, ...]:
    """The values an upsert writes, in the order of its ``INSERT``'s columns (``agent_id`` to
    ``updated_at``), once checked: :class:`InvalidInputError` for a row no adapter stores."""
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    check_category(category)
    validate.text("key", key, max_chars=MAX_KEY_CHARS, allow_empty=False)
    validate.text("value", value, max_chars=MAX_VALUE_CHARS, allow_empty=False)
    if promote_target is not None and promote_target not in PROMOTE_TARGETS:
        raise InvalidInputError(f"promote_target must be one of {PROMOTE_TARGETS} or None")
    if not 0.0 <= confidence <= 1.0:
        raise InvalidInputError(f"confidence must be between 0 and 1, not {confidence}")
    ts = now_ms() if now is None else now
    scoped = (agent_id, owner_id, scope.type, scope.id, category, key, value)
    return (*scoped, confidence, promote_target, *_sources(provenance), ts, ts)


def check_replacement(*, value: str, key: str | None, category: str | None) -> None:
    """Refuse, before any row is read, what a ``replace_value`` may not write."""
    validate.text("value", value, max_chars=MAX_VALUE_CHARS, allow_empty=False)
    if key is not None:
        validate.text("key", key, max_chars=MAX_KEY_CHARS, allow_empty=False)
    if category is not None:
        check_category(category)


def replacement_values(
    current: MemoryRow,
    *,
    value: str,
    key: str | None,
    category: str | None,
    provenance: Provenance | None,
    now: int | None,
) -> tuple[Any, ...]:
    """The values a ``replace_value`` writes over ``current``, in the order of its ``SET``
    (``value``, ``key``, ``category``, the source columns, ``updated_at``): what is not
    given is kept, the provenance too."""
    return (
        value,
        current.key if key is None else key,
        current.category if category is None else category,
        *_sources(current if provenance is None else provenance),
        now_ms() if now is None else now,
    )


def _sources(of: Provenance | MemoryRow) -> tuple[Any, ...]:
    """The source columns of a provenance, or a row's, in the order of the table's columns."""
    return (
        of.source_id,
        of.source_type,
        of.source_name,
        of.source_description,
        of.session_id,
        of.run_id,
        of.source_message_id,
    )


COLUMNS = (
    "id",
    "agent_id",
    "owner_id",
    "scope_type",
    "scope_id",
    "category",
    "key",
    "value",
    "confidence",
    "promote_target",
    "source_id",
    "source_type",
    "source_name",
    "source_description",
    "session_id",
    "run_id",
    "source_message_id",
    "archived_at",
    "archived_by",
    "archive_reason",
    "created_at",
    "updated_at",
)
"""The columns of a memory row, in :class:`~fermix.model.MemoryRow`'s order."""


def row_of(values: Sequence[Any]) -> MemoryRow:
    """The row of one ``SELECT`` of :data:`COLUMNS`."""
    return MemoryRow(*values)
