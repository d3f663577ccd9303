"""The inputs of one review: the rows it is shown (E3, SC3, M6, M1).

The review's messages come from the backlog (``Reads.review_backlog``, packed by
:func:`fermix.core.review.pack_backlog`); the rows beside them are chosen here: those of
the places its speakers may touch, the most related and the newest within a token budget.
"Most related" fuses full-text search with the rows' vectors when this process embeds and
they have some (Q3, :func:`fermix.runtime.recall.fuse_memory_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fermix import model
from fermix.core import review
from fermix.core.review_admission import Speaker
from fermix.model import ConversationState, MemoryRow
from fermix.runtime import indexing
from fermix.runtime.recall import ROWS_CONSIDERED, fuse_memory_rows
from fermix.storage import Reads

NEWEST_ROWS = 200
"""Most recently updated rows a review's row selection considers (M6)."""
RELEVANT_ROWS = 200
"""Rows matching the messages' words a review's row selection considers (M6)."""


def _places(
    state: ConversationState, speakers: Sequence[Speaker] | None = None
) -> list[tuple[str, model.Scope]]:
    """The (owner, scope) pairs a review of this conversation may see and touch (SC3, M1).

    Those of each speaker of the messages under review (each one's profile rows, and the
    agent's working-knowledge rows they may change: the shared ones for an operator, their
    own for a guest); without speakers, those of the conversation's owner and trust.
    """
    if speakers is None:
        speakers = (Speaker("S1", state.owner_id, state.trust),)
    places: list[tuple[str, model.Scope]] = []
    for speaker in speakers:
        for place in speaker.places(state.agent_id):
            if place not in places:
                places.append(place)
    return places


def shown_rows(
    reads: Reads,
    state: ConversationState,
    messages: Sequence[model.Message] | None = None,
    *,
    token_budget: int | None = None,
    model_name: str | None = None,
    speakers: Sequence[Speaker] | None = None,
) -> list[MemoryRow]:
    """The rows a review of this conversation is shown, by id (E3, SC3, M6, M1).

    Only rows of the places its speakers may touch (:func:`_places`; the speakers of
    ``messages`` when given, else ``speakers``, else the conversation's owner): a guest's
    rows are never shown to a review of another owner's words. With ``messages`` and a
    ``token_budget``: those most related to the messages (full-text search over the rows
    of those places) and the newest, taken in turn until the budget is spent
    (:func:`fermix.core.review.pick_rows`). Without: every row of those places.
    """
    if messages is not None and speakers is None:
        speakers = review.speakers_of(messages)
    places = _places(state, speakers)
    if messages is None or token_budget is None:
        rows = [
            row
            for owner_id, scope in places
            for row in reads.rows(agent_id=state.agent_id, owner_id=owner_id, scopes=[scope])
        ]
        return sorted(rows, key=lambda r: r.id)
    relevant = reads.relevant_rows(
        [m.content for m in messages],
        agent_id=state.agent_id,
        places=places,
        limit=RELEVANT_ROWS,
    )
    indexer = indexing.active(reads)
    if indexer is not None:
        candidates = [
            row
            for owner_id, scope in places
            for row in reads.rows(
                agent_id=state.agent_id, owner_id=owner_id, scopes=[scope], limit=ROWS_CONSIDERED
            )
        ]
        text = "\n".join(m.content for m in messages)
        relevant = fuse_memory_rows(reads, indexer, text, candidates, relevant, limit=RELEVANT_ROWS)
    newest = sorted(
        (
            row
            for owner_id, scope in places
            for row in reads.rows(
                agent_id=state.agent_id, owner_id=owner_id, scopes=[scope], limit=NEWEST_ROWS
            )
        ),
        key=lambda r: (r.updated_at, r.id),
        reverse=True,
    )[:NEWEST_ROWS]
    return review.pick_rows(relevant, newest, token_budget=token_budget, model=model_name)
