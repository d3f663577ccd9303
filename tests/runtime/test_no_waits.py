"""No turn waits on another conversation (M3).

A turn's preflight reads from SQLite, on its own thread, whether its compaction is due and
asks a Compactor only then; compactions and reviews of different conversations run on a
pool of supervised actors, so a model call that hangs for conversation A holds one actor,
never B's turn; and every wait a turn makes is bounded. Each test makes A's model call hang
on the loopback server (released by an event, or left to the end of the test) and checks
that B's turn finished *while A was still blocked*: causality, no timing thresholds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from factories import StartMemory, config_for, reading
from model_server import ModelServer

from fermix.api import Memory
from fermix.config import CompactionConfig, Config, MemoryConfig
from fermix.conversation import Conversation
from fermix.core.compaction import NOTICE
from fermix.core.review import Skip
from fermix.model import ConversationKey, ConversationState
from fermix.runtime import compacting

WINDOW = 2_000
OVER = 1_900  # over compaction's 0.85 x WINDOW
MODEL_TIMEOUT_S = 30.0
"""Long enough that, on code where B waits behind A, A is no longer blocked when B ends."""


def _config(server: ModelServer, **memory: Any) -> Config:
    return config_for(
        server,
        context_window=WINDOW,
        timeout_s=MODEL_TIMEOUT_S,
        memory=MemoryConfig(**memory) if memory else None,
        compaction=CompactionConfig(reasoning_effort="high"),
    )


def _filled(memory: Memory, chat: str, *, peak: int | None) -> Conversation:
    """A conversation with enough history to summarize; its last turn recorded ``peak``."""
    conv = memory.conversation("agent", "tg", chat, owner_id=f"owner{chat}", trust="operator")
    for i in range(40):
        conv.append_user(f"question {i} about the harbour in Porto and its boats")
        conv.append_assistant(f"answer {i}: the harbour in Porto is busy in May")
    conv.append("assistant", "the last reply", peak_prompt_tokens=peak)
    return conv


def _state(home: Path, key: ConversationKey) -> ConversationState:
    with reading(home) as reads:
        state = reads.conversation(key)
    assert state is not None
    return state


class _InThread:
    """Runs ``call`` on its own thread; ``result`` once it returned."""

    def __init__(self, call: Any) -> None:
        self.result: list[Any] = []
        self.thread = threading.Thread(target=lambda: self.result.append(call()), daemon=True)
        self.thread.start()

    @property
    def blocked(self) -> bool:
        return self.thread.is_alive() and not self.result


@pytest.fixture
def release(model_server: ModelServer) -> Iterator[threading.Event]:
    """The event that lets a hanging model answer go (set at the end of the test at last)."""
    event = threading.Event()
    yield event
    event.set()


class _Spy:
    """Every ask and tell made to any actor of this process while it records."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[tuple[str, str, Any]] = []
        self.recording = False
        ask, tell = pykka.ActorRef.ask, pykka.ActorRef.tell
        spy = self

        def spy_ask(ref: Any, message: Any, **keywords: Any) -> Any:
            if spy.recording:
                spy.sent.append(("ask", ref.actor_class.__name__, message))
            return ask(ref, message, **keywords)

        def spy_tell(ref: Any, message: Any) -> None:
            if spy.recording:
                spy.sent.append(("tell", ref.actor_class.__name__, message))
            tell(ref, message)

        monkeypatch.setattr(pykka.ActorRef, "ask", spy_ask)
        monkeypatch.setattr(pykka.ActorRef, "tell", spy_tell)


# -- compaction ---------------------------------------------------------------------------


def test_m3_a_compaction_hung_in_the_model_never_holds_up_another_conversations_preflight(
    start_memory: StartMemory, model_server: ModelServer, release: threading.Event
) -> None:
    memory = start_memory(_config(model_server))
    a = _filled(memory, "a", peak=OVER)
    cold = _filled(memory, "cold", peak=None)
    due = _filled(memory, "due", peak=OVER)
    model_server.hang(release)  # A's summary call
    model_server.reply("B asked about the harbour in Porto.")  # B's
    turn_a = _InThread(a.preflight)
    assert model_server.wait_for_requests(1, timeout=30)  # A is in the model now

    assert cold.preflight() is None  # not due: answered from SQLite
    assert due.preflight() == NOTICE  # due: compacted by another Compactor
    assert turn_a.blocked, "B's turn waited for A's model call"
    assert due.history()[0].kind == "checkpoint"
    assert len(model_server.requests) == 2

    release.set()
    turn_a.thread.join(60)
    assert not turn_a.thread.is_alive()


def test_m3_preflight_of_a_conversation_not_due_asks_no_actor(
    start_memory: StartMemory, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = start_memory(_config(model_server))
    never_written = memory.conversation("agent", "tg", "new")
    cold = _filled(memory, "cold", peak=None)
    under = _filled(memory, "under", peak=WINDOW // 2)
    backing_off = _filled(memory, "failed", peak=OVER)
    model_server.fail(500)
    assert backing_off.preflight() is None  # its compaction failed: 60 s of backoff
    assert model_server.wait_for_requests(1, timeout=30)

    spy = _Spy(monkeypatch)
    spy.recording = True
    for conv in (never_written, cold, under, backing_off):
        assert conv.preflight() is None
    spy.recording = False
    assert spy.sent == []
    assert len(model_server.requests) == 1

    off = start_memory(
        config_for(model_server, context_window=WINDOW, compaction=CompactionConfig(enabled=False)),
        home=memory.home.root / "other",
    )
    spy.recording = True
    assert _filled(off, "1", peak=OVER).preflight() is None  # compaction is off
    spy.recording = False
    assert [(how, actor) for how, actor, _ in spy.sent if actor != "ConversationStore"] == []


def test_m3_a_turn_waits_for_its_own_compaction_at_most_the_bound_then_goes_on_logged(
    start_memory: StartMemory,
    model_server: ModelServer,
    release: threading.Event,
    home: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = start_memory(_config(model_server))
    conv = _filled(memory, "a", peak=OVER)
    model_server.hang(release)
    memory._runtime.wait_s = 0.2  # the bound; by default timeout_s x models + 10 s
    with caplog.at_level(logging.WARNING, logger="fermix.runtime.engine"):
        assert conv.preflight() is None  # the turn goes on without its compaction
    assert "no compaction of agent/tg:a within 0.2 s" in caplog.text
    # The model still holds the call: the compaction neither failed nor finished.
    state = _state(home, conv.key)
    assert state.compaction_failed_at is None and state.peak_prompt_tokens == OVER
    reply = conv.handle_command("/compact")  # queued behind it, and bounded as well
    assert reply is not None and reply.startswith("Compaction failed: no result within 0.2 s")
    assert len(model_server.requests) == 1


def test_m3_the_default_bound_is_the_model_timeout_per_model_plus_a_margin(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(
        config_for(model_server, fallbacks=("backup",), timeout_s=7.0, context_window=WINDOW)
    )
    assert memory._runtime.services.compacting.wait_s() == 2 * 7.0 + 10.0


# -- reviews ------------------------------------------------------------------------------


def test_m3_a_review_hung_in_the_model_never_holds_up_another_conversations_review(
    start_memory: StartMemory, model_server: ModelServer, release: threading.Event, home: Path
) -> None:
    memory = start_memory(_config(model_server, review_interval_hours=24))
    a = memory.conversation("agent", "tg", "a", owner_id="ana")
    b = memory.conversation("agent", "tg", "b", owner_id="bob")
    model_server.hang(release)  # A's review
    model_server.reply_json({"operations": []})  # B's background review
    model_server.reply_json({"operations": []})  # B's review on request
    a.append_user("I am Ana")
    a.commit("Hi Ana")  # dispatches A's review, which hangs in the model
    assert model_server.wait_for_requests(1, timeout=30)

    b.append_user("I am Bob")
    b.commit("Hi Bob")  # B's review goes to a free Reviewer
    # asked after B's background review, so answered after it
    assert memory.review(b, force=False).skip is Skip.UNDER_INTERVAL
    b.append_user("I like tea")
    assert memory.review(b).status == "nothing"  # and one waited on, forced
    state_a = _state(home, a.key)
    assert state_a.last_reviewed_at is None and state_a.review_failed_at is None, (
        "B's reviews waited for A's model call"
    )
    assert len(model_server.requests) == 3


# -- the pools are supervised -------------------------------------------------------------


def test_m3_the_pools_are_sized_by_config_and_each_actor_is_restarted_after_a_crash(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    config = _config(model_server)
    config = Config(
        memory=MemoryConfig(review_interval_hours=0, review_workers=3),
        compaction=CompactionConfig(workers=4),
        model=config.model,
    )
    memory = start_memory(config)
    tree = memory._runtime.services.tree
    ids = [info.id for info in tree.which_children()]
    assert ids == [
        *("reviewer", "reviewer-2", "reviewer-3"),
        *("compactor", "compactor-2", "compactor-3", "compactor-4"),
        "conversations",
    ]
    names = [t.name for t in threading.enumerate()]
    assert sum(n.startswith("Reviewer") for n in names) == 3
    assert sum(n.startswith("Compactor") for n in names) == 4
    conv = _filled(memory, "1", peak=None)
    # one of each pool: the tree's restart intensity (3 in 5 s) is shared by all its children
    for child in ("reviewer-3", "compactor-4"):
        before: Any = tree.await_child(child)
        before.tell("not a message")
        assert before.actor_stopped.wait(5)
        assert tree.await_child(child) is not before
    assert memory.compact(conv).reason == "cold"
    assert memory.review(memory.conversation("agent", "tg", "2")).skip is Skip.NO_NEW_MESSAGES
    assert memory._runtime.services.compactors.pending() == [0, 0, 0, 0]
    assert memory.failure is None


def test_m3_a_conversations_requests_keep_their_order_on_one_actor(
    start_memory: StartMemory, model_server: ModelServer, release: threading.Event
) -> None:
    memory = start_memory(_config(model_server))
    a = _filled(memory, "a", peak=OVER)
    model_server.hang(release)
    a.commit("over the threshold", usage={"prompt_tokens": OVER})  # a compaction, told
    assert model_server.wait_for_requests(1, timeout=30)
    pool = memory._runtime.services.compactors
    assert sorted(pool.pending()) == [0, 1]
    second = _InThread(lambda: memory.compact(a))  # queues behind A's, on the same actor
    # a third conversation goes to the free one, not behind A
    b = _filled(memory, "b", peak=None)
    assert memory.compact(b).reason == "cold"
    assert second.blocked
    release.set()
    second.thread.join(60)
    assert second.result and second.result[0].status in ("skipped", "failed", "compacted")


def test_m3_k4_a_compaction_overtaken_by_slash_new_is_dropped_not_written(
    start_memory: StartMemory, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two compactions of one conversation, or a compaction and a ``/new``, may overlap (a
    restarted Compactor, another process): the write checks that the window did not move
    since the compaction read it, and a late summary never brings back a cleared window."""
    memory = start_memory(_config(model_server))
    conv = _filled(memory, "a", peak=OVER)
    real_complete = compacting.llm.complete

    def complete_then_new(*args: Any, **keywords: Any) -> Any:
        answer = real_complete(*args, **keywords)
        assert conv.handle_command("/new") is not None  # lands while the summary was made
        return answer

    monkeypatch.setattr(compacting.llm, "complete", complete_then_new)
    model_server.reply("A summary of the harbour questions.")
    result = memory.compact(conv)
    assert (result.status, result.reason) == ("skipped", "moved")
    assert conv.history() == []  # the fresh window of /new
    with reading(memory.home.root) as reads:
        stored = reads.messages(conv.key)
    assert all(m.kind != "checkpoint" for m in stored)
