"""``Reviewing``: the background memory review ("dreaming") as a use case (E1-E6, E10, SC3).

One :meth:`Reviewing.review` goes from gate to prompt files: the gate, a claim in the store
(checked again in the write unit; a claim the sweep took, :meth:`Reviewing.claim_due`, is
taken over with its token: one claim protocol for every process and service, B2), the
oldest unreviewed user messages that fit one review (M5) and the rows this review may touch
that fit its budget (M6), one model call, parse, admission, then one write unit that
applies the admitted operations, moves the cursor past the messages shown and finishes the
claim, after which the writer rebuilds the prompt files of this conversation's owner (every
other owner's later, M6). The rules are in
:mod:`fermix.core.review`, ``review_answer`` and ``review_admission``; storage is reached
only through read and write sessions. The :class:`~fermix.actors.reviewer.Reviewer` actor
runs reviews one at a time off the host's path; ``fermix memory review --now`` calls the
same object. The rows a review is shown are chosen in :mod:`~fermix.runtime.review_inputs`,
its admitted operations written by :mod:`~fermix.runtime.review_apply`.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from fermix import llm
from fermix.clock import now_ms
from fermix.config import Config
from fermix.core import review, review_admission, review_answer
from fermix.core.review import CLAIM_TTL_MS, ReviewResult, Skip
from fermix.errors import FermixError, ModelError, ReviewOutputError
from fermix.model import ConversationKey, ConversationState, MemoryRow
from fermix.runtime import outcomes
from fermix.runtime.review_apply import apply_admitted
from fermix.runtime.review_inputs import shown_rows
from fermix.runtime.telemetry import Telemetry
from fermix.runtime.writer import Writer
from fermix.storage import Storage, Writes

log = logging.getLogger(__name__)

AGENT_TAG = "memory_reviewer"
"""How the review's model calls are tagged in litellm's metadata and the ``fermix.llm`` log."""
SWEEP_CLAIMS_PER_WORKER = 8
"""Due conversations one sweep claims at most per Reviewer: at one model timeout (60 s)
each, all start before their claims expire (``CLAIM_TTL_MS``, 10 min)."""
SWEEP_AGAIN_S = 1.0
"""How soon the timer sweeps again after a sweep that claimed all it had room for."""


class Reviewing:
    """Reviews conversations of one home: the gate, the model call, the write (E1-E6)."""

    def __init__(
        self,
        config: Config,
        db: Storage,
        writer: Writer,
        *,
        clock: Callable[[], int] = now_ms,
        route: llm.Route | None = None,
        defer_other_owners: bool = True,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._fixed_route = route is not None
        self._settings = _Settings(
            config, route if route is not None else llm.Route.from_config(config.model)
        )
        """The config and route every review reads, swapped whole by :meth:`reconfigure`:
        a review takes them once, so no review mixes an old value with a new one."""
        self._telemetry = Telemetry() if telemetry is None else telemetry
        """Counts the reviews by outcome and traces them and their model calls (O1, O2)."""
        self._db = db
        self._writer = writer
        self._clock = clock
        self._defer = defer_other_owners
        """Whether a shared row's other owners get their files later (M6; False: at once)."""
        self._swept: dict[ConversationKey, str] = {}
        """Claims the sweep took (:meth:`claim_due`) that no review has taken yet."""
        self._swept_lock = threading.Lock()

    @property
    def route(self) -> llm.Route:
        """The agent's route: the configured primary and fallbacks (E4)."""
        return self._settings.route

    def reconfigure(self, config: Config) -> None:
        """Review by ``config`` from the next review or sweep on (W1): its interval (0 turns
        background reviews off), budgets, backoff and model route; a review running now
        finishes with what it started with. A route given at build stays."""
        route = self._settings.route if self._fixed_route else llm.Route.from_config(config.model)
        self._settings = _Settings(config, route)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Repair the prompt files a stopped process left behind, before the first review.

        A host killed between the commit of a review and its rebuild leaves them behind
        their rows. The check renders every owner's files, so the Reviewer runs it on its
        own thread when it starts, off the host's path.
        """
        self._writer.repair_files(every_agent=True)

    # -- the sweep (E1) ------------------------------------------------------------------

    def due(self) -> list[ConversationKey]:
        """Conversations whose review the sweep would claim now, oldest due first (claims
        nothing): a user message waits, the review interval has passed, and no backoff nor
        live claim holds them.

        A conversation whose last review left part of its backlog is due at once: that
        review kept its last complete review's time (M5, see :meth:`_finish`).
        """
        gates = self._sweep_gates(self._settings.config)
        if gates is None:
            return []
        with self._db.read() as reads:
            return reads.due_reviews(**gates)

    def claim_due(self, limit: int) -> list[ConversationKey]:
        """Claim up to ``limit`` due conversations for this process's reviews (the sweep,
        M7, B2): in one write, so no other process's sweep claims them too. Each claim
        passes to the next review of its conversation here (:meth:`review`); one that no
        review takes goes back with :meth:`release`. None without a model (M8)."""
        settings = self._settings
        gates = self._sweep_gates(settings.config)
        if gates is None or settings.route.primary is None or limit < 1:
            return []
        token = uuid.uuid4().hex
        keys = self._writer.write(
            lambda writes: writes.claim_due_reviews(
                token=token, ttl_ms=CLAIM_TTL_MS, limit=limit, **gates
            ),
            label="review sweep",
        )
        with self._swept_lock:
            self._swept.update(dict.fromkeys(keys, token))
        return keys

    def release(self, key: ConversationKey) -> bool:
        """Give back the sweep's claim of ``key`` unless a review took it already (its
        dispatch failed, or a review of it was pending); True if it was still here. The
        conversation stays due while user messages wait."""
        with self._swept_lock:
            token = self._swept.pop(key, None)
        self._give_back(key, token)
        return token is not None

    def _sweep_gates(self, config: Config) -> dict[str, int] | None:
        """The gates of a sweep by ``config`` at this moment, as the storage filters take
        them (None: background reviews are off, E2)."""
        cfg = config.memory
        if cfg.review_interval_hours == 0:
            return None
        return {
            "now": self._clock(),
            # gate(): due once now - last_reviewed_at >= the interval, in whole ms
            "interval_ms": math.ceil(cfg.review_interval_hours * 3_600_000),
            "backoff_ms": cfg.review_failure_backoff_ms,
        }

    # -- one review ----------------------------------------------------------------------

    def review(self, key: ConversationKey, *, force: bool = False) -> ReviewResult:
        """Review ``key`` if its gates allow (``force``: past the interval and backoff).

        One review takes the oldest unreviewed user messages that fit its limits and
        moves the cursor past them only (M5); what is left is due again at once, for the
        sweep or the next dispatch. A forced review (``--now``, ``Memory.review``) goes on
        until the user messages there were when it started are all reviewed, or one
        review fails, and returns once every prompt file its rows show in is rebuilt.

        Never raises for a model or output failure (recorded for the backoff and returned
        as ``failed``); raises :class:`~fermix.errors.FermixError` when the database fails,
        after recording the failure if it can. Prompt files a failed rebuild of this process
        left behind are repaired first.
        """
        telemetry = self._telemetry
        with telemetry.span(f"invoke_agent {AGENT_TAG}", _span_attributes(key, force)) as span:
            result = self._review(key, force=force)
            if span is not None:
                span.set_attribute("fermix.outcome", result.status)
                span.set_attribute("fermix.review.messages", result.messages)
        telemetry.reviews.inc((result.status,))
        return result

    def _review(self, key: ConversationKey, *, force: bool) -> ReviewResult:
        if self._writer.has_stale_files:
            self._writer.repair_files()
        settings = self._settings  # one config and route for the whole review
        result, newest = self._review_once(settings, key, force=force)
        if not force:
            return result
        while result.status in ("applied", "nothing") and result.left > 0:
            later, _ = self._review_once(settings, key, force=True, up_to=newest)
            if later.status == "skipped":
                break
            result = result.followed_by(later)
        self._writer.files.settle()
        return result

    def _review_once(
        self, settings: _Settings, key: ConversationKey, *, force: bool, up_to: int | None = None
    ) -> tuple[ReviewResult, int]:
        """One review of ``key`` by ``settings`` (of messages up to ``up_to`` when given),
        and the newest user message it could take."""
        cfg = settings.config.memory
        now = self._clock()
        with self._swept_lock:
            swept = self._swept.pop(key, None)  # the sweep's claim, taken over here
        with self._db.read() as reads:
            state = reads.conversation(key)
            newest = reads.newest_user_message_id(key)
        if up_to is not None:
            newest = min(newest, up_to)
        skip = review.gate(
            state,
            now_ms=now,
            interval_hours=cfg.review_interval_hours,
            backoff_ms=cfg.review_failure_backoff_ms,
            newest_user_message_id=newest,
            force=force,
        )
        if settings.route.primary is None and skip is None:
            # No model configured: the start of the process said so once (M8); a review the
            # gates would run is skipped, neither failed nor put into its backoff, and the
            # console is told why (W1).
            skip = Skip.NO_MODEL
            if state is not None:
                outcomes.record_skip(self._writer, state, work="review", reason=skip.value, now=now)
        if skip is not None or state is None:
            self._give_back(key, swept)
            return ReviewResult(key, "skipped", skip=skip or Skip.NO_NEW_MESSAGES), newest
        token = swept or uuid.uuid4().hex

        def claim(writes: Writes) -> Skip | None:
            # Checked again under the write lock: another process may have just reviewed.
            fresh = writes.conversation(key)
            if fresh is None or fresh.last_reviewed_message_id >= newest:
                if swept is not None:
                    writes.release_review(key, token=swept)
                return Skip.NO_NEW_MESSAGES
            # One claim protocol: a token the sweep claimed with is taken again here.
            if writes.claim_review(key, token=token, now=now, ttl_ms=CLAIM_TTL_MS):
                return None
            return Skip.CLAIMED

        lost = self._writer.write(claim, label=f"review claim {key.scope_id}")
        if lost is not None:
            return ReviewResult(key, "skipped", skip=lost), newest
        try:
            return self._claimed(settings, state, newest, token), newest
        except BaseException as exc:
            self._record_failure(key, token, outcomes.failure_reason(exc))
            raise

    def _claimed(
        self, settings: _Settings, state: ConversationState, newest: int, token: str
    ) -> ReviewResult:
        """The review of ``state`` by ``settings`` once this process holds its claim
        ``token``."""
        key, cfg, route = state.key, settings.config.memory, settings.route
        with self._db.read() as reads:
            # An erasure after this point (F4) makes the write below write nothing: what the
            # model is shown may be what was erased.
            erasures_seen = reads.latest_erasure_id()
            # The claim is checked again under the write lock: the cursor read here is the
            # one this review moves on from (another review finishing meanwhile lost it).
            fresh = reads.conversation(key) or state
            waiting, count = reads.review_backlog(
                key,
                after_id=fresh.last_reviewed_message_id,
                up_to=newest,
                limit=cfg.review_max_messages,
            )
            packed = review.pack_backlog(
                waiting,
                max_messages=cfg.review_max_messages,
                token_budget=cfg.review_input_token_budget,
                model=route.primary,
            )
            speakers = review.speakers_of(packed.messages)
            shown = shown_rows(
                reads,
                state,
                packed.messages,
                token_budget=cfg.review_rows_token_budget,
                model_name=route.primary,
                speakers=speakers,
            )
        messages = packed.messages
        result = ReviewResult(
            key,
            "nothing",
            messages=len(messages),
            left=count - len(messages),
            truncated=packed.truncated,
            reviews=1,
            shown=len(shown),
        )
        if not messages:
            # The messages the gate saw are gone (deleted from outside): nothing to show.
            self._writer.write(
                lambda writes: self._finish(
                    writes,
                    key,
                    token,
                    newest,
                    caught_up=True,
                    outcome="nothing",
                    reason="no_messages",
                ),
                label=f"review of {key.scope_id}",
            )
            result.reviews = 0
            return result
        if packed.truncated:
            log.info(
                "review of %s: message %d is larger than the input budget (%d tokens);"
                " the model is shown its start",
                key.scope_id,
                messages[0].id,
                cfg.review_input_token_budget,
            )
        last = messages[-1].id
        caught_up = result.left == 0
        try:
            answer = llm.complete(
                route,
                review.build_prompt(messages, shown, speakers),
                agent=AGENT_TAG,
                response_format=review_answer.RESPONSE_SCHEMA,
                metadata={"conversation": key.scope_id, "agent_id": key.agent_id},
                observer=self._telemetry,
            )
            result.model, result.tried = answer.model, answer.tried
            operations = review_answer.parse(answer.content)
        except (ModelError, ReviewOutputError) as exc:
            log.warning("review of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
            self._record_failure(key, token, outcomes.failure_reason(exc, model=result.model))
            result.status, result.error = "failed", str(exc)
            result.tried = getattr(exc, "tried", result.tried)
            result.messages, result.left = 0, count  # nothing was marked reviewed
            return result
        admission = review_admission.admit(operations, shown=shown, speakers=speakers)
        for refusal in admission.refused:
            log.info("review of %s refused %s: %s", key.scope_id, refusal.operation, refusal.reason)
        result.refused = [f"{r.operation.op}: {r.reason}" for r in admission.refused]

        said = {
            (s.owner_id, s.trust): max(
                m.id for m in messages if (m.owner_id, m.trust) == (s.owner_id, s.trust)
            )
            for s in speakers
        }

        erased: list[bool] = []

        def apply(writes: Writes) -> list[MemoryRow]:
            if writes.erasures_since(erasures_seen, key.agent_id):
                # What it read may be erased: nothing of it is written, the claim goes back,
                # and the next review reads what is left (F4).
                erased.append(True)
                writes.release_review(key, token=token)
                writes.record_outcome(
                    key, work="review", outcome="nothing", reason="erasure_ran", now=self._clock()
                )
                return []
            written = apply_admitted(writes, state, admission, said, last)
            self._finish(
                writes,
                key,
                token,
                last,
                caught_up=caught_up,
                outcome="applied" if admission.admitted else "nothing",
                reason=_counts(admission.admitted, len(admission.refused), len(messages), count),
            )
            return written

        # A shared row reaches every owner that has files already; the speakers may have
        # none. Their files are rebuilt at once, every other owner's later (M6).
        also = [(state.agent_id, state.owner_id)]
        also += [(state.agent_id, s.owner_id or "") for s in speakers]
        rows = self._writer.write_rows(
            apply,
            label=f"review of {key.scope_id}",
            reason="review",
            also=list(dict.fromkeys(also)),
            defer_shared=self._defer,
        )
        if erased:
            log.info("review of %s wrote nothing: an erasure ran meanwhile", key.scope_id)
            result.status, result.messages, result.left = "nothing", 0, count
            return result
        if not caught_up:
            log.info(
                "review of %s: %d user message(s) left for the next review",
                key.scope_id,
                result.left,
            )
        for op in admission.admitted:
            if op.op == "add":
                result.added += 1
            elif op.op == "replace":
                result.replaced += 1
            else:
                result.archived += 1
        if admission.admitted:
            result.status = "applied"
        # The rows are committed and the files derive from them (S1): a failed rebuild
        # leaves the review standing, and the next review (or the next start) repairs them.
        result.files_changed, result.error = rows.files_changed, rows.error
        return result

    def _finish(
        self,
        writes: Writes,
        key: ConversationKey,
        token: str,
        last: int,
        *,
        caught_up: bool,
        outcome: str,
        reason: str,
    ) -> None:
        """Mark the user messages up to ``last`` reviewed, release the claim (M5) and keep
        ``outcome`` and ``reason`` for the console (W1).

        A review that left part of the backlog keeps the time of the last review that
        caught up (none, for a conversation never caught up): the interval counts from
        there, so the rest is due at once.
        """
        before = writes.conversation(key)
        now = self._clock()
        if not writes.finish_review(key, token=token, now=now, last_message_id=last):
            raise FermixError("the review claim expired before the review finished")
        if not caught_up and before is not None:
            writes.update_conversation(key, last_reviewed_at=before.last_reviewed_at)
        writes.record_outcome(key, work="review", outcome=outcome, reason=reason, now=now)

    def _give_back(self, key: ConversationKey, swept: str | None) -> None:
        """Release the sweep's claim ``swept`` of a review that did not run (logged if that
        fails: the claim then expires)."""
        if swept is None:
            return
        try:
            self._writer.write(
                lambda writes: writes.release_review(key, token=swept),
                label=f"review release {key.scope_id}",
            )
        except FermixError:
            log.exception("could not release the sweep's claim of %s", key.scope_id)

    def _record_failure(self, key: ConversationKey, token: str, reason: str) -> None:
        """Start the failure backoff, release the claim and keep ``reason`` for the console
        (W1); logged if that fails too."""
        now = self._clock()

        def failed(writes: Writes) -> None:
            writes.fail_review(key, token=token, now=now)
            writes.record_outcome(key, work="review", outcome="failed", reason=reason, now=now)

        try:
            self._writer.write(failed, label=f"review failure {key.scope_id}")
        except FermixError:
            log.exception("could not record the failed review of %s", key.scope_id)


class _Settings(NamedTuple):
    """What one review reads of the config, taken once (:meth:`Reviewing.reconfigure`)."""

    config: Config
    route: llm.Route


def _counts(admitted: Sequence[Any], refused: int, messages: int, backlog: int) -> str:
    """The reason of a review that ran: what it took and did, in counts only."""
    ops = [op.op for op in admitted]
    done = ", ".join(f"{ops.count(op)} {op}" for op in ("add", "replace", "archive") if op in ops)
    left = backlog - messages
    return (
        f"{messages} message(s) read; {done or 'no change'}"
        + (f"; {refused} refused" if refused else "")
        + (f"; {left} left" if left > 0 else "")
    )


def _span_attributes(key: ConversationKey, force: bool) -> dict[str, str | bool]:
    """A review's span attributes (GenAI's agent span): never an owner or a chat id."""
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": AGENT_TAG,
        "fermix.agent_id": key.agent_id,
        "fermix.channel": key.channel,
        "fermix.forced": force,
    }
