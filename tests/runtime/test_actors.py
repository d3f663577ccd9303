"""The actor layer through the host facade: write-through, passivation, crashes, fresh reads
and post-delivery work (A1-A7, H1, H3, E1)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import Clock, StartMemory, config_for, other_process, stored_messages, upsert
from faults import FaultVFS
from model_server import ModelServer, failure, hanging

from fermix.actors.conversation import Appended
from fermix.api import Memory
from fermix.config import Config, MemoryConfig
from fermix.conversation import Conversation
from fermix.core.review import Skip
from fermix.errors import ActorUnavailableError, InvalidInputError, WriteFailedError
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow
from fermix.runtime.engine import Runtime
from fermix.runtime.registry import child_id

_vfs = FaultVFS("fermix-faulty-actors")


def _contents(home: Path, key: ConversationKey) -> list[str]:
    return [m.content for m in stored_messages(home, key)]


def _write_row(memory: Memory, key: str, value: str) -> MemoryRow:
    """A row written through this process's one write path (prompt files rebuilt)."""
    written = memory._runtime.services.writer.write_rows(
        lambda w: [upsert(w, key, value)], label="test write"
    )
    return written.rows[0]


def test_a1_an_acknowledged_append_is_already_in_sqlite(memory: Memory, home: Path) -> None:
    conv = memory.conversation("agent", "telegram", "1", owner_id="alice")
    stored = conv.append_user("hello")
    assert _contents(home, conv.key) == ["hello"]
    assert stored.owner_id == "alice" and stored.role == "user"
    assert [m.id for m in conv.history()] == [stored.id]


def test_a1_appends_from_many_threads_keep_one_order_in_cache_and_database(
    memory: Memory, home: Path
) -> None:
    conv = memory.conversation("agent", "telegram", "1")
    barrier = threading.Barrier(6)

    def writer(n: int) -> None:
        barrier.wait(5)
        for i in range(40):
            memory.conversation("agent", "telegram", "1").append_user(f"{n}-{i}")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    window = [m.content for m in conv.history()]
    assert window == _contents(home, conv.key)
    assert sorted(window) == sorted(f"{n}-{i}" for n in range(6) for i in range(40))


def test_a2_max_conversation_history_bounds_the_cache_not_the_database(
    start_memory: StartMemory, home: Path
) -> None:
    memory = start_memory(Config(memory=MemoryConfig(max_conversation_history=3)))
    conv = memory.conversation("agent", "cli", "1")
    for i in range(5):
        conv.append_user(f"m{i}")
    assert [m.content for m in conv.history()] == ["m2", "m3", "m4"]
    assert _contents(home, conv.key) == [f"m{i}" for i in range(5)]


def test_a1_two_failed_writes_are_retried_and_the_message_lands_once(
    start_memory: StartMemory, home: Path
) -> None:
    memory = start_memory(vfs=_vfs.vfs_name)
    conv = memory.conversation("agent", "cli", "1")
    conv.append_user("before")
    _vfs.plan.fail("write", times=2, suffix="-wal")
    conv.append_user("after two faults")
    assert _vfs.plan.injected >= 2
    assert [m.content for m in conv.history()] == ["before", "after two faults"]
    assert _contents(home, conv.key) == ["before", "after two faults"]


def test_a1_a_persistent_failure_is_a_typed_error_and_the_cache_does_not_hold_it(
    start_memory: StartMemory, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = start_memory(vfs=_vfs.vfs_name)
    conv = memory.conversation("agent", "cli", "1")
    conv.append_user("kept")
    _vfs.plan.fail("write", times=None, suffix="-wal")
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(WriteFailedError):
            conv.append_user("lost")
    finally:
        _vfs.plan.clear()
    assert "cli:1" in caplog.text  # the failure is logged with the conversation
    assert [m.content for m in conv.history()] == ["kept"]
    conv.append_user("after")
    assert [m.content for m in conv.history()] == ["kept", "after"]
    assert _contents(home, conv.key) == ["kept", "after"]


# -- passivation (A7) ---------------------------------------------------------------------


@pytest.fixture
def start_runtime(home: Path) -> Iterator[Callable[..., Runtime]]:
    """Start the private Runtime on the temporary home, for the seams Memory does not offer
    (``monotonic``: the passivation clock); each is closed after the test."""
    started: list[Runtime] = []

    def start(**keywords: object) -> Runtime:
        runtime = Runtime(Home(home), Config(), **keywords)  # type: ignore[arg-type]
        runtime.start()
        started.append(runtime)
        return runtime

    yield start
    for runtime in reversed(started):
        runtime.close()


def test_a7_live_actors_stay_under_the_cap_and_come_back_from_sqlite(
    start_memory: StartMemory,
) -> None:
    before = set(threading.enumerate())  # threads earlier tests may still be ending
    memory = start_memory(conversation_cap=5)
    registry = memory._runtime.services.registry
    for i in range(30):
        conv = memory.conversation("agent", "cli", str(i))
        conv.append_user(f"hello {i}")
        assert [m.content for m in conv.history()] == [f"hello {i}"]  # starts its actor
        assert registry.live_count() <= 5
    assert registry.passivated == 25
    again = memory.conversation("agent", "cli", "0")
    again.append_user("back")
    assert [m.content for m in again.history()] == ["hello 0", "back"]
    # the prompt-file thread lives only while first renders of new owners are queued
    steady = [
        t for t in threading.enumerate() if t not in before and t.name != "fermix-prompt-files"
    ]
    assert len(steady) < 5 + 10, sorted(t.name for t in steady)


def test_a7_actors_idle_for_idle_s_are_passivated_and_come_back_from_sqlite(
    start_runtime: Callable[..., Runtime],
) -> None:
    clock = Clock(0)
    runtime = start_runtime(idle_s=60, monotonic=clock)

    def conv(chat: str) -> Conversation:
        key = ConversationKey("agent", "cli", chat)
        return Conversation(runtime, key, owner_id="", trust="operator")

    conv("old").append_user("x")
    conv("old").history()  # a read starts its actor
    clock.advance(30)
    conv("new").history()
    clock.advance(31)
    assert runtime.services.registry.passivate_idle() == 1
    assert runtime.services.registry.live_count() == 1
    assert [m.content for m in conv("old").history()] == ["x"]


# -- supervision (A6) ---------------------------------------------------------------------


def test_a6_a_crashed_conversation_actor_is_restarted_from_sqlite(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    for i in range(3):
        conv.append_user(f"m{i}")
    assert len(conv.history()) == 3  # the actor is live
    supervisor = memory._runtime.services.tree.await_child("conversations")
    before = supervisor.child_ref(child_id(conv.key))  # type: ignore[union-attr]
    memory._runtime.services.registry.tell(conv.key, "not a message")  # a failing tell crashes it
    assert before.actor_stopped.wait(5)  # type: ignore[union-attr]
    conv.append_user("after the crash")
    assert [m.content for m in conv.history()] == ["m0", "m1", "m2", "after the crash"]
    assert supervisor.child_ref(child_id(conv.key)) is not before  # type: ignore[union-attr]


@pytest.mark.parametrize("child", ["reviewer", "compactor"])
def test_a6_a_crashed_reviewer_or_compactor_is_restarted_and_serves_the_next_request(
    memory: Memory, child: str
) -> None:
    conv = memory.conversation("agent", "cli", "1")
    tree = memory._runtime.services.tree
    before = tree.child_ref(child)
    before.tell("not a message")  # type: ignore[union-attr]
    assert before.actor_stopped.wait(5)  # type: ignore[union-attr]
    if child == "reviewer":
        assert memory.review(conv).skip is Skip.NO_NEW_MESSAGES
    else:
        assert memory.compact(conv).reason == "cold"
    assert tree.child_ref(child) is not before


# -- memory rows are read fresh: no cache to go stale (A3, S1) ----------------------------


def test_a3_memory_reads_see_a_write_by_another_connection_at_once(
    memory: Memory, home: Path
) -> None:
    row = _write_row(memory, "drink", "tea")
    assert memory.get_row(row.id) == row
    assert memory.list_rows(agent_id="agent") == [row]
    with other_process(home) as other:
        changed = other.write_rows(
            lambda w: [upsert(w, "drink", "coffee")], label="another process"
        ).rows[0]
        assert memory.get_row(row.id) == changed
        assert [r.value for r in memory.list_rows(agent_id="agent")] == ["coffee"]
        # plain db writes too, which rebuild no prompt files
        other.write(lambda w: w.archive_row(row.id, by="operator", reason="stale"), label="archive")
        assert memory.list_rows(agent_id="agent") == []
        archived = memory.get_row(row.id)
        assert archived is not None and archived.archived_by == "operator"
    again = _write_row(memory, "drink", "green tea")  # writing it again brings it back
    assert again.id == row.id and memory.get_row(row.id) == again


def test_a3_a_restore_by_the_cli_process_is_seen_by_the_next_read(
    memory: Memory, home: Path
) -> None:
    row = _write_row(memory, "drink", "tea")
    memory._runtime.services.writer.write_rows(
        lambda w: [w.archive_row(row.id, by="operator", reason="stale")], label="archive"
    )
    assert memory.list_rows(agent_id="agent") == []
    cli = subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), "memory", "restore", str(row.id)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert [r.id for r in memory.list_rows(agent_id="agent")] == [row.id]
    fresh = memory.get_row(row.id)
    assert fresh is not None and fresh.archived_at is None


# -- the turn and its post-delivery work (H1, E1, A4, A5) ----------------------------------

WINDOW = 2_000
OVER_THRESHOLD = 1_900  # over compaction's 0.85 of WINDOW


def _busy_conversation(memory: Memory) -> Conversation:
    """A conversation with enough history for a compaction to summarize some of it."""
    conv = memory.conversation("agent", "cli", "1", owner_id="alice")
    for i in range(30):
        conv.append_user(f"question {i} about the harbour in Porto and its boats")
        conv.append_assistant(f"answer {i}: the harbour in Porto is busy in May")
    return conv


def test_h1_commit_writes_the_reply_records_the_peak_and_dispatches_reviewer_and_compactor(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    release = threading.Event()
    model_server.default = hanging(release)  # both stay in flight until released
    config = config_for(model_server, context_window=WINDOW, memory=MemoryConfig())
    memory = start_memory(config)
    conv = _busy_conversation(memory)
    conv.append_user("hi")
    try:
        reply = conv.commit(
            "hello!", usage={"prompt_tokens": OVER_THRESHOLD, "completion_tokens": 5}
        )
        assert reply.role == "assistant" and reply.content == "hello!"
        assert model_server.wait_for_requests(2, timeout=60)
        calls = sorted(
            "review" if "response_format" in r else "compaction" for r in model_server.requests[:2]
        )
        assert calls == ["compaction", "review"]
        state = conv.state()  # the compaction, still waiting for the model, kept the peak
        assert state is not None and state.owner_id == "alice"
        assert state.peak_prompt_tokens == OVER_THRESHOLD
        assert conv.history()[-1] == reply
    finally:
        release.set()


def test_e1_a_failing_post_delivery_review_and_compaction_never_reach_the_turn(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    model_server.default = failure(500)
    config = config_for(model_server, context_window=WINDOW, memory=MemoryConfig())
    memory = start_memory(config)
    conv = _busy_conversation(memory)
    conv.append_user("hi")
    assert conv.commit("fine", usage={"prompt_tokens": OVER_THRESHOLD}).content == "fine"
    assert model_server.wait_for_requests(2, timeout=60)  # both called the model, and failed
    conv.append_user("next turn")
    assert conv.commit("still fine").content == "still fine"
    # asked after the post-delivery work, so answered after it failed
    assert memory.review(conv, force=False).skip is Skip.FAILURE_BACKOFF
    assert memory.compact(conv).reason == "failure_backoff"
    window = [m.content for m in conv.history()]
    assert window[-4:] == ["hi", "fine", "next turn", "still fine"] and len(window) == 64
    assert memory.list_rows(agent_id="agent") == []


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("agent", "cli", ""), {}),
        (("agent", "cli", "1"), {"trust": "root"}),
        (("agent\x00", "cli", "1"), {}),
        (("agent", "cli", "1"), {"owner_id": "a" * 500}),
    ],
)
def test_h3_bad_conversation_arguments_are_typed_errors(
    memory: Memory, args: tuple[str, ...], kwargs: dict[str, str]
) -> None:
    with pytest.raises(InvalidInputError):
        memory.conversation(*args, **kwargs)


def test_h3_a_bad_usage_is_refused_before_the_reply_is_written(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    with pytest.raises(InvalidInputError):
        conv.commit("reply", usage={"prompt_tokens": -1})
    assert conv.history() == []


def test_h1_a_closed_memory_refuses_work(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    memory.close()
    with pytest.raises(ActorUnavailableError):
        conv.append_user("too late")


def test_h1_close_waits_for_writes_in_flight(home: Path) -> None:
    memory = Memory(home).start()
    progress = threading.Event()
    acked: list[int] = []
    refused: list[ActorUnavailableError] = []

    def writer() -> None:
        conv = memory.conversation("agent", "cli", "1")
        try:
            for i in range(500):
                acked.append(conv.append_user(str(i)).id)
                if len(acked) == 20:
                    progress.set()
        except ActorUnavailableError as exc:
            refused.append(exc)  # the tree stopped: later appends are refused, not half-written

    thread = threading.Thread(target=writer)
    thread.start()
    assert progress.wait(10)
    memory.close()
    thread.join(10)
    stored = _contents(home, ConversationKey("agent", "cli", "1"))
    assert len(stored) >= len(acked) >= 20
    assert stored == [str(i) for i in range(len(stored))]
    assert len(acked) == 500 or refused


def test_a1_the_actor_refuses_a_message_of_another_conversation(memory: Memory) -> None:
    a = memory.conversation("agent", "cli", "a")
    b = memory.conversation("agent", "cli", "b")
    stored = b.append_user("x")
    a.append_user("mine")
    with pytest.raises(InvalidInputError):
        memory._runtime.services.registry.ask(a.key, Appended(stored))
    assert [m.content for m in a.history()] == ["mine"]


def test_a1_a_message_the_actor_already_read_is_not_added_twice(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    first = conv.append_user("one")
    conv.history()  # the actor is live and holds "one"
    memory._runtime.services.registry.ask(conv.key, Appended(first))
    assert [m.content for m in conv.history()] == ["one"]
