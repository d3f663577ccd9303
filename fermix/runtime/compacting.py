"""``Compacting``: one compaction of a conversation, and ``/new``'s fresh window (K1-K5).

:meth:`Compacting.compact` checks the recorded peak against ``threshold`` x the model's
context window (or is forced, for ``/compact``), plans from the stored window
(:mod:`fermix.core.compaction`), makes one model call on the agent's route (trace tag
``compactor``, the configured ``reasoning_effort``), and writes the checkpoint and the new
window start in one transaction. A failure backs off 60 s, recorded in SQLite like the
reviewer's gates. :meth:`Compacting.due` answers the same gates from one read on the
caller's thread, so a turn asks a Compactor only when its own compaction is due (M3); the
write checks that the window did not move meanwhile. :meth:`Compacting.clear_window` moves
only the window (``/new``, ``/clear``). Storage is reached through read units of the
:class:`~fermix.storage.Database` and write units of the
:class:`~fermix.runtime.writer.Writer`, nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from fermix import llm
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core import compaction
from fermix.core.compaction import CompactionResult
from fermix.errors import ModelError
from fermix.model import ConversationKey, ConversationState, Message, NewMessage
from fermix.runtime import outcomes
from fermix.runtime.telemetry import Telemetry
from fermix.runtime.writer import Writer
from fermix.storage import Storage, Writes

log = logging.getLogger(__name__)

AGENT_TAG = "compactor"
"""The trace tag of the summary call, and the ``sender`` of a checkpoint message."""
WAIT_MARGIN_S = 10.0
"""Seconds a turn waits for its compaction beyond the model calls' own timeouts: the plan's
token counting, the write, and a place in the Compactor's queue."""


class Compacting:
    """The compaction use case of one process, run by the Compactor actors: a conversation's
    compactions one at a time, different conversations' concurrently (M3)."""

    def __init__(
        self,
        config: Config,
        db: Storage,
        writer: Writer,
        *,
        clock: Callable[[], int] = now_ms,
        route: llm.Route | None = None,
        on_compacted: Callable[[ConversationKey], None] = lambda key: None,
        telemetry: Telemetry | None = None,
    ) -> None:
        """``on_compacted`` is called after a compaction or a cleared window is committed
        (the conversation actor reloads its window); ``route`` defaults to the one the
        config names, built on first use; ``telemetry`` counts the compactions by outcome
        and traces them and their model calls (O1, O2)."""
        self._settings = _Settings(config, route)
        """The config and route each compaction reads once, swapped whole by
        :meth:`reconfigure` (the route built on first use)."""
        self._fixed_route = route is not None
        self._settings_lock = threading.Lock()
        self._telemetry = Telemetry() if telemetry is None else telemetry
        self._db = db
        self._writer = writer
        self._clock = clock
        self._on_compacted = on_compacted
        self._unknown_windows: set[str] = set()
        """The models whose unknown context window was logged: once each, not per turn."""
        self._unknown_lock = threading.Lock()

    def reconfigure(self, config: Config) -> None:
        """Compact by ``config`` from the next compaction on (W1): enabled, threshold,
        reasoning effort and the model route; one running now finishes with what it
        started with. A route given at build stays."""
        with self._settings_lock:
            route = self._settings.route if self._fixed_route else None
            self._settings = _Settings(config, route)

    def _current(self) -> _Settings:
        """The settings a compaction reads, its route built (once per config)."""
        settings = self._settings
        if settings.route is not None:
            return settings
        with self._settings_lock:
            if self._settings.route is None:
                self._settings = _Settings(
                    self._settings.config, llm.Route.from_config(self._settings.config.model)
                )
            return self._settings

    def route(self) -> llm.Route:
        """The agent's route (the same one the reviewer uses)."""
        route = self._current().route
        assert route is not None
        return route

    def context_window(self, settings: _Settings | None = None) -> int | None:
        """The model's context window: the configured override, else litellm's model info."""
        settings = settings or self._current()
        assert settings.route is not None
        return llm.context_window(settings.route, settings.config.model.context_window)

    def _warn_unknown_window(self, route: llm.Route) -> None:
        """Say once per model that compaction is off for it, and which key turns it on (M8)."""
        model = route.primary or "-"
        with self._unknown_lock:
            if model in self._unknown_windows:
                return
            self._unknown_windows.add(model)
        log.warning(
            "compaction is off for model %s: litellm does not know its context window; set"
            " context_window (Memory(context_window=...) or [fermix_core.model]"
            " context_window in config.toml, in tokens)",
            model,
        )

    def wait_s(self) -> float:
        """How long a turn waits for a compaction of its conversation (M3): one call on
        each model of the route, each bounded by ``timeout_s``, plus :data:`WAIT_MARGIN_S`."""
        route = self.route()
        return route.policy.timeout_s * max(1, len(route.models)) + WAIT_MARGIN_S

    def _gate(
        self, settings: _Settings, state: ConversationState | None, *, force: bool
    ) -> tuple[str | None, int]:
        """Why ``state`` must not be compacted now by ``settings`` (None: it must), and the
        context window."""
        cfg = settings.config.compaction
        route = settings.route
        assert route is not None
        skip = compaction.gate(state, now_ms=self._clock(), enabled=cfg.enabled, force=force)
        if skip is not None:
            return skip, 0
        if route.primary is None:
            return llm.NO_MODEL, 0  # the start of the process said so, once (M8)
        window_size = self.context_window(settings)
        if window_size is None:
            self._warn_unknown_window(route)
            return "unknown_context_window", 0
        assert state is not None
        if not force and not compaction.due(state.peak_prompt_tokens, window_size, cfg.threshold):
            return "under_threshold", window_size
        return None, window_size

    def due(self, key: ConversationKey) -> bool:
        """Whether a compaction of ``key`` is due now: one read of SQLite on the caller's
        thread, no actor and no model (M3). A turn asks the Compactor only when it is."""
        with self._db.read() as reads:
            state = reads.conversation(key)
        return self._gate(self._current(), state, force=False)[0] is None

    def compact(self, key: ConversationKey, *, force: bool = False) -> CompactionResult:
        """Compact ``key`` if its recorded peak calls for it (or ``force``); never raises for
        a model failure, which is recorded for the 60 s backoff instead."""
        telemetry = self._telemetry
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT_TAG,
            "fermix.agent_id": key.agent_id,
            "fermix.channel": key.channel,
            "fermix.forced": force,
        }
        with telemetry.span(f"invoke_agent {AGENT_TAG}", attributes) as span:
            result = self._compact(key, force=force)
            if span is not None:
                span.set_attribute("fermix.outcome", result.status)
                span.set_attribute("fermix.reason", result.reason)
        telemetry.compactions.inc((result.status,))
        return result

    def _compact(self, key: ConversationKey, *, force: bool) -> CompactionResult:
        settings = self._current()  # one config and route for the whole compaction
        cfg, route = settings.config.compaction, settings.route
        assert route is not None
        with self._db.read() as reads:
            state = reads.conversation(key)
        skip, window_size = self._gate(settings, state, force=force)
        # A /compact that does nothing changes nothing (K4): only a due compaction's skip is
        # kept for the console (W1).
        if skip is not None:
            if skip in RECORDED_SKIPS and state is not None and not force:
                outcomes.record_skip(
                    self._writer, state, work="compaction", reason=skip, now=self._clock()
                )
            return _skipped(key, skip)
        assert state is not None
        with self._db.read() as reads:
            # An erasure after this point (F4) drops the summary: it may hold what was erased.
            erasures_seen = reads.latest_erasure_id()
            window = reads.window(key)
        plan = compaction.plan(window, context_window=window_size, model=route.primary)
        if plan is None:
            if not force:
                outcomes.record_skip(
                    self._writer,
                    state,
                    work="compaction",
                    reason="nothing_to_summarize",
                    now=self._clock(),
                )
            return _skipped(key, "nothing_to_summarize")
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
        empty: str | None = None
        try:
            answer = llm.complete(
                route,
                prompt,
                agent=AGENT_TAG,
                reasoning_effort=cfg.reasoning_effort,
                max_tokens=min(plan.summary_tokens, compaction.MAX_SUMMARY_TOKENS),
                metadata={"conversation": key.scope_id, "agent_id": key.agent_id},
                observer=self._telemetry,
            )
            if not answer.content.strip():
                empty = f"model_error: empty summary from {answer.model}"
                raise ModelError(f"{answer.model} returned an empty summary")
        except ModelError as exc:
            log.warning("compaction of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
            failed_at = self._clock()
            reason = empty or outcomes.failure_reason(exc)

            def failed(w: Writes) -> None:
                w.update_conversation(key, compaction_failed_at=failed_at)
                w.record_outcome(
                    key, work="compaction", outcome="failed", reason=reason, now=failed_at
                )

            self._writer.write(failed, label=f"compaction failure {key.scope_id}")
            return CompactionResult(key, "failed", error=str(exc))
        summary = compaction.fit_summary(answer.content, plan=plan, model=route.primary)
        checkpoint = NewMessage(
            key,
            "assistant",
            summary,
            owner_id=state.owner_id,
            sender=AGENT_TAG,
            kind="checkpoint",
            metadata={
                "summarized_from_id": plan.summarize[0].id,
                "summarized_to_id": plan.last_summarized_id,
                "summarized_messages": len(plan.summarize),
                "model": answer.model,
            },
        )

        def write(w: Writes) -> Message | None:
            # Checked under the write lock: another compaction or a /new (of this process
            # or another) may have moved the window since it was read.
            fresh = w.conversation(key)
            if fresh is None or (fresh.window_after_id, fresh.checkpoint_message_id) != (
                state.window_after_id,
                state.checkpoint_message_id,
            ):
                return None
            if w.erasures_since(erasures_seen, key.agent_id):
                return None
            stored = w.insert_message(checkpoint)
            w.update_conversation(
                key,
                window_after_id=plan.last_summarized_id,
                checkpoint_message_id=stored.id,
                compaction_failed_at=None,
                peak_prompt_tokens=None,
            )
            w.record_outcome(
                key,
                work="compaction",
                outcome="compacted",
                reason=f"{len(plan.summarize)} message(s) summarized by {answer.model},"
                f" {len(plan.keep)} kept",
                now=self._clock(),
            )
            return stored

        stored = self._writer.write(write, label=f"compaction of {key.scope_id}")
        if stored is None:
            outcomes.record(
                self._writer,
                key,
                work="compaction",
                outcome="skipped",
                reason="moved",
                now=self._clock(),
            )
            log.info(
                "compaction of %s/%s dropped: the window moved, or an erasure ran",
                key.agent_id,
                key.scope_id,
            )
            return _skipped(key, "moved")
        self._on_compacted(key)
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

    def clear_window(self, key: ConversationKey) -> int:
        """Start the window after the newest stored message (``/new``, ``/clear``, K4).

        Only the window moves: the messages, long-term memory, resource revisions and
        scheduled jobs stay. Returns the id the window now starts after.
        """

        def write(w: Writes) -> int:
            newest = w.messages(key, limit=1, newest=True)
            after = newest[0].id if newest else 0
            w.update_conversation(
                key, window_after_id=after, checkpoint_message_id=None, peak_prompt_tokens=None
            )
            return after

        after = self._writer.write(write, label=f"clear window {key.scope_id}")
        self._on_compacted(key)
        return after


class _Settings(NamedTuple):
    """What one compaction reads of the config, taken once (:meth:`Compacting.reconfigure`)."""

    config: Config
    route: llm.Route | None


RECORDED_SKIPS = frozenset({llm.NO_MODEL, "unknown_context_window"})
"""The gate's skips the console is told of (W1): a due compaction that could not run. The
routine ones (cold, disabled, in the backoff, under the threshold) record nothing."""


def _skipped(key: ConversationKey, reason: str) -> CompactionResult:
    return CompactionResult(key, "skipped", reason=reason)
