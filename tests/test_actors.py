"""The actor layer through the host facade: write-through, passivation, crashes (A1-A7, H1)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import apsw
import pytest
from faults import FaultVFS

from fermix import model
from fermix.actors.registry import child_id
from fermix.api import Memory
from fermix.config import Config, MemoryConfig
from fermix.errors import ActorUnavailableError, InvalidInputError, WriteFailedError
from fermix.model import ConversationKey, Scope
from fermix.storage import memories, messages, open_database

_vfs = FaultVFS("fermix-faulty-actors")


def _stored(home: Path, key: ConversationKey) -> list[str]:
    conn = open_database(home / "memory.db")
    try:
        return [m.content for m in messages.conversation(conn, key)]
    finally:
        conn.close()


def test_a1_an_acknowledged_append_is_already_in_sqlite(memory: Memory, home: Path) -> None:
    conv = memory.conversation("agent", "telegram", "1", owner_id="alice")
    stored = conv.append_user("hello")
    assert _stored(home, conv.key) == ["hello"]
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
    assert window == _stored(home, conv.key)
    assert sorted(window) == sorted(f"{n}-{i}" for n in range(6) for i in range(40))


def test_a2_max_conversation_history_bounds_the_cache_not_the_database(home: Path) -> None:
    config = Config(memory=MemoryConfig(max_conversation_history=3))
    with Memory(home, config=config) as memory:
        conv = memory.conversation("agent", "cli", "1")
        for i in range(5):
            conv.append_user(f"m{i}")
        assert [m.content for m in conv.history()] == ["m2", "m3", "m4"]
    assert _stored(home, conv.key) == [f"m{i}" for i in range(5)]


def test_a1_two_failed_writes_are_retried_and_the_message_lands_once(home: Path) -> None:
    with Memory(home, vfs=_vfs.vfs_name) as memory:
        conv = memory.conversation("agent", "cli", "1")
        conv.append_user("before")
        _vfs.plan.fail("write", times=2, suffix="-wal")
        conv.append_user("after two faults")
        assert _vfs.plan.injected >= 2
        assert [m.content for m in conv.history()] == ["before", "after two faults"]
    assert _stored(home, conv.key) == ["before", "after two faults"]


def test_a1_a_persistent_failure_is_a_typed_error_and_the_cache_does_not_hold_it(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Memory(home, vfs=_vfs.vfs_name) as memory:
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
    assert _stored(home, conv.key) == ["kept", "after"]


def test_a7_live_actors_stay_under_the_cap_and_come_back_from_sqlite(home: Path) -> None:
    with Memory(home, conversation_cap=5) as memory:
        for i in range(30):
            conv = memory.conversation("agent", "cli", str(i))
            conv.append_user(f"hello {i}")
            assert [m.content for m in conv.history()] == [f"hello {i}"]  # starts its actor
            assert memory.registry.live_count() <= 5
        assert memory.registry.passivated == 25
        again = memory.conversation("agent", "cli", "0")
        again.append_user("back")
        assert [m.content for m in again.history()] == ["hello 0", "back"]
        assert threading.active_count() < 5 + 10


def test_a7_idle_actors_are_passivated(home: Path) -> None:
    now = [0.0]
    with Memory(home, idle_s=60) as memory:
        memory.registry._clock = lambda: now[0]
        memory.conversation("agent", "cli", "old").append_user("x")
        memory.conversation("agent", "cli", "old").history()  # a read starts its actor
        now[0] = 30.0
        memory.conversation("agent", "cli", "new").history()
        now[0] = 61.0
        assert memory.registry.passivate_idle() == 1
        assert memory.registry.live_count() == 1
        assert [m.content for m in memory.conversation("agent", "cli", "old").history()] == ["x"]


def test_a6_a_crashed_conversation_actor_is_restarted_from_sqlite(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    for i in range(3):
        conv.append_user(f"m{i}")
    assert len(conv.history()) == 3  # the actor is live
    supervisor = memory._child_supervisor("conversations")
    before = supervisor.child_ref(child_id(conv.key))
    memory.registry.tell(conv.key, "not a message")  # a failing tell crashes the actor
    assert before.actor_stopped.wait(5)
    conv.append_user("after the crash")
    assert [m.content for m in conv.history()] == ["m0", "m1", "m2", "after the crash"]
    assert supervisor.child_ref(child_id(conv.key)) is not before


def test_a6_a_crashed_store_is_restarted_and_reads_stay_right(memory: Memory) -> None:
    row = memory.write(lambda c: _upsert(c, "drink", "tea"))
    store = memory.tree.child_ref("store")
    store.tell("not a message")  # type: ignore[union-attr]
    assert store.actor_stopped.wait(5)  # type: ignore[union-attr]
    assert memory.get_row(row.id) == row


def _upsert(conn: apsw.Connection, key: str, value: str) -> model.MemoryRow:
    return memories.upsert(
        conn,
        agent_id="agent",
        owner_id="alice",
        scope=Scope("owner", "alice"),
        category="preference",
        key=key,
        value=value,
        promote_target="user_md",
    )


def test_a3_the_store_serves_reads_from_cache_until_a_write(memory: Memory) -> None:
    row = memory.write(lambda c: _upsert(c, "drink", "tea"))
    assert memory.get_row(row.id) == row
    assert memory.list_rows(agent_id="agent") == [row]
    assert memory.list_rows(agent_id="agent") == [row]
    changed = memory.write(lambda c: _upsert(c, "drink", "coffee"))
    assert memory.get_row(row.id) == changed
    assert [r.value for r in memory.list_rows(agent_id="agent")] == ["coffee"]


def test_a3_a_write_by_another_process_is_seen_by_the_next_read(memory: Memory, home: Path) -> None:
    row = memory.write(lambda c: _upsert(c, "drink", "tea"))
    memory.write(lambda c: memories.archive(c, row.id, by="operator", reason="stale"))
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


def test_h1_commit_writes_the_reply_records_the_peak_and_dispatches_post_delivery(
    memory: Memory,
) -> None:
    seen: list[str] = []
    memory.on_after_delivery("probe", lambda conv: seen.append(conv.key.chat_id))
    conv = memory.conversation("agent", "cli", "1", owner_id="alice")
    conv.append_user("hi")
    reply = conv.commit("hello!", usage={"prompt_tokens": 1234, "completion_tokens": 5})
    assert reply.role == "assistant" and seen == ["1"]
    state = conv.state()
    assert state is not None and state.peak_prompt_tokens == 1234 and state.owner_id == "alice"


def test_e1_a_failing_post_delivery_hook_never_reaches_the_turn(memory: Memory) -> None:
    def broken(conv: object) -> None:
        raise RuntimeError("reviewer exploded")

    memory.on_after_delivery("broken", broken)
    conv = memory.conversation("agent", "cli", "1")
    assert conv.commit("fine").content == "fine"
    assert [m.content for m in conv.history()] == ["fine"]


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


def test_h1_a_closed_memory_refuses_work(home: Path) -> None:
    with Memory(home) as memory:
        conv = memory.conversation("agent", "cli", "1")
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
    stored = _stored(home, ConversationKey("agent", "cli", "1"))
    assert len(stored) >= len(acked) >= 20
    assert stored == [str(i) for i in range(len(stored))]
    assert len(acked) == 500 or refused


def test_a1_the_actor_refuses_a_message_of_another_conversation(memory: Memory) -> None:
    from fermix.actors.conversation import Appended

    a = memory.conversation("agent", "cli", "a")
    b = memory.conversation("agent", "cli", "b")
    stored = b.append_user("x")
    a.append_user("mine")
    with pytest.raises(InvalidInputError):
        memory.registry.ask(a.key, Appended(stored))
    assert [m.content for m in a.history()] == ["mine"]


def test_a1_a_message_the_actor_already_read_is_not_added_twice(memory: Memory) -> None:
    from fermix.actors.conversation import Appended

    conv = memory.conversation("agent", "cli", "1")
    first = conv.append_user("one")
    conv.history()  # the actor is live and holds "one"
    memory.registry.ask(conv.key, Appended(first))
    assert [m.content for m in conv.history()] == ["one"]
