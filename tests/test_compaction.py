"""Compaction: the pure plan, then the real path through the actor tree and the loopback
model server (K1-K3, K5).

The model's context window is overridden to 2,000 tokens, so the compaction budget is
1,000 tokens and the threshold 1,700: a few dozen short messages cross it.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_server import ModelServer

from fermix import Conversation, Memory
from fermix.config import CompactionConfig, Config, MemoryConfig, ModelConfig, RealtimeConfig
from fermix.core import compaction
from fermix.core.compaction import (
    MESSAGE_OVERHEAD,
    NOTICE,
    SUMMARY_PROMPT,
    due,
    fit_summary,
    message_tokens,
    plan,
    transcript,
)
from fermix.model import ConversationKey, Message
from fermix.storage import conversations, messages, open_database
from fermix.tokens import count_tokens, uses_tiktoken

MODEL = "openai/test"
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


# -- the real path: actor tree, SQLite, loopback model server --------------------------------


def config_for(server: ModelServer, *, enabled: bool = True, effort: str = "high") -> Config:
    """A small context window on the loopback server; background review off, so every
    request the server receives is a compaction's."""
    return Config(
        memory=MemoryConfig(review_interval_hours=0),
        model=ModelConfig(primary=MODEL, api_base=server.url, context_window=WINDOW, timeout_s=5),
        compaction=CompactionConfig(enabled=enabled, reasoning_effort=effort),
        realtime=RealtimeConfig(persist_transcripts=True),
    )


@pytest.fixture
def running(home: Path, model_server: ModelServer) -> Iterator[Memory]:
    """A running Memory whose model route is the loopback server."""
    with Memory(home, config=config_for(model_server)) as memory:
        yield memory


@pytest.fixture
def compacted(running: Memory) -> threading.Event:
    """Set once a compaction has committed and the conversation actor was told to reload."""
    event = threading.Event()
    ctx = running.compaction_context
    reload_window = ctx.on_compacted

    def on_compacted(key: ConversationKey) -> None:
        reload_window(key)
        event.set()

    ctx.on_compacted = on_compacted
    return event


def fill(conv: Conversation, turns: int, *, start: int = 0) -> list[Message]:
    """Append ``turns`` user/assistant pairs, each with a searchable marker word."""
    stored = []
    for i in range(start, start + turns):
        stored.append(
            conv.append_user(f"marker{i:03d}u I keep asking about the harbour in Porto, {i}.")
        )
        stored.append(
            conv.append_assistant(f"marker{i:03d}a The harbour in Porto is busy in May, {i}.")
        )
    return stored


def stored_messages(home: Path, key: ConversationKey) -> list[Message]:
    conn = open_database(home / "memory.db")
    try:
        return messages.conversation(conn, key)
    finally:
        conn.close()


def window_tokens(window: list[Message]) -> int:
    """The window's tokens by tiktoken, each message with its framing."""
    return sum(count_tokens(m.content, MODEL) + MESSAGE_OVERHEAD for m in window)


def test_k3_preflight_on_a_cold_conversation_returns_none_without_calling_the_model(
    running: Memory, model_server: ModelServer
) -> None:
    never_written = running.conversation("agent", "cli", "new", owner_id="alice")
    assert never_written.preflight() is None
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)  # far over the budget, but no turn has recorded a peak yet
    assert conv.state().peak_prompt_tokens is None  # type: ignore[union-attr]
    assert conv.preflight() is None
    assert running.compact(conv).reason == "cold"
    assert model_server.requests == []


def test_k3_preflight_under_the_threshold_returns_none_without_calling_the_model(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    conv.append("assistant", "a reply", peak_prompt_tokens=THRESHOLD_TOKENS - 1)
    assert conv.preflight() is None
    assert running.compact(conv).reason == "under_threshold"
    assert model_server.requests == []


def test_k3_preflight_over_the_recorded_peak_compacts_and_sends_the_notice_once(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    # the previous turn's peak, recorded by a host that stopped before post-delivery work
    conv.append("assistant", "the last reply", peak_prompt_tokens=THRESHOLD_TOKENS)
    model_server.reply("The user asked about the harbour in Porto many times.")
    assert conv.preflight() == NOTICE
    assert len(model_server.requests) == 1
    assert conv.history()[0].kind == "checkpoint"
    assert conv.state().peak_prompt_tokens is None  # type: ignore[union-attr]
    assert conv.preflight() is None  # the peak was used up: no second notice
    assert len(model_server.requests) == 1


def test_k1_k3_a_turn_over_the_threshold_compacts_after_delivery_in_the_background(
    running: Memory, model_server: ModelServer, compacted: threading.Event
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    conv.append_user("marker900u one more question")
    conv.commit("an answer under the threshold", usage={"prompt_tokens": THRESHOLD_TOKENS - 1})
    # a compaction asked for now queues behind the post-delivery one of that turn
    assert running.compact(conv).reason == "under_threshold"
    assert model_server.requests == []

    model_server.reply("The user asked about the harbour in Porto many times.")
    conv.append_user("marker901u and another")
    conv.commit("an answer at the threshold", usage={"prompt_tokens": THRESHOLD_TOKENS})
    assert model_server.wait_for_requests(1, timeout=5)
    assert compacted.wait(5)
    window = conv.history()
    assert window[0].kind == "checkpoint"
    assert window[-1].content == "an answer at the threshold"
    assert window_tokens(window) <= BUDGET
    assert conv.preflight() is None  # the background compaction used the peak up
    assert len(model_server.requests) == 1


def test_k1_k5_the_compacted_window_is_the_checkpoint_and_kept_messages_under_the_budget(
    running: Memory, model_server: ModelServer, home: Path
) -> None:
    assert uses_tiktoken(MODEL)  # the budget below is counted by tiktoken, not estimated
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    originals = fill(conv, 30)
    originals.append(conv.append("assistant", "last", peak_prompt_tokens=1_900))
    assert window_tokens(conv.history()) > BUDGET
    # a summary far longer than the room it has: fermix cuts it to fit
    model_server.reply("Summary: the user asked about the harbour in Porto. " * 300)
    assert conv.preflight() == NOTICE

    window = conv.history()
    state = conv.state()
    assert state is not None and state.checkpoint_message_id == window[0].id
    checkpoint, kept = window[0], window[1:]
    assert (checkpoint.kind, checkpoint.sender) == ("checkpoint", "compactor")
    assert all(m.kind != "checkpoint" for m in kept)
    assert kept and [m.id for m in kept] == [m.id for m in originals[-len(kept) :]]
    assert window_tokens(window) <= BUDGET
    summarized = originals[: -len(kept)]
    assert checkpoint.metadata["summarized_from_id"] == summarized[0].id
    assert checkpoint.metadata["summarized_to_id"] == summarized[-1].id
    assert state.window_after_id == summarized[-1].id
    with running.readers.connection() as conn:
        assert conversations.window(conn, conv.key) == window  # the cache is SQLite's window

    # K5: every original message is still stored, and found by history search and recall
    stored = {m.id: m for m in stored_messages(home, conv.key)}
    assert all(stored[m.id] == m for m in originals)
    oldest = originals[0]
    assert oldest.id not in {m.id for m in window}
    with running.readers.connection() as conn:
        hits = messages.search(conn, "marker000u", key=conv.key)
    assert oldest.id in [h.message.id for h in hits]
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


def test_k2_the_summary_request_carries_the_configured_reasoning_effort(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    originals = fill(conv, 30)
    conv.append("assistant", "last", peak_prompt_tokens=THRESHOLD_TOKENS)
    model_server.reply("A summary.")
    assert conv.preflight() == NOTICE
    (request,) = model_server.requests
    # litellm passes reasoning_effort on for openai/test (it is dropped only for a model
    # litellm knows lacks it); the configured "high", not the default "medium"
    assert request["reasoning_effort"] == "high"
    system, user = request["messages"]
    assert system == {"role": "system", "content": SUMMARY_PROMPT}
    lines = [json.loads(line) for line in user["content"].splitlines()]
    assert lines[0] == {"role": "user", "kind": "chat", "text": originals[0].content}
    assert 1 <= request["max_tokens"] <= BUDGET


def test_k3_a_failed_compaction_backs_off_60_s_then_runs_again(
    running: Memory, model_server: ModelServer
) -> None:
    now = [1_800_000_000_000]
    running.compaction_context.clock = lambda: now[0]
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    conv.append("assistant", "last", peak_prompt_tokens=THRESHOLD_TOKENS)
    window = conv.history()
    model_server.fail(500)

    result = running.compact(conv)
    assert result.status == "failed" and result.notice is None
    state = conv.state()
    assert state is not None and state.compaction_failed_at == now[0]
    assert state.peak_prompt_tokens == THRESHOLD_TOKENS  # still due once the backoff ends
    assert conv.history() == window
    sent = len(model_server.requests)

    now[0] += 59_999
    assert running.compact(conv).reason == "failure_backoff"
    assert conv.preflight() is None
    assert len(model_server.requests) == sent

    now[0] += 1
    model_server.reply("A summary after the backoff.")
    assert conv.preflight() == NOTICE
    state = conv.state()
    assert state is not None and state.compaction_failed_at is None
    assert conv.history()[0].content == "A summary after the backoff."


def test_k3_an_empty_summary_is_a_failure_that_changes_no_window(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    conv.append("assistant", "last", peak_prompt_tokens=THRESHOLD_TOKENS)
    window = conv.history()
    model_server.reply("   ")
    result = running.compact(conv)
    assert result.status == "failed" and "empty summary" in (result.error or "")
    assert conv.history() == window
    assert conv.state().compaction_failed_at is not None  # type: ignore[union-attr]


def test_k4_the_failure_backoff_does_not_hold_back_slash_compact(
    running: Memory, model_server: ModelServer
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    conv.append("assistant", "last", peak_prompt_tokens=THRESHOLD_TOKENS)
    model_server.fail(500)
    assert running.compact(conv).status == "failed"
    model_server.reply("A summary.")
    reply = conv.handle_command("/compact")
    assert reply is not None and reply.startswith("Compacted ")
    assert conv.history()[0].kind == "checkpoint"


def test_k2_disabled_compaction_never_compacts_automatically_but_slash_compact_works(
    home: Path, model_server: ModelServer
) -> None:
    with Memory(home, config=config_for(model_server, enabled=False)) as memory:
        conv = memory.conversation("agent", "cli", "1", owner_id="alice")
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
        window = conv.history()
        assert window[0].content == "A summary on request."
        assert window_tokens(window) <= BUDGET


def test_k1_a_second_compaction_never_brings_the_old_checkpoint_back_as_a_message(
    running: Memory, model_server: ModelServer, home: Path
) -> None:
    conv = running.conversation("agent", "cli", "1", owner_id="alice")
    fill(conv, 30)
    model_server.reply("First summary.")
    assert (conv.handle_command("/compact") or "").startswith("Compacted ")
    first = conv.history()
    fill(conv, 4, start=30)
    model_server.reply("Second summary.")
    assert (conv.handle_command("/compact") or "").startswith("Compacted ")

    window = conv.history()
    assert [m.kind for m in window].count("checkpoint") == 1
    assert window[0].content == "Second summary."
    assert first[0].id not in {m.id for m in window}
    # the second summary was asked of the first one, not of messages it already covers
    second_prompt = model_server.requests[1]["messages"][1]["content"]
    assert json.loads(second_prompt.splitlines()[0])["text"] == "First summary."
    # the kept messages are the newest stored ones, in order, with no gap
    plain = [m for m in stored_messages(home, conv.key) if m.kind != "checkpoint"]
    assert [m.id for m in window[1:]] == [m.id for m in plain[-(len(window) - 1) :]]
    assert window_tokens(window) <= BUDGET
