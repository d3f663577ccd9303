"""The outcome and short reason a conversation keeps of its last review and compaction (W1).

A reason is made here from codes, model names and error class names only: never from an
error's text, which may quote a prompt, a provider's answer or a key. The console's reviews
page shows it as it is stored (:meth:`~fermix.storage.Writes.record_outcome`, bounded).
Routine gate skips (not due yet, under the threshold, in a backoff) record nothing: the
outcome kept is that of the last review or compaction that was due.
"""

from __future__ import annotations

import logging

from fermix.errors import FermixError, ModelError, ReviewOutputError
from fermix.llm import ModelRequestError, ModelRouteError
from fermix.model import ConversationKey, ConversationState
from fermix.runtime.writer import Writer

log = logging.getLogger(__name__)


def failure_reason(exc: BaseException, *, model: str | None = None) -> str:
    """The reason of a review or compaction that failed with ``exc``: ``model_error: ...``
    naming each model tried and its error class, ``parse_error: ...`` for an answer the
    reviewer rejected, else the error's class."""
    if isinstance(exc, ModelRouteError):
        kind = "refused" if isinstance(exc, ModelRequestError) else "unavailable"
        tried = ", ".join(f"{name} {error}" for name, error in exc.tried) or "-"
        return f"model_error: {kind}: {tried}"
    if isinstance(exc, ReviewOutputError):
        return f"parse_error: the answer of {model or 'the model'} was rejected"
    if isinstance(exc, ModelError):
        return f"model_error: {type(exc).__name__}" + (f" from {model}" if model else "")
    if isinstance(exc, FermixError):
        return f"storage_error: {type(exc).__name__}"
    return f"error: {type(exc).__name__}"


def record_skip(
    writer: Writer, state: ConversationState, *, work: str, reason: str, now: int
) -> None:
    """Keep that the due ``work`` of ``state`` was skipped for ``reason`` (no model, ...),
    unless that is what it keeps already: a skip repeated turn after turn writes once."""
    if (getattr(state, f"{work}_outcome"), getattr(state, f"{work}_reason")) == (
        "skipped",
        reason,
    ):
        return
    record(writer, state.key, work=work, outcome="skipped", reason=reason, now=now)


def record(
    writer: Writer, key: ConversationKey, *, work: str, outcome: str, reason: str, now: int
) -> None:
    """Keep ``outcome`` and ``reason`` of ``work`` on ``key`` in a write of its own; a store
    that refuses is logged, never raised into the review or compaction it describes."""
    try:
        writer.write(
            lambda writes: writes.record_outcome(
                key, work=work, outcome=outcome, reason=reason, now=now
            ),
            label=f"{work} outcome {key.scope_id}",
        )
    except FermixError:
        log.exception("could not keep the %s outcome of %s", work, key.scope_id)
