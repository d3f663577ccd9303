"""Builders of stored values for tests that need a row without a database."""

from __future__ import annotations

from typing import Any

from fermix.model import MemoryRow

ROW_DEFAULTS: dict[str, Any] = {
    "id": 1,
    "agent_id": "bot",
    "owner_id": "alice",
    "scope_type": "owner",
    "scope_id": "alice",
    "category": "identity",
    "key": "k",
    "value": "v",
    "confidence": 1.0,
    "promote_target": "user_md",
    "source_id": None,
    "source_type": None,
    "source_name": None,
    "source_description": None,
    "session_id": None,
    "run_id": None,
    "source_message_id": None,
    "archived_at": None,
    "archived_by": None,
    "archive_reason": None,
    "created_at": 1,
    "updated_at": 1,
}


def memory_row(**overrides: Any) -> MemoryRow:
    """A live USER.md identity row of agent ``bot`` and owner ``alice``, changed by overrides."""
    return MemoryRow(**{**ROW_DEFAULTS, **overrides})
