"""Compaction: the pure plan, the use case (:class:`~fermix.runtime.compacting.Compacting`)
on a real database and the loopback model server, the Compactor actor that runs it, and
the path through a running :class:`~fermix.api.Memory` (K1-K5).

The model's context window is overridden to 2,000 tokens, so the compaction budget is
1,000 tokens and the threshold 1,700: a few dozen short messages cross it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from factories import MODEL, StartMemory, config_for
from faults import FaultVFS
from hypothesis import given, settings
from hypothesis import strategies as st
from model_server import ModelServer
from rig import Rig

from fermix.actors.compactor import Compact, Compactor
from fermix.config import CompactionConfig, Config
from fermix.core import compaction
from fermix.core.compaction import (
    MESSAGE_OVERHEAD,
    NOTICE,
    SUMMARY_PROMPT,
    CompactionResult,
    due,
    fit_summary,
    message_tokens,
    plan,
    transcript,
)
from fermix.model import ConversationKey, ConversationState, Message
from fermix.runtime.compacting import Compacting
from fermix.token_counts import count_tokens, uses_tiktoken

if TYPE_CHECKING:
    from fermix import Conversation, Memory

WINDOW = 2_000
BUDGET = WINDOW // 2
THRESHOLD_TOKENS = 1_700  # 0.85 x 2,000

# -- the pure plan ------------------------------------------------------------------------


def msg(id: int, text: str, *, kind: str = "chat", role: str = "user") -> Message:
    """A stored message of one conversation."""
    return Message(id, "agent", "alice", "cli", "1", "", "alice", role, kind, text, "{}", id)


@st.composite
def windows(draw: st.DrawFn) -> list[Message]:
    """A window as storage returns it: optionally the previous compaction's checkpoint
    first, then the messages that compaction kept (ids below the checkpoint's), then the
    messages written since (ids above it)."""
    roles = st.sampled_from(["user", "assistant", "tool"])
    texts = draw(st.lists(st.tuples(st.text(max_size=300), roles), max_size=30))
    if not draw(st.booleans()):
        return [msg(i + 1, t, role=r) for i, (t, r) in enumerate(texts)]
    kept_before = draw(st.integers(0, len(texts)))
    old = [msg(i + 1, t, role=r) for i, (t, r) in enumerate(texts[:kept_before])]
    checkpoint = msg(kept_before + 1, draw(st.text(max_size=300)), kind="checkpoint")
    new = [msg(kept_before + 2 + i, t, role=r) for i, (t, r) in enumerate(texts[kept_before:])]
    return [checkpoint, *old, *new]


def cost(window: list[Message] | tuple[Message, ...]) -> int:
    return sum(message_tokens(m, None) for m in window)


@settings(max_examples=200, deadline=None)
@given(window=windows(), context_window=st.integers(1, 6_000))
def test_k1_a_plan_keeps_what_fits_the_budget_and_summarizes_the_rest_in_order(
    window: list[Message], context_window: int
) -> None:
    p = plan(window, context_window=context_window, model=None)
    budget = int(context_window * compaction.BUDGET_RATIO)
    if p is None:
        # no plan only when there is nothing to summarize or the window already fits
        plain = [m for m in window if m.kind != "checkpoint"]
        assert not plain or cost(plain) <= budget or budget <= MESSAGE_OVERHEAD
        return
    assert p.budget == budget
    assert list(p.summarize) + list(p.keep) == window  # nothing lost, order kept
    assert all(m.kind != "checkpoint" for m in p.keep)
    assert not p.keep or p.keep[0].role != "tool"  # never a tool result without its call
    assert any(m.kind != "checkpoint" for m in p.summarize)
    assert p.summary_tokens >= 1
    # the checkpoint message (a summary of at most summary_tokens) plus the kept messages
    assert cost(p.keep) + p.summary_tokens + MESSAGE_OVERHEAD <= budget
    # the window starts after the newest summarized id: exactly the kept messages follow
    assert all(m.id > p.last_summarized_id for m in p.keep)
    assert p.before_tokens == cost(window)


@settings(max_examples=100, deadline=None)
@given(window=windows(), context_window=st.integers(1, 6_000), summary=st.text(max_size=3_000))
def test_k1_a_fitted_summary_and_the_kept_messages_fit_the_budget(
    window: list[Message], context_window: int, summary: str
) -> None:
    p = plan(window, context_window=context_window, model=None)
    if p is None:
        return
    text = fit_summary(summary, plan=p, model=None)
    assert summary.strip().startswith(text)
    assert count_tokens(text) + MESSAGE_OVERHEAD + cost(p.keep) <= p.budget


def test_k1_the_newest_messages_are_kept_and_an_oversized_one_is_summarized() -> None:
    big = "word " * 2_000
    window = [msg(1, "old " * 50), msg(2, "older " * 50), msg(3, big), msg(4, "hi"), msg(5, "yo")]
    p = plan(window, context_window=WINDOW, model=None)
    assert p is not None
    assert [m.id for m in p.summarize] == [1, 2, 3]
    assert [m.id for m in p.keep] == [4, 5]
    assert p.last_summarized_id == 3


def test_k1_a_tool_result_is_summarized_with_the_call_it_answers() -> None:
    call = msg(2, "", role="assistant")
    window = [msg(1, "word " * 2_000), call, msg(3, "tool result " * 50, role="tool")]
    window += [msg(4, "the answer", role="assistant")]
    # room (budget - checkpoint framing - 128 reserved) for the result and the answer,
    # not for the call before them
    budget = cost(window[2:]) + MESSAGE_OVERHEAD + compaction.MIN_SUMMARY_TOKENS
    p = plan(window, context_window=2 * budget, model=None)
    assert p is not None
    assert [m.id for m in p.keep] == [4]
    assert p.summary_tokens == budget - MESSAGE_OVERHEAD - cost(p.keep)


def test_k1_a_window_that_fits_has_no_plan() -> None:
    window = [msg(i, f"short message {i}") for i in range(1, 10)]
    assert plan(window, context_window=WINDOW, model=None) is None
    assert plan([], context_window=WINDOW, model=None) is None


def test_k1_a_window_of_only_a_checkpoint_and_what_fits_has_no_plan() -> None:
    window = [msg(5, "summary", kind="checkpoint"), msg(6, "a"), msg(7, "b")]
    assert plan(window, context_window=WINDOW, model=None) is None


def test_k1_messages_kept_by_the_previous_compaction_are_summarized_with_its_checkpoint() -> None:
    # ids 1-2 were kept behind checkpoint 3; the window starts after the newest summarized
    # id, so keeping 2 and summarizing 3 would bring checkpoint 3 back as a plain message
    window = [msg(3, "summary", kind="checkpoint"), msg(1, "kept a"), msg(2, "kept b")]
    window += [msg(4, "x " * 1_000), msg(5, "new")]
    p = plan(window, context_window=WINDOW, model=None)
    assert p is not None
    assert [m.id for m in p.summarize] == [3, 1, 2, 4]
    assert [m.id for m in p.keep] == [5]
    assert p.last_summarized_id == 4


@settings(max_examples=200)
@given(context_window=st.integers(1, 2_000_000), threshold=st.floats(0.05, 1.0))
def test_k1_due_is_true_from_threshold_times_the_window(
    context_window: int, threshold: float
) -> None:
    edge = math.ceil(threshold * context_window)
    assert due(edge, context_window, threshold)
    assert due(edge + 1, context_window, threshold)
    assert not due(edge - 1, context_window, threshold)


def test_k3_due_is_false_without_a_recorded_peak() -> None:
    assert not due(None, WINDOW, 0.85)
    assert due(THRESHOLD_TOKENS, WINDOW, 0.85)
    assert not due(THRESHOLD_TOKENS - 1, WINDOW, 0.85)


def test_k1_the_transcript_drops_the_oldest_lines_first() -> None:
    window = [msg(i, f"line number {i} " * 20) for i in range(1, 30)]
    text = transcript(window, max_tokens=300, model=None)
    lines = text.splitlines()
    assert count_tokens(text) <= 300 + len(lines)
    assert json.loads(lines[-1])["text"] == window[-1].content
    assert len(lines) < len(window)


@settings(max_examples=200, deadline=None)
@given(window=windows(), max_tokens=st.integers(20, 4_000), reuse=st.booleans())
def test_k1_a_transcript_stays_within_its_tokens_and_keeps_the_newest_lines(
    window: list[Message], max_tokens: int, reuse: bool
) -> None:
    costs = [message_tokens(m, None) for m in window] if reuse else None
    lines = transcript(window, max_tokens=max_tokens, model=None, costs=costs).split("\n")
    if not window:
        assert lines == [""]
        return
    assert sum(count_tokens(line) for line in lines) + len(lines) - 1 <= max_tokens
    every = [
        json.dumps({"role": m.role, "kind": m.kind, "text": m.content}, ensure_ascii=False)
        for m in window
    ]
    whole = [line for line in lines if line in every]
    newest = every[len(every) - (len(whole) - 1) :]  # (not every[-0:], which is all of it)
    assert whole == every[len(every) - len(whole) :] or whole[1:] == newest


def test_k1_the_transcript_keeps_the_previous_checkpoint_when_it_cuts() -> None:
    checkpoint = msg(100, "The earlier summary. " * 10, kind="checkpoint")
    window = [checkpoint] + [msg(i, f"line number {i} " * 20) for i in range(1, 30)]
    lines = transcript(window, max_tokens=300, model=None).splitlines()
    assert sum(count_tokens(line) + 1 for line in lines) <= 300
    assert json.loads(lines[0]) == {
        "role": "user",
        "kind": "checkpoint",
        "text": checkpoint.content,
    }
    assert json.loads(lines[-1])["text"] == window[-1].content
    assert 2 < len(lines) < len(window)


def test_k3_the_notice_is_the_specified_sentence() -> None:
    assert NOTICE == "Trimmed older conversation history to stay within the context window."


# -- the use case: Compacting on a real database and the loopback model server ----------

KEY = ConversationKey("agent", "cli", "1")
_faulty = FaultVFS("fermix-faulty-compaction")


def small_window(
    server: ModelServer,
    *,
    enabled: bool = True,
    primary: str = MODEL,
    context_window: int | None = WINDOW,
) -> Config:
    """:func:`config_for` the loopback ``server`` with the 2,000-token context window,
    summaries at reasoning effort "high", and transcripts kept; background review is off,
    so every request the server receives is a compaction's."""
    return config_for(
        server,
        primary=primary,
        context_window=context_window,
        compaction=CompactionConfig(enabled=enabled, reasoning_effort="high"),
        persist_transcripts=True,
    )


class CompactionRig(Rig):
    """The shared rig on ``small_window(server)``, with a settable clock, the use case built
    per test with its own config, and every call of ``on_compacted`` with the
    conversation's state as SQLite held it then."""

    def __init__(self, root: Path, server: ModelServer, *, vfs: str | None = None) -> None:
        self.now = [1_800_000_000_000]
        super().__init__(root, small_window(server), clock=lambda: self.now[0], vfs=vfs)
        self.server = server
        self.compacted: list[tuple[ConversationKey, ConversationState | None]] = []

    def compacting(self, **config: Any) -> Compacting:
        """The use case on this database, its config :func:`small_window` with ``config``."""
        return Compacting(
            small_window(self.server, **config),
            self.db,
            self.writer,
            clock=lambda: self.now[0],
            on_compacted=lambda key: self.compacted.append((key, self.state(key))),
        )

    def append(self, role: str, text: str, *, peak: int | None = None) -> Message:
        return self.say(KEY, text, role=role, sender=role, peak=peak)

    def fill(self, turns: int, *, start: int = 0) -> list[Message]:
        """``turns`` user/assistant pairs, each with a searchable marker word."""
        stored = []
        for i in range(start, start + turns):
            stored.append(
                self.append(
                    "user", f"marker{i:03d}u I keep asking about the harbour in Porto, {i}."
                )
            )
            stored.append(
                self.append(
                    "assistant", f"marker{i:03d}a The harbour in Porto is busy in May, {i}."
                )
            )
        return stored

    def window(self, key: ConversationKey = KEY) -> list[Message]:
        return super().window(key)

    def state(self, key: ConversationKey = KEY) -> ConversationState | None:
        return super().state(key)

    def stored(self) -> list[Message]:
        """Every stored message of the conversation, whatever the window."""
        return self.messages(KEY)


@pytest.fixture
def rig(tmp_path: Path, model_server: ModelServer) -> Iterator[CompactionRig]:
    made = CompactionRig(tmp_path, model_server)
    yield made
    made.close()


def window_tokens(window: list[Message]) -> int:
    """The window's tokens by tiktoken, each message with its framing."""
    return sum(count_tokens(m.content, MODEL) + MESSAGE_OVERHEAD for m in window)


def test_k3_a_cold_conversation_is_skipped_without_calling_the_model(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    never_written = ConversationKey("agent", "cli", "new")
    assert compacting.compact(never_written).reason == "cold"
    assert compacting.compact(never_written, force=True).reason == "cold"
    rig.fill(30)  # far over the budget, but no turn has recorded a peak yet
    assert compacting.compact(KEY) == CompactionResult(KEY, "skipped", reason="cold")
    assert model_server.requests == [] and rig.compacted == []


def test_k3_under_the_threshold_is_skipped_without_calling_the_model(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "a reply", peak=THRESHOLD_TOKENS - 1)
    result = compacting.compact(KEY)
    assert (result.status, result.reason, result.notice) == ("skipped", "under_threshold", None)
    assert model_server.requests == []


def test_k1_k3_a_recorded_peak_at_the_threshold_compacts_once_and_is_used_up(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "the last reply", peak=THRESHOLD_TOKENS)
    model_server.reply("The user asked about the harbour in Porto many times.")
    result = compacting.compact(KEY)
    assert (result.status, result.notice, result.model) == ("compacted", NOTICE, MODEL)
    assert len(model_server.requests) == 1
    state = rig.state()
    assert state is not None and state.peak_prompt_tokens is None
    assert rig.window()[0].kind == "checkpoint"
    # on_compacted ran once, after the commit: SQLite already held the new window then
    assert rig.compacted == [(KEY, state)]
    assert compacting.compact(KEY).reason == "cold"  # the peak was used up: no second notice
    assert len(model_server.requests) == 1


def test_k1_k5_the_compacted_window_is_the_checkpoint_and_kept_messages_under_the_budget(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    assert uses_tiktoken(MODEL)  # the budget below is counted by tiktoken, not estimated
    compacting = rig.compacting()
    originals = rig.fill(30)
    originals.append(rig.append("assistant", "last", peak=1_900))
    assert window_tokens(rig.window()) > BUDGET
    # a summary far longer than the room it has: fermix cuts it to fit
    model_server.reply("Summary: the user asked about the harbour in Porto. " * 300)
    commits = rig.db.commits
    result = compacting.compact(KEY)
    assert result.status == "compacted"
    assert rig.db.commits == commits + 1  # the checkpoint and the window start: one transaction

    window = rig.window()
    state = rig.state()
    assert state is not None and state.checkpoint_message_id == window[0].id
    checkpoint, kept = window[0], window[1:]
    assert (checkpoint.kind, checkpoint.sender, checkpoint.owner_id) == (
        "checkpoint",
        "compactor",
        "alice",
    )
    assert all(m.kind != "checkpoint" for m in kept)
    assert kept and [m.id for m in kept] == [m.id for m in originals[-len(kept) :]]
    assert window_tokens(window) <= BUDGET
    summarized = originals[: -len(kept)]
    assert checkpoint.metadata == {
        "summarized_from_id": summarized[0].id,
        "summarized_to_id": summarized[-1].id,
        "summarized_messages": len(summarized),
        "model": MODEL,
    }
    assert state.window_after_id == summarized[-1].id
    assert (result.summarized, result.kept) == (len(summarized), len(kept))
    assert result.before_tokens == window_tokens(originals)
    assert result.after_tokens == window_tokens(window)
    assert result.as_dict()["conversation"] == f"agent/{KEY.scope_id}"

    # K5: every original message is still stored, and history search finds it
    stored = {m.id: m for m in rig.stored()}
    assert all(stored[m.id] == m for m in originals)
    oldest = originals[0]
    assert oldest.id not in {m.id for m in window}
    with rig.db.read() as reads:
        hits = reads.search_messages("marker000u", key=KEY)
    assert oldest.id in [h.message.id for h in hits]


def test_k2_the_summary_request_carries_the_configured_reasoning_effort(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    originals = rig.fill(30)
    rig.append("assistant", "last", peak=THRESHOLD_TOKENS)
    model_server.reply("A summary.")
    assert compacting.compact(KEY).status == "compacted"
    (request,) = model_server.requests
    # litellm passes reasoning_effort on for openai/test (it is dropped only for a model
    # litellm knows lacks it); the configured "high", not the default "medium"
    assert request["reasoning_effort"] == "high"
    system, user = request["messages"]
    assert system == {"role": "system", "content": SUMMARY_PROMPT}
    lines = [json.loads(line) for line in user["content"].splitlines()]
    assert lines[0] == {"role": "user", "kind": "chat", "text": originals[0].content}
    assert 1 <= request["max_tokens"] <= BUDGET


def test_k3_a_failed_compaction_backs_off_60_s_in_sqlite_then_runs_again(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "last", peak=THRESHOLD_TOKENS)
    window = rig.window()
    model_server.fail(500)

    result = compacting.compact(KEY)
    assert result.status == "failed" and result.notice is None and result.error
    state = rig.state()
    assert state is not None and state.compaction_failed_at == rig.now[0]
    assert state.peak_prompt_tokens == THRESHOLD_TOKENS  # still due once the backoff ends
    assert rig.window() == window
    assert rig.compacted == []  # no window moved: nothing for the actor to reload
    sent = len(model_server.requests)

    rig.now[0] += 59_999
    assert compacting.compact(KEY).reason == "failure_backoff"
    # the backoff is SQLite's, not this object's: a restarted process honours it too
    assert rig.compacting().compact(KEY).reason == "failure_backoff"
    assert len(model_server.requests) == sent

    rig.now[0] += 1
    model_server.reply("A summary after the backoff.")
    assert compacting.compact(KEY).notice == NOTICE
    state = rig.state()
    assert state is not None and state.compaction_failed_at is None
    assert rig.window()[0].content == "A summary after the backoff."


def test_k3_an_empty_summary_is_a_failure_that_changes_no_window(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "last", peak=THRESHOLD_TOKENS)
    window = rig.window()
    model_server.reply("   ")
    result = compacting.compact(KEY)
    assert result.status == "failed" and "empty summary" in (result.error or "")
    assert rig.window() == window
    assert rig.state().compaction_failed_at == rig.now[0]  # type: ignore[union-attr]


def test_w1_a_compaction_keeps_its_outcome_and_a_reason_without_the_text(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    """W1: the last compaction that was due keeps its outcome and a short reason (the model
    and error class, or what it did); routine skips (under the threshold) record nothing."""
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "last", peak=THRESHOLD_TOKENS)
    model_server.fail(500)
    assert compacting.compact(KEY).status == "failed"
    state = rig.state()
    assert state is not None and state.compaction_outcome == "failed"
    assert state.compaction_reason == f"model_error: unavailable: {MODEL} InternalServerError"
    assert state.compaction_outcome_at == rig.now[0]

    rig.now[0] += 60_000
    model_server.reply("A summary of the harbour talk.")
    assert compacting.compact(KEY).notice == NOTICE
    state = rig.state()
    assert state is not None and state.compaction_outcome == "compacted"
    assert state.compaction_reason is not None
    assert f"summarized by {MODEL}" in state.compaction_reason
    assert "harbour" not in state.compaction_reason

    rig.now[0] += 1
    assert compacting.compact(KEY).reason == "cold"  # the peak was used up: not recorded
    assert rig.state().compaction_outcome == "compacted"  # type: ignore[union-attr]


def test_k4_the_failure_backoff_does_not_hold_back_a_forced_compaction(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "last", peak=THRESHOLD_TOKENS)
    model_server.fail(500)
    assert compacting.compact(KEY).status == "failed"
    assert compacting.compact(KEY).reason == "failure_backoff"
    model_server.reply("A summary.")
    assert compacting.compact(KEY, force=True).status == "compacted"
    assert rig.window()[0].kind == "checkpoint"


def test_k2_disabled_compaction_never_compacts_unless_forced(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting(enabled=False)
    rig.fill(30)
    rig.append("assistant", "far over the threshold", peak=WINDOW)
    assert compacting.compact(KEY).reason == "disabled"
    assert model_server.requests == []
    assert rig.window()[0].kind == "chat"

    model_server.reply("A summary on request.")
    assert compacting.compact(KEY, force=True).status == "compacted"
    assert len(model_server.requests) == 1
    window = rig.window()
    assert window[0].content == "A summary on request."
    assert window_tokens(window) <= BUDGET


def test_k1_a_model_without_a_known_context_window_is_never_compacted(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting(primary="openai/fermix-no-such-model", context_window=None)
    assert compacting.context_window() is None
    rig.fill(30)
    rig.append("assistant", "last", peak=1_000_000)
    assert compacting.compact(KEY).reason == "unknown_context_window"
    assert compacting.compact(KEY, force=True).reason == "unknown_context_window"
    assert model_server.requests == []
    state = rig.state()  # W1: a due compaction that cannot run says why
    assert state is not None and state.compaction_outcome == "skipped"
    assert state.compaction_reason == "unknown_context_window"


def test_k1_a_forced_compaction_of_a_window_that_fits_has_nothing_to_summarize(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    assert compacting.context_window() == WINDOW
    rig.fill(2)
    result = compacting.compact(KEY, force=True)
    assert (result.status, result.reason) == ("skipped", "nothing_to_summarize")
    assert model_server.requests == [] and rig.window()[0].kind == "chat"


def test_k1_a_second_compaction_never_brings_the_old_checkpoint_back_as_a_message(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    model_server.reply("First summary.")
    assert compacting.compact(KEY, force=True).status == "compacted"
    first = rig.window()
    rig.fill(4, start=30)
    model_server.reply("Second summary.")
    assert compacting.compact(KEY, force=True).status == "compacted"

    window = rig.window()
    assert [m.kind for m in window].count("checkpoint") == 1
    assert window[0].content == "Second summary."
    assert first[0].id not in {m.id for m in window}
    # the second summary was asked of the first one, not of messages it already covers
    second_prompt = model_server.requests[1]["messages"][1]["content"]
    assert json.loads(second_prompt.splitlines()[0])["text"] == "First summary."
    # the kept messages are the newest stored ones, in order, with no gap
    plain = [m for m in rig.stored() if m.kind != "checkpoint"]
    assert [m.id for m in window[1:]] == [m.id for m in plain[-(len(window) - 1) :]]
    assert window_tokens(window) <= BUDGET


def test_k4_clearing_the_window_moves_only_the_window(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    compacting = rig.compacting()
    rig.fill(30)
    rig.append("assistant", "last", peak=THRESHOLD_TOKENS)
    model_server.reply("A summary.")
    assert compacting.compact(KEY).status == "compacted"
    stored = rig.stored()

    after = compacting.clear_window(KEY)
    assert after == stored[-1].id
    assert rig.window() == []
    state = rig.state()
    assert state is not None
    assert (state.window_after_id, state.checkpoint_message_id) == (after, None)
    assert state.peak_prompt_tokens is None
    assert rig.stored() == stored  # every message stays, the checkpoint too
    assert rig.compacted[-1] == (KEY, state)
    fresh = rig.append("user", "a fresh start")
    assert rig.window() == [fresh]


# -- the Compactor actor: one attempt at a time, storage failures as failed results ------


def test_a5_the_compactor_runs_its_use_case_and_answers_with_the_result(
    rig: CompactionRig, model_server: ModelServer
) -> None:
    rig.fill(30)
    model_server.reply("A summary.")
    compactor = Compactor.start(rig.compacting())
    try:
        forced = compactor.ask(Compact(KEY, force=True))
        again = compactor.ask(Compact(KEY))
    finally:
        compactor.stop()
    assert isinstance(forced, CompactionResult) and forced.status == "compacted"
    assert again == CompactionResult(KEY, "skipped", reason="cold")


def test_a5_a_storage_failure_is_a_failed_result_and_the_compactor_runs_on(
    tmp_path: Path, model_server: ModelServer
) -> None:
    rig = CompactionRig(tmp_path, model_server, vfs=_faulty.vfs_name)
    try:
        rig.fill(30)
        window = rig.window()
        model_server.reply("A summary that is never stored.")
        compactor = Compactor.start(rig.compacting())
        try:
            _faulty.plan.fail("write", times=None, suffix="-wal")
            failed = compactor.ask(Compact(KEY, force=True), block=True)
            _faulty.plan.clear()
            assert compactor.is_alive()
            assert rig.window() == window  # nothing of the checkpoint's transaction was kept
            model_server.reply("A summary.")
            stored = compactor.ask(Compact(KEY, force=True), block=True)
        finally:
            _faulty.plan.clear()
            compactor.stop()
        assert failed.status == "failed" and "injected write fault" in (failed.error or "")
        assert stored.status == "compacted"
        assert rig.window()[0].content == "A summary."
    finally:
        rig.close()


# -- through a running Memory: preflight, after delivery, /compact (K3, K4, K5) ----------


@pytest.fixture
def running(start_memory: StartMemory, model_server: ModelServer) -> Memory:
    """A running Memory whose model route is the loopback server, with the small window."""
    return start_memory(small_window(model_server))


def fill(conv: Conversation, turns: int) -> list[Message]:
    """Append ``turns`` user/assistant pairs, each with a searchable marker word."""
    stored = []
    for i in range(turns):
        stored.append(
            conv.append_user(f"marker{i:03d}u I keep asking about the harbour in Porto, {i}.")
        )
        stored.append(
            conv.append_assistant(f"marker{i:03d}a The harbour in Porto is busy in May, {i}.")
        )
    return stored


def test_k3_preflight_on_a_cold_conversation_returns_none_without_calling_the_model(
    running: Memory, model_server: ModelServer
) -> None:
    never_written = running.conversation("agent", "cli", "new", owner_id="alice")
    assert never_written.preflight() is None
    conv = running.conversation("agent", "cli", "1", owner_id="alice", trust="operator")
    fill(conv, 30)  # far over the budget, but no turn has recorded a peak yet
    assert conv.state().peak_prompt_tokens is None  # type: ignore[union-attr]
    assert conv.preflight() is None
    assert running.compact(conv).reason == "cold"
    assert model_server.requests == []


def test_k3_preflight_under_the_threshold_returns_none_without_calling_the_model(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    conv.append("assistant", "a reply", peak_prompt_tokens=THRESHOLD_TOKENS - 1)
    assert conv.preflight() is None
    assert running.compact(conv).reason == "under_threshold"
    assert model_server.requests == []


def test_k3_k5_preflight_over_the_peak_compacts_notices_once_and_recall_finds_the_old(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice", trust="operator")
    originals = fill(conv, 30)
    # the previous turn's peak, recorded by a host that stopped before post-delivery work
    conv.append("assistant", "the last reply", peak_prompt_tokens=THRESHOLD_TOKENS)
    model_server.reply("The user asked about the harbour in Porto many times.")
    assert conv.preflight() == NOTICE
    assert len(model_server.requests) == 1
    window = conv.history()
    assert window[0].kind == "checkpoint"
    assert conv.state().peak_prompt_tokens is None  # type: ignore[union-attr]
    assert conv.preflight() is None  # the peak was used up: no second notice
    assert len(model_server.requests) == 1
    # K5: the memory_recall tool still finds a message the checkpoint replaced
    oldest = originals[0]
    assert oldest.id not in {m.id for m in window}
    call = {
        "id": "call_1",
        "type": "function",
        "function": {
            "name": "memory_recall",
            "arguments": json.dumps({"query": "marker000u", "source": "history"}),
        },
    }
    recalled = json.loads(running.tools.run(call, conv))
    assert oldest.id in [h["id"] for h in recalled["history"]]


def test_k1_k3_a_turn_over_the_threshold_compacts_after_delivery_in_the_background(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    conv.append_user("marker900u one more question")
    conv.commit("an answer under the threshold", usage={"prompt_tokens": THRESHOLD_TOKENS - 1})
    # a compaction asked for now queues behind the post-delivery one of that turn
    assert running.compact(conv).reason == "under_threshold"
    assert model_server.requests == []

    model_server.reply("The user asked about the harbour in Porto many times.")
    conv.append_user("marker901u and another")
    conv.commit("an answer at the threshold", usage={"prompt_tokens": THRESHOLD_TOKENS})
    # queued behind the background compaction, which used the peak up and (before it
    # answered) told the conversation actor to reload its window
    assert running.compact(conv).reason == "cold"
    assert len(model_server.requests) == 1
    window = conv.history()
    assert window[0].kind == "checkpoint"
    assert window[-1].content == "an answer at the threshold"
    assert window_tokens(window) <= BUDGET
    assert conv.preflight() is None
    assert len(model_server.requests) == 1


def test_k4_the_failure_backoff_does_not_hold_back_slash_compact(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    conv.append("assistant", "last", peak_prompt_tokens=THRESHOLD_TOKENS)
    model_server.fail(500)
    assert running.compact(conv).status == "failed"
    model_server.reply("A summary.")
    reply = conv.handle_command("/compact")
    assert reply is not None and reply.startswith("Compacted ")
    assert conv.history()[0].kind == "checkpoint"


def test_k2_disabled_compaction_never_compacts_after_delivery_but_slash_compact_works(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(small_window(model_server, enabled=False))
    conv = memory.conversation("agent", "cli", "1", owner_id="alice", trust="operator")
    fill(conv, 30)
    conv.append_user("marker900u a question")
    conv.commit("far over the threshold", usage={"prompt_tokens": WINDOW})
    # queued behind the turn's post-delivery compaction, so that one has run too
    assert conv.preflight() is None
    assert memory.compact(conv).reason == "disabled"
    assert model_server.requests == []
    assert conv.history()[0].kind == "chat"

    model_server.reply("A summary on request.")
    reply = conv.handle_command("/compact")
    assert reply is not None and reply.startswith("Compacted ")
    assert len(model_server.requests) == 1
    assert conv.history()[0].content == "A summary on request."
