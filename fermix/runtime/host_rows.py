"""A host's own memory rows: written, archived and recalled at a scope it names (SC1-SC3).

Rows otherwise come from the reviewer (owner and agent scope), the ``memory_store`` tool
(conversation scope) and job runs (job scope). A host built on a framework with a store of
its own (LangGraph's ``BaseStore``) keeps items at a scope it chooses; these are that
store's writes, under the same rules as the others':

- what a host writes is ``context`` with no promote target (:data:`HOST_CATEGORY`): it
  renders into no prompt file, so it never becomes a directive nor changes what a prompt
  says, whoever writes it; a row it replaces that did render leaves its file;
- :func:`fermix.core.categories.check_host_row` admits the scope for the row's owner and
  the writer's trust (the agent's shared rows are the operator's), and a job scope needs
  the job's source, of this agent and owner, checked in the same unit as the write;
- each row records where it came from (``source_type = "host"``, the host's name), and an
  archive who archived it: rows are archived, never deleted (S7), and
  ``[fermix_core.retention] archived_days`` drops them later (F7);
- a recall fuses full-text and vector search over the scope, as ``memory_recall`` does
  (:func:`fermix.runtime.recall.search_rows`, Q3).
"""

from __future__ import annotations

from typing import Any

from fermix import validate
from fermix.core.categories import HOST_CATEGORY, check_host_row
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import SCOPE_TYPES, MemoryRow, Provenance, Scope, check_trust
from fermix.runtime import recall
from fermix.runtime.writer import Writer
from fermix.storage import Reads, Storage, Writes

HOST_SOURCE_TYPE = "host"
"""The ``source_type`` of a row a host wrote (the reviewer's are ``conversation``...)."""
MAX_RECALLED = 1_000
"""The most rows one recall returns."""


def _check_job(reads: Reads, scope: Scope, *, agent_id: str, owner_id: str) -> None:
    """A job scope must be the scope of a source of this agent and owner (SC3)."""
    if scope.type != "job":
        return
    source = reads.source(int(scope.id)) if scope.id.isdigit() else None
    if source is None or source.agent_id != agent_id or source.owner_id != owner_id:
        raise NotFoundError(
            f"no job source {scope.id!r} of agent {agent_id!r} and owner {owner_id!r}"
        )


def _checked(scope: Scope, *, agent_id: str, owner_id: str, trust: str, key: str) -> None:
    if not isinstance(scope, Scope):
        raise InvalidInputError(f"scope must be a Scope, not {type(scope).__name__}")
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    validate.text("key", key, max_chars=200, allow_empty=False)
    check_host_row(scope, agent_id=agent_id, owner_id=owner_id, trust=check_trust(trust))


def put_row(
    writer: Writer,
    *,
    agent_id: str,
    owner_id: str,
    scope: Scope,
    key: str,
    value: str,
    trust: str,
    source: str,
) -> MemoryRow:
    """Store ``value`` under ``key`` at ``scope`` for ``owner_id``, replacing that key's
    value (and bringing an archived row back); returns the row once committed."""
    _checked(scope, agent_id=agent_id, owner_id=owner_id, trust=trust, key=key)
    validate.identifier("source", source)
    provenance = Provenance(source_type=HOST_SOURCE_TYPE, source_name=source)

    def unit(writes: Writes) -> list[MemoryRow]:
        _check_job(writes, scope, agent_id=agent_id, owner_id=owner_id)
        before = writes.row_by_key(agent_id=agent_id, owner_id=owner_id, scope=scope, key=key)
        after = writes.upsert_row(
            agent_id=agent_id,
            owner_id=owner_id,
            scope=scope,
            category=HOST_CATEGORY,
            key=key,
            value=value,
            promote_target=None,
            provenance=provenance,
        )
        # The row as it was counts too: one that rendered must leave its file.
        return [after] if before is None else [before, after]

    written = writer.write_rows(unit, label=f"put_row {scope.type}", reason=f"put_row:{source}")
    return written.rows[-1]


def archive_row(
    writer: Writer,
    *,
    agent_id: str,
    owner_id: str,
    scope: Scope,
    key: str,
    trust: str,
    source: str,
) -> MemoryRow | None:
    """Archive the live row under ``key`` at ``scope`` for ``owner_id`` (S7); the archived
    row, or None when no live row has that key (nothing changed)."""
    _checked(scope, agent_id=agent_id, owner_id=owner_id, trust=trust, key=key)
    validate.identifier("source", source)

    def unit(writes: Writes) -> list[MemoryRow]:
        _check_job(writes, scope, agent_id=agent_id, owner_id=owner_id)
        row = writes.row_by_key(agent_id=agent_id, owner_id=owner_id, scope=scope, key=key)
        if row is None or row.archived:
            return []
        return [writes.archive_row(row.id, by=source, reason=f"archived by host {source}")]

    written = writer.write_rows(
        unit, label=f"archive_row {scope.type}", reason=f"archive_row:{source}"
    )
    return written.rows[-1] if written.rows else None


def recall_rows(
    db: Storage,
    query: str,
    *,
    agent_id: str,
    owner_id: str | None,
    scope: Scope | None,
    scope_type: str | None,
    limit: int,
) -> list[MemoryRow]:
    """Live rows of ``agent_id`` matching ``query``, best first, within the filters given
    (``owner_id``; one ``scope``, or every scope of ``scope_type``): full-text and vector
    search fused (Q3), as ``memory_recall``."""
    validate.identifier("agent_id", agent_id)
    validate.text("query", query, max_chars=20_000)
    validate.positive_int("limit", limit, maximum=MAX_RECALLED)
    if owner_id is not None:
        validate.identifier("owner_id", owner_id, allow_empty=True)
    if scope is not None and scope_type is not None:
        raise InvalidInputError("give a scope or a scope_type, not both")
    if scope_type is not None and scope_type not in SCOPE_TYPES:
        raise InvalidInputError(f"scope_type must be one of {SCOPE_TYPES}, not {scope_type!r}")
    if not query.strip():
        return []
    filters: dict[str, Any] = {
        "agent_id": agent_id,
        "owner_id": owner_id,
        "scopes": None if scope is None else [scope],
        "scope_type": scope_type,
    }
    with db.read() as reads:
        return recall.search_rows(reads, query, filters, limit=limit)
