"""The write of one review: its admitted operations applied in the caller's unit (E5, M1)."""

from __future__ import annotations

import logging

from fermix import model
from fermix.core import categories, review, review_admission
from fermix.core.review_admission import Speaker
from fermix.model import ConversationState, MemoryRow, Provenance
from fermix.storage import Writes

log = logging.getLogger(__name__)


def apply_admitted(
    writes: Writes,
    state: ConversationState,
    admission: review_admission.Admission,
    said: dict[tuple[str | None, str], int],
    source_message: int,
) -> list[MemoryRow]:
    """Write admitted operations in the caller's unit; return the rows as before/after.

    Each operation is written as its speaker's (M1): a fact lands in the places of the
    person who said it, with their trust, and its provenance names their last message.
    """
    if not admission.admitted:
        return []  # nothing to attribute: no memory source is created either
    source = writes.ensure_source(
        agent_id=state.agent_id,
        owner_id=state.owner_id,
        source_type="conversation",
        name=state.key.scope_id,
    )

    def provenance(speaker: Speaker) -> Provenance:
        return Provenance(
            source_id=source.id,
            source_type="conversation",
            source_name=state.key.scope_id,
            session_id=state.key.scope_id,
            source_message_id=said.get((speaker.owner_id, speaker.trust), source_message),
        )

    def add(speaker: Speaker, category: str, key: str, value: str) -> MemoryRow:
        owner_id = state.owner_id if speaker.owner_id is None else speaker.owner_id
        scope, row_owner = categories.reviewer_scope(
            category, agent_id=state.agent_id, owner_id=owner_id, trust=speaker.trust
        )
        return writes.upsert_row(
            agent_id=state.agent_id,
            owner_id=row_owner,
            scope=scope,
            category=category,
            key=key,
            value=value,
            promote_target=model.TARGET_OF[category],
            provenance=provenance(speaker),
        )

    written: list[MemoryRow] = []
    for op, speaker in zip(admission.admitted, admission.authors, strict=True):
        if op.op == "add":
            assert op.category and op.key and op.value
            written.append(add(speaker, op.category, op.key, op.value))
            continue
        assert op.id is not None
        before = writes.require_row(op.id)
        written.append(before)
        if op.op == "archive":
            written.append(
                writes.archive_row(op.id, by=review.REVIEWER, reason=op.reason or "stale")
            )
            continue
        assert op.value is not None
        category = op.category or before.category
        if model.TARGET_OF[category] != model.TARGET_OF[before.category]:
            # Moving a row between files would change its scope: archive and add instead.
            written.append(writes.archive_row(op.id, by=review.REVIEWER, reason="moved"))
            written.append(add(speaker, category, op.key or before.key, op.value))
            continue
        new_key = op.key
        if new_key is not None and new_key != before.key:
            taken = writes.row_by_key(
                agent_id=before.agent_id,
                owner_id=before.owner_id,
                scope=before.scope,
                key=new_key,
            )
            if taken is not None:
                # Renaming onto another row's key would fail the whole review: keep the
                # row's key and still take the new value.
                log.info("review kept key %r of row %d: %r is taken", before.key, op.id, new_key)
                new_key = None
        written.append(
            writes.replace_row(
                op.id,
                value=op.value,
                key=new_key,
                category=op.category,
                provenance=provenance(speaker),
            )
        )
    return written
