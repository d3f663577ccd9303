"""Fresh across processes (M4): a window read sees what any process committed.

Several workers serve one chat: consecutive messages of a conversation land on different
hosts, each with its own ConversationStore caching the window. Before answering a
``History``, the actor reads the conversation's window mark (migration 4's
``window_version``, moved by every message stored and every move of the window, by any
process) and reads again only what changed.

- Another host's append is in this host's next history; its ``/clear``, ``/new`` and
  compaction move this host's window too. (On the code before M4, a live actor served its
  cache until it went idle: each of these failed.)
- Cheap: a history of an unchanged conversation costs one primary-key read, writes of
  other conversations or of memory rows never make it read more, and appends elsewhere
  are read alone, not the whole window.
- A hypothesis state machine drives two hosts, this process and a real second process
  (``tests/soak/window_host.py``, forked by the shared zygote), through appends, ``/clear``,
  ``/new`` and compactions on either, and after every step checks that each host's
  history equals the window SQLite holds, read on a fresh connection.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from factories import StartMemory, other_process, reading, upsert
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from model_server import ModelServer
from rig import Rig
from soak import window_host
from soak.zygote import Child, Zygote

from fermix.actors.conversation import Appended, Reload
from fermix.api import Conversation, Memory
from fermix.config import Config, MemoryConfig
from fermix.model import ConversationKey, Message, NewMessage
from fermix.runtime.windows import Windows as _Windows
from fermix.runtime.writer import Writer
from fermix.storage import Storage
from fermix.storage.sqlite import migrations
from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.migrations import open_database

KEY = ConversationKey(window_host.AGENT, "chat", window_host.CHAT)
ANSWER_S = 60.0


def conversation(memory: Memory) -> Conversation:
    return window_host.conversation(memory)


def contents(window: list[Message]) -> list[str]:
    return [m.content for m in window]


def sqlite_window(home: Path, limit: int | None = None) -> list[Message]:
    """The window of the shared conversation as SQLite holds it, on a fresh connection."""
    with reading(home) as reads:
        return reads.window(KEY, limit=limit)


@pytest.fixture
def hosts(start_memory: StartMemory) -> tuple[Memory, Memory]:
    """Two hosts on one home: each its own database connections, writer and actors."""
    return start_memory(), start_memory()


# -- another host's writes reach this host's next history --------------------------------


def test_m4_an_append_by_another_host_is_in_this_hosts_next_history(
    hosts: tuple[Memory, Memory], home: Path
) -> None:
    one, two = (conversation(memory) for memory in hosts)
    one.append_user("I am Ana")
    assert contents(one.history()) == ["I am Ana"]  # its actor is live and holds the window
    two.append_user("I live in Porto")  # the next message of the chat, on the other worker
    assert contents(one.history()) == ["I am Ana", "I live in Porto"]
    one.append_assistant("Hello Ana from Porto")
    assert contents(two.history()) == ["I am Ana", "I live in Porto", "Hello Ana from Porto"]
    assert one.history() == two.history() == sqlite_window(home)


@pytest.mark.parametrize("command", ["/clear", "/new"])
def test_m4_a_clear_by_another_host_empties_this_hosts_window(
    hosts: tuple[Memory, Memory], home: Path, command: str
) -> None:
    one, two = (conversation(memory) for memory in hosts)
    one.append_user("my old secret")
    assert contents(one.history()) == ["my old secret"]
    assert two.handle_command(command) is not None
    assert one.history() == []
    one.append_user("a fresh start")
    assert contents(one.history()) == contents(two.history()) == ["a fresh start"]
    assert one.history() == sqlite_window(home)


def test_m4_a_compaction_by_another_host_is_in_this_hosts_next_history(
    start_memory: StartMemory, model_server: ModelServer, home: Path
) -> None:
    config = window_host.config(model_server.url, None)
    one, two = (conversation(start_memory(config)) for _ in range(2))
    for i in range(12):
        one.append_user(f"message {i}: I keep asking about the harbour in Porto in May")
    assert len(one.history()) == 12
    model_server.reply("Ana asked about the harbour in Porto.")
    assert two.handle_command("/compact") is not None
    window = one.history()
    assert window[0].kind == "checkpoint" and len(window) < 13
    assert window == two.history() == sqlite_window(home)


# -- cheaply: what each history reads -----------------------------------------------------


class CountingWindows:
    """The runtime's ``WindowSource`` on a database, recording which read each call made."""

    def __init__(self, db: Storage) -> None:
        self._windows = _Windows(db)
        self.calls: list[str] = []

    def state(self, key: ConversationKey) -> Any:
        self.calls.append("state")
        return self._windows.state(key)

    def snapshot(self, key: ConversationKey, limit: int | None) -> Any:
        self.calls.append("snapshot")
        return self._windows.snapshot(key, limit)

    def mark(self, key: ConversationKey) -> Any:
        self.calls.append("mark")
        return self._windows.mark(key)

    def since(
        self, key: ConversationKey, after: Message | None, after_id: int, limit: int | None
    ) -> Any:
        self.calls.append("since")
        return self._windows.since(key, after, after_id, limit)

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


class FreshnessRig(Rig):
    """The shared rig started on ``root``, its conversation actors reading through
    :class:`CountingWindows`, beside the write path of a second process on the same file."""

    def __init__(self, root: Path, other: Writer, *, max_history: int | None = None) -> None:
        self.source: CountingWindows | None = None
        config = Config(memory=MemoryConfig(max_conversation_history=max_history))
        super().__init__(root, config, windows=self._counting)
        self.start()
        self.other = other
        self.root = root

    def _counting(self, db: Storage) -> CountingWindows:
        self.source = CountingWindows(db)
        return self.source

    @property
    def calls(self) -> CountingWindows:
        assert self.source is not None
        return self.source

    def append(self, text: str, key: ConversationKey = KEY) -> Message:
        return self.say(key, text, owner_id="ana")

    def append_elsewhere(self, text: str, key: ConversationKey = KEY) -> Message:
        return self.other.append(NewMessage(key, "user", text, owner_id="ana"), trust="operator")

    def clear_elsewhere(self) -> None:
        def clear(writes: Any) -> None:
            newest = writes.messages(KEY, limit=1, newest=True)
            writes.update_conversation(KEY, window_after_id=newest[0].id if newest else 0)

        self.other.write(clear, label="clear")

    def contents(self) -> list[str]:
        return contents(self.history(KEY))

    def stored(self) -> list[str]:
        return contents(self.window(KEY))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[FreshnessRig]:
    with other_process(tmp_path) as other:
        made = FreshnessRig(tmp_path, other)
        yield made
        made.close()


def test_m4_a_history_of_an_unchanged_conversation_reads_one_mark(rig: FreshnessRig) -> None:
    rig.append("one")
    rig.contents()
    rig.calls.take()
    assert rig.contents() == ["one"]
    assert rig.contents() == ["one"]
    assert rig.calls.take() == ["mark", "mark"]


def test_m4_appends_of_this_process_are_taken_from_appended_without_reading_them(
    rig: FreshnessRig,
) -> None:
    rig.append("one")
    rig.contents()
    rig.calls.take()
    rig.append("two")
    rig.append("three")
    assert rig.contents() == ["one", "two", "three"]
    assert rig.calls.take() == ["mark"]
    rig.ask(KEY, Appended(rig.append("four")))  # delivered twice: added once
    assert rig.contents() == rig.stored() == ["one", "two", "three", "four"]


def test_m4_writes_of_other_conversations_and_memory_rows_never_make_a_history_read_more(
    rig: FreshnessRig,
) -> None:
    rig.append("mine")
    rig.contents()
    rig.calls.take()
    rig.append_elsewhere("theirs", ConversationKey("fresh", "chat", "other"))
    rig.append("also mine", ConversationKey("fresh", "chat", "other"))
    rig.other.write(lambda w: w.update_conversation(KEY, peak_prompt_tokens=900), label="peak")
    rig.other.write(lambda w: w.touch_conversation(KEY, owner_id="bo", trust="guest"), label="t")
    rig.other.write_rows(lambda w: [upsert(w, "drink", "tea")], label="a memory row")
    assert rig.contents() == ["mine"]
    assert rig.calls.take() == ["mark"]


def test_m4_appends_by_another_process_are_read_alone_and_interleave_with_ours(
    rig: FreshnessRig,
) -> None:
    rig.append("a")
    rig.contents()
    rig.calls.take()
    rig.append_elsewhere("b")
    assert rig.contents() == ["a", "b"]
    assert rig.calls.take() == ["mark", "since"]
    rig.append("c")
    rig.append_elsewhere("d")
    rig.append("e")  # Appended holds c and e; d is read, and c and e are not doubled
    assert rig.contents() == rig.stored() == ["a", "b", "c", "d", "e"]
    assert rig.calls.take() == ["mark", "since"]
    assert rig.contents() == ["a", "b", "c", "d", "e"]
    assert rig.calls.take() == ["mark"]


def test_m4_a_window_moved_by_another_process_is_read_again_whole(rig: FreshnessRig) -> None:
    rig.append("a")
    rig.contents()
    rig.calls.take()
    rig.clear_elsewhere()
    rig.append("b")
    assert rig.contents() == rig.stored() == ["b"]
    assert rig.calls.take() == ["mark", "snapshot"]


def test_m4_a_message_edited_outside_fermix_is_read_again(rig: FreshnessRig) -> None:
    first = rig.append("I drink coffee")
    rig.contents()
    conn = apsw.Connection(str(rig.root / "memory.db"))
    conn.execute("UPDATE messages SET content = 'I drink tea' WHERE id = ?", (first.id,))
    conn.close()
    rig.append_elsewhere("since Monday")  # one new message: the count says one more changed
    assert rig.contents() == rig.stored() == ["I drink tea", "since Monday"]


def test_m4_a_capped_window_keeps_the_checkpoint_at_its_head_as_sqlite_does(
    tmp_path: Path,
) -> None:
    with other_process(tmp_path) as other:
        rig = FreshnessRig(tmp_path, other, max_history=3)
        try:
            stored = [rig.append(f"m{i}") for i in range(4)]

            def compact(writes: Any) -> None:
                checkpoint = writes.insert_message(
                    NewMessage(KEY, "assistant", "summary", kind="checkpoint")
                )
                writes.update_conversation(
                    KEY, window_after_id=stored[1].id, checkpoint_message_id=checkpoint.id
                )

            rig.other.write(compact, label="compaction")
            assert rig.contents() == ["summary", "m2", "m3"]
            for text in ("m4", "m5"):
                rig.append(text)
                assert rig.contents()[0] == "summary"
            rig.append_elsewhere("m6")
            with rig.db.read() as reads:
                assert rig.contents() == contents(reads.window(KEY, limit=3))
            assert rig.contents() == ["summary", "m5", "m6"]
            rig.ask(KEY, Reload())
            assert rig.contents() == ["summary", "m5", "m6"]
        finally:
            rig.close()


# -- migration 4 on an existing database --------------------------------------------------


def test_m4_migration_4_counts_the_stored_messages_of_existing_conversations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "memory.db"
    shipped = migrations.migrations()
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "migrations", lambda: shipped[:3])
        conn = open_database(path)
        for chat, count in (("a", 3), ("b", 0)):
            conn.execute(
                "INSERT INTO conversations (agent_id, channel, chat_id, created_at, updated_at)"
                " VALUES ('fresh', 'chat', ?, 0, 0)",
                (chat,),
            )
            for i in range(count):
                conn.execute(
                    "INSERT INTO messages (agent_id, channel, chat_id, role, content, created_at)"
                    " VALUES ('fresh', 'chat', ?, 'user', ?, ?)",
                    (chat, f"m{i}", i),
                )
        conn.close()
    conn = open_database(path)  # migrates to the newest version
    versions = dict(conn.execute("SELECT chat_id, window_version FROM conversations"))
    assert versions == {"a": 3, "b": 0}
    conn.close()
    db = Database(path)
    try:
        a = ConversationKey("fresh", "chat", "a")
        with db.read() as reads:
            assert reads.window_mark(a) == (3, 0, None)
        db.write(lambda w: w.insert_message(NewMessage(a, "user", "m3")), label="append")
        db.write(lambda w: w.update_conversation(a, window_after_id=2), label="clear")
        db.write(lambda w: w.update_conversation(a, peak_prompt_tokens=5), label="peak")
        with db.read() as reads:
            assert reads.window_mark(a) == (5, 2, None)
    finally:
        db.close()


# -- two hosts, two processes: a state machine --------------------------------------------


class Remote:
    """The second host, a real process (``tests/soak/window_host.py``)."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self._lines: deque[str] = deque()

    def send(self, op: str, **arguments: Any) -> None:
        self.child.send(json.dumps({"op": op, **arguments}))

    def recv(self, timeout: float = ANSWER_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self._lines:
            lines = self.child.lines(deadline)
            if not lines and (self.child.out.closed or time.monotonic() >= deadline):
                stderr = "\n".join(self.child.stderr[-40:])
                raise AssertionError(f"no answer from host {self.child.pid}: {stderr}")
            self._lines.extend(lines)
        answer: dict[str, Any] = json.loads(self._lines.popleft())
        return answer

    def call(self, op: str, **arguments: Any) -> Any:
        self.send(op, **arguments)
        answer = self.recv()
        assert "error" not in answer, answer
        return answer["ok"]

    def quit(self) -> None:
        self.send("quit")
        assert self.recv() == {"done": True}
        assert self.child.wait(30)
        self.child.drain()


def spawn(zygote: Zygote, home: Path, model_url: str, max_history: int | None) -> Remote:
    cap = "none" if max_history is None else str(max_history)
    remote = Remote(zygote.spawn("soak.window_host", [str(home), model_url, cap]))
    assert remote.recv() == {"ready": True}
    return remote


WORDS = ["Porto", "harbour", "tea", "violin", "marathon", "garden"]


class TwoHosts(RuleBasedStateMachine):
    """This process's Memory and a second process's, on one home and one conversation.

    Rules append (user or assistant), ``/clear``, ``/new`` and compact on either host, or
    run a few of those in a row with no read between (so a cache meets several changes at
    once, its own and the other's mixed). Invariant: each host's history equals the window
    SQLite holds, read on a fresh connection.
    """

    def __init__(self, zygote: Zygote, model_url: str) -> None:
        super().__init__()
        self.zygote = zygote
        self.model_url = model_url
        self.dir = tempfile.TemporaryDirectory()
        self.home = Path(self.dir.name)
        self.counter = 0
        self.memory: Memory | None = None
        self.remote: Remote | None = None
        self.max_history: int | None = None

    @initialize(max_history=st.sampled_from([None, 4]))
    def start(self, max_history: int | None) -> None:
        self.max_history = max_history
        config = window_host.config(self.model_url, max_history)
        self.memory = Memory(self.home, config=config).start()
        self.conv = conversation(self.memory)
        self.remote = spawn(self.zygote, self.home, self.model_url, max_history)

    def _do(self, host: int, op: str) -> None:
        assert self.remote is not None and self.memory is not None
        self.counter += 1
        text = f"{self.counter} {WORDS[self.counter % len(WORDS)]} " * 16  # ~50 tokens
        if op in ("user", "assistant"):
            if host == 1:
                self.conv.append(op, text)
            else:
                self.remote.call("append", role=op, text=text)
        elif op in ("/clear", "/new"):
            if host == 1:
                self.conv.handle_command(op)
            else:
                self.remote.call("command", text=op)
        elif host == 1:
            self.memory.compact(self.conv, force=True)
        else:
            self.remote.call("compact")

    HOSTS = st.sampled_from([1, 2])
    OPS = st.sampled_from(["user"] * 3 + ["assistant"] * 2 + ["/clear", "/new", "compact"])

    @rule(host=HOSTS, op=OPS)
    def one(self, host: int, op: str) -> None:
        self._do(host, op)

    @rule(steps=st.lists(st.tuples(HOSTS, OPS), min_size=2, max_size=5))
    def several(self, steps: list[tuple[int, str]]) -> None:
        for host, op in steps:
            self._do(host, op)

    @invariant()
    def each_history_equals_sqlite(self) -> None:
        if self.remote is None:
            return
        stored = sqlite_window(self.home, self.max_history)
        assert self.conv.history() == stored
        assert self.remote.call("history") == [[m.id, m.content] for m in stored]

    def teardown(self) -> None:
        try:
            if self.remote is not None:
                self.remote.quit()
        finally:
            if self.remote is not None:
                self.remote.child.close()
            if self.memory is not None:
                self.memory.close()
            self.dir.cleanup()


def test_m4_two_hosts_in_two_processes_each_read_the_window_sqlite_holds(
    zygote: Zygote, model_server: ModelServer
) -> None:
    run_state_machine_as_test(
        lambda: TwoHosts(zygote, model_server.url),
        settings=settings(max_examples=10, stateful_step_count=15, deadline=None),
    )


def test_m4_every_history_under_concurrent_appends_of_another_process_is_a_committed_window(
    zygote: Zygote, model_server: ModelServer, start_memory: StartMemory, home: Path
) -> None:
    """While the other process appends as fast as it can, every history this host reads
    holds its own appends and is a window SQLite held at some moment: a prefix of the final
    list (appends only, so every window SQLite held is one)."""
    memory = start_memory(window_host.config(model_server.url, None))
    remote = spawn(zygote, home, model_server.url, None)
    try:
        conv = conversation(memory)
        conv.append_user("start")
        seen: list[list[int]] = []
        done = threading.Event()

        def theirs() -> None:
            for i in range(150):
                remote.call("append", role="user", text=f"theirs {i}")
            done.set()

        thread = threading.Thread(target=theirs)
        thread.start()
        mine = 0
        while not done.is_set() or mine < 20:
            stored = conv.append_assistant(f"mine {mine}")
            mine += 1
            window = [m.id for m in conv.history()]
            assert window[-1] >= stored.id and stored.id in window
            seen.append(window)
        thread.join()
        final = [m.id for m in sqlite_window(home)]
        assert [m.id for m in conv.history()] == final
        assert len(final) == 1 + 150 + mine
        for window in seen:
            assert window == final[: len(window)]
    finally:
        remote.quit()
        remote.child.close()
