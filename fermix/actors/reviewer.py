"""The background memory reviewer ("dreaming"): one review, and the actor that runs them (E1-E6).

:func:`review_conversation` is one review from gate to prompt files: gate, claim in SQLite,
read the new user messages and the rows this review may touch, one model call, parse,
admission, one transaction, rebuild. The :class:`Reviewer` actor runs reviews one at a
time off the host's path; ``fermix memory review --now`` calls the same function.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apsw

from fermix import llm, model
from fermix.actors.base import SupervisedActor
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core import categories, review
from fermix.core.review import Operation, Skip
from fermix.errors import (
    FermixError,
    ModelError,
    ReviewOutputError,
    StorageError,
    UnsafePathSegmentError,
)
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow, Provenance
from fermix.runtime import prompt_files, repair
from fermix.storage import conversations, jobs, memories, messages
from fermix.storage.committer import Committer
from fermix.storage.connection import connect
from fermix.storage.pool import ReaderPool

log = logging.getLogger(__name__)

AGENT_TAG = "memory_reviewer"
CLAIM_TTL_MS = 10 * 60 * 1000


@dataclass
class ReviewContext:
    """What a review needs: the home and config, the writer, readers, clock and model route."""

    home: Home
    config: Config
    committer: Committer
    readers: ReaderPool
    clock: Callable[[], int] = now_ms
    route: llm.Route | None = None
    vfs: str | None = None
    """The SQLite VFS of the connections a review opens itself (its rebuild), if not default."""
    stale_agents: set[str] = field(default_factory=set)
    """Agents whose prompt files a failed rebuild left behind their rows; repaired next run."""

    def model_route(self) -> llm.Route:
        """The agent's route: the configured primary and fallbacks (E4)."""
        if self.route is None:
            self.route = llm.Route.from_config(self.config.model)
        return self.route


@dataclass
class ReviewResult:
    """What one review did."""

    key: ConversationKey
    status: str
    """``applied``, ``nothing``, ``skipped`` or ``failed``."""
    skip: Skip | None = None
    added: int = 0
    replaced: int = 0
    archived: int = 0
    refused: list[str] = field(default_factory=list)
    messages: int = 0
    model: str | None = None
    tried: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    files_changed: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "conversation": f"{self.key.agent_id}/{self.key.scope_id}",
            "status": self.status,
            "skip": None if self.skip is None else self.skip.value,
            "messages": self.messages,
            "added": self.added,
            "replaced": self.replaced,
            "archived": self.archived,
            "refused": self.refused,
            "model": self.model,
            "tried": [list(t) for t in self.tried],
            "error": self.error,
            "files_changed": self.files_changed,
        }


def shown_rows(conn: apsw.Connection, state: model.ConversationState) -> list[MemoryRow]:
    """The rows a review of this conversation may see and touch (E3, SC3).

    The owner's profile rows, and the agent's working-knowledge rows this conversation may
    change: the shared ones for an operator conversation, the owner's own for a guest.
    """
    agent_owner = "" if state.trust == "operator" else state.owner_id
    profile = memories.list_rows(
        conn,
        agent_id=state.agent_id,
        owner_id=state.owner_id,
        scopes=[categories.owner_scope(state.owner_id)],
    )
    knowledge = memories.list_rows(
        conn,
        agent_id=state.agent_id,
        owner_id=agent_owner,
        scopes=[categories.agent_scope(state.agent_id)],
    )
    return sorted(profile + knowledge, key=lambda r: r.id)


def review_conversation(
    ctx: ReviewContext, key: ConversationKey, *, force: bool = False
) -> ReviewResult:
    """Run one review of ``key`` if its gates allow; never raises for a model or output failure."""
    cfg = ctx.config.memory
    now = ctx.clock()
    with ctx.readers.connection() as conn:
        state = conversations.get(conn, key)
        newest = conversations.newest_user_message_id(conn, key)
    skip = review.gate(
        state,
        now_ms=now,
        interval_hours=cfg.review_interval_hours,
        backoff_ms=cfg.review_failure_backoff_ms,
        newest_user_message_id=newest,
        force=force,
    )
    if skip is not None or state is None:
        return ReviewResult(key, "skipped", skip=skip or Skip.NO_NEW_MESSAGES)
    token = uuid.uuid4().hex

    def claim(c: apsw.Connection) -> Skip | None:
        # Checked again under the write lock: another process may have just reviewed.
        fresh = conversations.get(c, key)
        if fresh is None or fresh.last_reviewed_message_id >= newest:
            return Skip.NO_NEW_MESSAGES
        if conversations.claim_review(c, key, token=token, now=now, ttl_ms=CLAIM_TTL_MS):
            return None
        return Skip.CLAIMED

    lost: Skip | None = ctx.committer.run(claim, label=f"review claim {key.scope_id}")
    if lost is not None:
        return ReviewResult(key, "skipped", skip=lost)
    try:
        return _claimed_review(ctx, key, state, newest, token)
    except BaseException:
        _record_failure(ctx, key, token)
        raise


def _claimed_review(
    ctx: ReviewContext,
    key: ConversationKey,
    state: model.ConversationState,
    newest: int,
    token: str,
) -> ReviewResult:
    cfg = ctx.config.memory
    route = ctx.model_route()
    with ctx.readers.connection() as conn:
        pending = messages.conversation(
            conn, key, after_id=state.last_reviewed_message_id, role="user"
        )
        shown = shown_rows(conn, state)
    pending = [m for m in pending if m.id <= newest]
    packed = review.pack_messages(
        pending,
        max_messages=cfg.review_max_messages,
        token_budget=cfg.review_input_token_budget,
        model=route.primary,
    )
    result = ReviewResult(key, "nothing", messages=len(packed))
    if not packed:
        # Every new message is larger than the whole input budget: nothing to show a model.
        ctx.committer.run(
            lambda c: conversations.finish_review(
                c, key, token=token, now=ctx.clock(), last_message_id=newest
            ),
            label=f"review of {key.scope_id}",
        )
        log.info("review of %s: no message fits the input budget", key.scope_id)
        return result
    try:
        answer = llm.complete(
            route,
            review.build_prompt(packed, shown),
            agent=AGENT_TAG,
            response_format=review.RESPONSE_SCHEMA,
            metadata={"conversation": key.scope_id, "agent_id": key.agent_id},
        )
        result.model, result.tried = answer.model, answer.tried
        operations = review.parse(answer.content)
    except (ModelError, ReviewOutputError) as exc:
        log.warning("review of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
        _record_failure(ctx, key, token)
        result.status, result.error = "failed", str(exc)
        result.tried = getattr(exc, "tried", result.tried)
        return result
    admission = review.admit(operations, shown=shown, trust=state.trust)
    for refusal in admission.refused:
        log.info("review of %s refused %s: %s", key.scope_id, refusal.operation, refusal.reason)
    result.refused = [f"{r.operation.op}: {r.reason}" for r in admission.refused]
    source_message = packed[-1].id if packed else newest

    def apply(conn: apsw.Connection) -> list[MemoryRow]:
        written = _apply(conn, state, admission.admitted, source_message)
        if not conversations.finish_review(
            conn, key, token=token, now=ctx.clock(), last_message_id=newest
        ):
            raise FermixError("the review claim expired before the review finished")
        return written

    written = ctx.committer.run(apply, label=f"review of {key.scope_id}")
    for op in admission.admitted:
        if op.op == "add":
            result.added += 1
        elif op.op == "replace":
            result.replaced += 1
        else:
            result.archived += 1
    if admission.admitted:
        result.status = "applied"
    if written:
        try:
            result.files_changed = _rebuild(ctx, written, state.agent_id, state.owner_id)
        except (StorageError, apsw.Error, OSError) as exc:
            # The rows are committed and the files are derived from them (S1): the review
            # stands, and the Reviewer's next run (or the next start) renders them again.
            log.error("review of %s: prompt files not rebuilt: %s", key.scope_id, exc)
            ctx.stale_agents.add(state.agent_id)
            result.error = f"prompt files not rebuilt: {exc}"
    return result


def repair_stale_files(ctx: ReviewContext, *, every_agent: bool = False) -> None:
    """Render again the prompt files that lag their rows (S1, C5): every agent's, and the
    temporary files of killed writes, when the Reviewer starts; else those a failed rebuild
    of this process left behind. Errors are logged: the files are derived."""
    agents: list[str | None] = [None] if every_agent else [*sorted(ctx.stale_agents)]
    for agent_id in agents:
        try:
            conn = connect(ctx.home.db_path, vfs=ctx.vfs)
            try:
                repaired = repair.repair(conn, ctx.home, agent_id=agent_id, reason="repair")
            finally:
                conn.close()
            if agent_id is None:
                repair.remove_orphan_temp_files(ctx.home)
        except (StorageError, apsw.Error, OSError) as exc:
            log.warning("prompt files of %s not rebuilt: %s", agent_id or "every agent", exc)
            continue
        if repaired:
            log.info("rendered %d stale prompt-file pair(s) again", len(repaired))
        if agent_id is None:
            ctx.stale_agents.clear()
        else:
            ctx.stale_agents.discard(agent_id)


def _apply(
    conn: apsw.Connection,
    state: model.ConversationState,
    operations: tuple[Operation, ...],
    source_message: int,
) -> list[MemoryRow]:
    """Write admitted operations in the caller's transaction; return the rows as before/after."""
    if not operations:
        return []  # nothing to attribute: no memory source is created either
    source = jobs.ensure_source(
        conn,
        agent_id=state.agent_id,
        owner_id=state.owner_id,
        source_type="conversation",
        name=state.key.scope_id,
    )
    provenance = Provenance(
        source_id=source.id,
        source_type="conversation",
        source_name=state.key.scope_id,
        session_id=state.key.scope_id,
        source_message_id=source_message,
    )
    written: list[MemoryRow] = []
    for op in operations:
        if op.op == "add":
            assert op.category and op.key and op.value
            scope, row_owner = categories.reviewer_scope(
                op.category, agent_id=state.agent_id, owner_id=state.owner_id, trust=state.trust
            )
            written.append(
                memories.upsert(
                    conn,
                    agent_id=state.agent_id,
                    owner_id=row_owner,
                    scope=scope,
                    category=op.category,
                    key=op.key,
                    value=op.value,
                    promote_target=model.TARGET_OF[op.category],
                    provenance=provenance,
                )
            )
            continue
        assert op.id is not None
        before = memories.require(conn, op.id)
        written.append(before)
        if op.op == "replace":
            assert op.value is not None
            category = op.category or before.category
            if model.TARGET_OF[category] != model.TARGET_OF[before.category]:
                # Moving a row between files would change its scope: archive and add instead.
                written.append(memories.archive(conn, op.id, by=review.REVIEWER, reason="moved"))
                scope, row_owner = categories.reviewer_scope(
                    category, agent_id=state.agent_id, owner_id=state.owner_id, trust=state.trust
                )
                written.append(
                    memories.upsert(
                        conn,
                        agent_id=state.agent_id,
                        owner_id=row_owner,
                        scope=scope,
                        category=category,
                        key=op.key or before.key,
                        value=op.value,
                        promote_target=model.TARGET_OF[category],
                        provenance=provenance,
                    )
                )
                continue
            new_key = op.key
            if new_key is not None and new_key != before.key:
                taken = memories.get_by_key(
                    conn,
                    agent_id=before.agent_id,
                    owner_id=before.owner_id,
                    scope=before.scope,
                    key=new_key,
                )
                if taken is not None:
                    # Renaming onto another row's key would fail the whole review: keep the
                    # row's key and still take the new value.
                    log.info(
                        "review kept key %r of row %d: %r is taken", before.key, op.id, new_key
                    )
                    new_key = None
            written.append(
                memories.replace_value(
                    conn,
                    op.id,
                    value=op.value,
                    key=new_key,
                    category=op.category,
                    provenance=provenance,
                )
            )
        else:
            written.append(
                memories.archive(conn, op.id, by=review.REVIEWER, reason=op.reason or "stale")
            )
    return written


def _record_failure(ctx: ReviewContext, key: ConversationKey, token: str) -> None:
    try:
        ctx.committer.run(
            lambda c: conversations.fail_review(c, key, token=token, now=ctx.clock()),
            label=f"review failure {key.scope_id}",
        )
    except FermixError:
        log.exception("could not record the failed review of %s", key.scope_id)


def _rebuild(ctx: ReviewContext, rows: list[MemoryRow], agent_id: str, owner_id: str) -> bool:
    """Rebuild the prompt files the written rows show in, on a connection of its own.

    The conversation's own owner is rebuilt too: a shared row reaches every owner that has
    files already, and this owner may have none yet.
    """
    conn = connect(ctx.home.db_path, vfs=ctx.vfs)
    try:
        results = prompt_files.rebuild_for_rows(conn, ctx.home, rows, reason="review")
        if results and (agent_id, owner_id) not in {(r.agent_id, r.owner_id) for r in results}:
            try:
                results.append(
                    prompt_files.rebuild(conn, ctx.home, agent_id, owner_id, reason="review")
                )
            except UnsafePathSegmentError as exc:
                log.warning("no prompt files for owner %r: %s", owner_id, exc)
    finally:
        conn.close()
    return any(r.changed for r in results)


class Review(NamedTuple):
    """Review ``key`` now if its gates allow (``force``: as ``--now``)."""

    key: ConversationKey
    force: bool = False


class Reviewer(SupervisedActor):
    """Runs reviews one at a time, off the host's path (A4, E1)."""

    # Its work can always be dropped (a claim expires, a backoff passes): a model call
    # still running at shutdown must not keep the process alive.
    use_daemon_thread = True

    def __init__(self, ctx: ReviewContext) -> None:
        super().__init__()
        self._ctx = ctx

    def on_start(self) -> None:
        """Repair the prompt files a stopped process left behind, before the first review.

        A host killed between the commit of a review and its rebuild leaves them behind
        their rows. The check renders every owner's files, so it runs here, off the host's
        path, rather than in ``Memory.start``.
        """
        repair_stale_files(self._ctx, every_agent=True)

    def on_receive(self, message: Any) -> Any:
        """Run one review; a failure is logged and returned, never raised into the actor."""
        match message:
            case Review(key, force):
                if self._ctx.stale_agents:
                    repair_stale_files(self._ctx)
                try:
                    return review_conversation(self._ctx, key, force=force)
                except FermixError as exc:
                    # Storage trouble: the review is retried at its next dispatch.
                    log.error("review of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
                    return ReviewResult(key, "failed", error=str(exc))
        raise TypeError(f"Reviewer got an unknown message: {message!r}")


def due_reviews(ctx: ReviewContext) -> list[ConversationKey]:
    """Conversations with new user messages whose review interval has passed (the sweep)."""
    cfg = ctx.config.memory
    if cfg.review_interval_hours == 0:
        return []
    now = ctx.clock()
    with ctx.readers.connection() as conn:
        pending = conversations.with_new_user_messages(conn)
    due = []
    for state, _count in pending:
        skip = review.gate(
            state,
            now_ms=now,
            interval_hours=cfg.review_interval_hours,
            backoff_ms=cfg.review_failure_backoff_ms,
            newest_user_message_id=state.last_reviewed_message_id + 1,
        )
        if skip is None:
            due.append(state.key)
    return due
