"""The compactor: one compaction of a conversation, and the actor that runs them (K1-K5).

:func:`compact_conversation` checks the recorded peak against ``threshold`` x the model's
context window (or is forced, for ``/compact``), plans from the stored window, makes one
model call on the agent's route (trace tag ``compactor``, the configured
``reasoning_effort``), and writes the checkpoint and the new window start in one
transaction. A failure backs off 60 s, recorded in SQLite like the reviewer's gates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apsw

from fermix import llm
from fermix.actors.base import SupervisedActor
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core import compaction
from fermix.errors import FermixError, ModelError
from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage import conversations, messages
from fermix.storage.committer import Committer
from fermix.storage.pool import ReaderPool

log = logging.getLogger(__name__)

AGENT_TAG = "compactor"


@dataclass
class CompactionContext:
    """What a compaction needs: config, writer, readers, clock and the model route."""

    config: Config
    committer: Committer
    readers: ReaderPool
    clock: Callable[[], int] = now_ms
    route: llm.Route | None = None
    on_compacted: Callable[[ConversationKey], None] = field(default=lambda key: None)
    """Called after a compaction is committed (the conversation actor reloads its window)."""

    def model_route(self) -> llm.Route:
        """The agent's route (the same one the reviewer uses)."""
        if self.route is None:
            self.route = llm.Route.from_config(self.config.model)
        return self.route

    def context_window(self) -> int | None:
        """The model's context window: the configured override, else litellm's model info."""
        return llm.context_window(self.model_route(), self.config.model.context_window)


@dataclass
class CompactionResult:
    """What one compaction attempt did."""

    key: ConversationKey
    status: str
    """``compacted``, ``skipped`` or ``failed``."""
    reason: str = ""
    summarized: int = 0
    kept: int = 0
    before_tokens: int = 0
    after_tokens: int = 0
    model: str | None = None
    error: str | None = None

    @property
    def notice(self) -> str | None:
        """The chat notice after a successful compaction (K3)."""
        return compaction.NOTICE if self.status == "compacted" else None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {k: v for k, v in self.__dict__.items() if k != "key"} | {
            "conversation": f"{self.key.agent_id}/{self.key.scope_id}"
        }


def compact_conversation(
    ctx: CompactionContext, key: ConversationKey, *, force: bool = False
) -> CompactionResult:
    """Compact ``key`` if its recorded peak calls for it (or ``force``); never raises for
    a model failure, which is recorded for the 60 s backoff instead."""
    cfg = ctx.config.compaction
    now = ctx.clock()
    with ctx.readers.connection() as conn:
        state = conversations.get(conn, key)
        if state is None:
            return CompactionResult(key, "skipped", reason="cold")
        failed = state.compaction_failed_at
        if not force:
            if not cfg.enabled:
                return CompactionResult(key, "skipped", reason="disabled")
            if state.peak_prompt_tokens is None:
                return CompactionResult(key, "skipped", reason="cold")
            if failed is not None and now - failed < compaction.FAILURE_BACKOFF_MS:
                return CompactionResult(key, "skipped", reason="failure_backoff")
        window_size = ctx.context_window()
        if window_size is None:
            return CompactionResult(key, "skipped", reason="unknown_context_window")
        if not force and not compaction.due(state.peak_prompt_tokens, window_size, cfg.threshold):
            return CompactionResult(key, "skipped", reason="under_threshold")
        window = conversations.window(conn, key)
    route = ctx.model_route()
    plan = compaction.plan(window, context_window=window_size, model=route.primary)
    if plan is None:
        return CompactionResult(key, "skipped", reason="nothing_to_summarize")
    input_room = max(1_000, window_size - plan.summary_tokens - 1_000)
    prompt = [
        {"role": "system", "content": compaction.SUMMARY_PROMPT},
        {
            "role": "user",
            "content": compaction.transcript(
                plan.summarize,
                max_tokens=input_room,
                model=route.primary,
                costs=plan.costs[: len(plan.summarize)],
            ),
        },
    ]
    try:
        answer = llm.complete(
            route,
            prompt,
            agent=AGENT_TAG,
            reasoning_effort=cfg.reasoning_effort,
            max_tokens=min(plan.summary_tokens, compaction.MAX_SUMMARY_TOKENS),
            metadata={"conversation": key.scope_id, "agent_id": key.agent_id},
        )
        if not answer.content.strip():
            raise ModelError(f"{answer.model} returned an empty summary")
    except ModelError as exc:
        log.warning("compaction of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
        ctx.committer.run(
            lambda c: conversations.update(c, key, compaction_failed_at=ctx.clock()),
            label=f"compaction failure {key.scope_id}",
        )
        return CompactionResult(key, "failed", error=str(exc))
    summary = compaction.fit_summary(answer.content, plan=plan, model=route.primary)
    checkpoint = NewMessage(
        key,
        "assistant",
        summary,
        owner_id=state.owner_id,
        sender="compactor",
        kind="checkpoint",
        metadata={
            "summarized_from_id": plan.summarize[0].id,
            "summarized_to_id": plan.last_summarized_id,
            "summarized_messages": len(plan.summarize),
            "model": answer.model,
        },
    )

    def write(conn: apsw.Connection) -> Message:
        stored = messages.insert(conn, checkpoint)
        conversations.update(
            conn,
            key,
            window_after_id=plan.last_summarized_id,
            checkpoint_message_id=stored.id,
            compaction_failed_at=None,
            peak_prompt_tokens=None,
        )
        return stored

    stored = ctx.committer.run(write, label=f"compaction of {key.scope_id}")
    ctx.on_compacted(key)
    after = compaction.message_tokens(stored, route.primary) + plan.kept_tokens
    log.info(
        "compacted %s/%s: %d messages summarized, %d kept, %d -> %d tokens",
        *(key.agent_id, key.scope_id, len(plan.summarize), len(plan.keep)),
        *(plan.before_tokens, after),
    )
    return CompactionResult(
        key,
        "compacted",
        summarized=len(plan.summarize),
        kept=len(plan.keep),
        before_tokens=plan.before_tokens,
        after_tokens=after,
        model=answer.model,
    )


def clear_window(ctx: CompactionContext, key: ConversationKey) -> int:
    """Start the window after the newest stored message (``/new``, ``/clear``, K4).

    Only the window moves: the messages, long-term memory, resource revisions and
    scheduled jobs stay. Returns the id the window now starts after.
    """

    def write(conn: apsw.Connection) -> int:
        newest = messages.conversation(conn, key, limit=1, newest=True)
        after = newest[0].id if newest else 0
        conversations.update(
            conn, key, window_after_id=after, checkpoint_message_id=None, peak_prompt_tokens=None
        )
        return after

    after: int = ctx.committer.run(write, label=f"clear window {key.scope_id}")
    ctx.on_compacted(key)
    return after


class Compact(NamedTuple):
    """Compact ``key`` if due (``force``: now, as ``/compact``)."""

    key: ConversationKey
    force: bool = False


class Compactor(SupervisedActor):
    """Runs compactions one at a time (A5)."""

    # Its work can always be dropped (a claim expires, a backoff passes): a model call
    # still running at shutdown must not keep the process alive.
    use_daemon_thread = True

    def __init__(self, ctx: CompactionContext) -> None:
        super().__init__()
        self._ctx = ctx

    def on_receive(self, message: Any) -> Any:
        """Run one compaction; storage failures are logged and returned, not raised."""
        match message:
            case Compact(key, force):
                try:
                    return compact_conversation(self._ctx, key, force=force)
                except FermixError as exc:
                    log.error("compaction of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
                    return CompactionResult(key, "failed", error=str(exc))
        raise TypeError(f"Compactor got an unknown message: {message!r}")
