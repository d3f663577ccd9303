"""The background work's checks: no review claim held past its expiry (E2), the review gates
of the conversations with the most unreviewed messages, and no erasure left unfinished by a
kill or held back by a reader (F5)."""

from __future__ import annotations

from typing import Any

from fermix import model
from fermix.cli.doctor_checks.outcome import Check
from fermix.config import Config
from fermix.storage import Inspection, Reads

GATES_SHOWN = 5


def _conversation(state: model.ConversationState) -> str:
    return f"{state.agent_id}/{state.key.scope_id}"


def check_claims(reads: Reads, *, now: int) -> Check:
    """No review claim is held past its expiry (E2): its reviewer died mid-review."""
    stale = [
        s
        for s in reads.conversations()
        if s.review_claim_token is not None
        and s.review_claim_expires_at is not None
        and s.review_claim_expires_at <= now
    ]
    if not stale:
        return Check("review claims", "pass", "no review claim is past its expiry")
    details = [
        {"conversation": _conversation(s), "expired_at": s.review_claim_expires_at} for s in stale
    ]
    summary = f"{len(stale)} review claim(s) held past their expiry"
    hint = (
        "a reviewer stopped mid-review (killed or crashed); `fermix doctor --fix` releases"
        " the claims (the next review would also take them over)"
    )
    return Check("review claims", "fail", summary, hint, "claims", details)


def _gate_row(
    state: model.ConversationState, pending: int, config: Config, *, now: int
) -> dict[str, Any]:
    """One conversation's review gate (E2) as the reviewer would see it now."""
    from fermix.core import review

    cfg = config.memory
    skip = review.gate(
        state,
        now_ms=now,
        interval_hours=cfg.review_interval_hours,
        backoff_ms=cfg.review_failure_backoff_ms,
        newest_user_message_id=state.last_reviewed_message_id + pending,
    )
    expires = state.review_claim_expires_at
    if state.review_claim_token is not None and expires is not None and expires > now:
        gate = "claimed (a review is running)"
    else:
        gate = "due" if skip is None else skip.value
    failed_at = state.review_failed_at
    backoff_until = None if failed_at is None else failed_at + cfg.review_failure_backoff_ms
    return {
        "conversation": _conversation(state),
        "pending": pending,
        "last_reviewed_at": state.last_reviewed_at,
        "last_failed_at": failed_at,
        "backoff_until": backoff_until if backoff_until and backoff_until > now else None,
        "gate": gate,
    }


def check_review_gates(reads: Reads, config: Config, *, now: int) -> Check:
    """The reviewer's gates (E2) of the conversations with the most unreviewed messages."""
    pending = reads.with_new_user_messages()
    if not pending:
        return Check("review gates", "pass", "no conversation has unreviewed user messages")
    rows = [_gate_row(state, count, config, now=now) for state, count in pending]
    due = sum(1 for row in rows if row["gate"] == "due")
    shown = f"; the top {GATES_SHOWN} below" if len(rows) > GATES_SHOWN else ""
    summary = f"{len(rows)} conversation(s) with unreviewed user messages, {due} due now{shown}"
    details = rows[:GATES_SHOWN]
    failed = [row for row in details if row["last_failed_at"] is not None]
    if failed:
        hint = (
            f"the last review of {failed[0]['conversation']} failed; see the server's log"
            " (supervisor.log in the home), or run `fermix memory review --now` to see the error"
        )
        return Check("review gates", "warn", summary, hint, details=details)
    if config.memory.review_interval_hours == 0:
        hint = "background review is off (review_interval_hours = 0); `--now` still works"
    else:
        hint = "reviews run after a conversation's next turn, or `fermix memory review --now`"
    return Check("review gates", "info", summary, hint, details=details)


def check_erasures(reads: Inspection) -> Check:
    """No erasure is left unfinished (F5): killed halfway, or held back by a reader (F3)."""
    if reads.pending_migrations():
        return Check("erasures", "skip", "migrations are pending: the database predates them")
    left = reads.unfinished_erasures()
    if not left:
        return Check("erasures", "pass", "no erasure is unfinished")
    details = [
        {
            "erasure": e.id,
            "target": e.target,
            "agent_id": e.agent_id,
            "state": e.state,
            "started_at": e.started_at,
            "erased": dict(e.counts),
        }
        for e in left
    ]
    running = sum(1 for e in left if e.state == "running")
    summary = (
        f"{len(left)} erasure(s) unfinished: {running} with rows left,"
        f" {len(left) - running} with a copy left on disk"
    )
    hint = (
        "a forget was killed, or a reader held an old copy; `fermix doctor --fix` finishes"
        " it (so does the next start of a host)"
    )
    return Check("erasures", "fail", summary, hint, "erasures", details)


def check_retention(reads: Inspection, config: Config, *, now: int) -> Check:
    """What ``[fermix_core.retention]`` drops at the next sweep (F7)."""
    cfg = config.retention
    if not cfg.enabled:
        return Check("retention", "info", "retention is off: everything is kept")
    if reads.pending_migrations():
        return Check("retention", "skip", "migrations are pending: the database predates them")
    from fermix.runtime.retention import cutoffs

    messages, archived, keep = cutoffs(cfg, now=now)
    due = reads.retention_due(
        messages_before=messages,
        archived_before=archived,
        keep=keep,
        drop_unreviewed=cfg.drop_unreviewed,
    )
    said = ", ".join(f"{n:,} {kind.replace('_', ' ')}" for kind, n in due.items())
    return Check("retention", "info", f"the next sweep drops {said}", details=[due])
