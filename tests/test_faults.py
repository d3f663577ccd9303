"""Injected faults at every write path, and crashes in every actor kind (S1, S2, A1, A3, A6,
E6, P2, H3).

``tests/faults.py``'s VFS makes chosen writes, syncs and locks of the database files fail:
an I/O error (``apsw.IOError``), a full disk (``apsw.FullError``) or a lock held elsewhere
(``apsw.BusyError``). At each write path (an append, a review's memory apply, the prompt
file rebuild that records a revision, a migration) a transient fault (one or two failures)
must be absorbed, and a persistent one must reach the caller as a typed
:class:`~fermix.errors.FermixError`, never as a raw apsw error or a crash of the tree. In
every case the database, the caches (a conversation's window, the Store's rows) and the
prompt files agree afterwards. Then every actor kind is crashed: the supervisor restores
service, and past the restart intensity the tree gives up as designed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from faults import FaultVFS
from model_server import ModelServer

from fermix import doctor, model
from fermix.actors.registry import child_id
from fermix.actors.reviewer import CLAIM_TTL_MS
from fermix.api import Conversation, Memory
from fermix.clock import now_ms
from fermix.config import Config, MemoryConfig, ModelConfig
from fermix.core import categories
from fermix.core import review as review_rules
from fermix.errors import (
    ActorUnavailableError,
    FermixError,
    StorageError,
    SupervisorEscalationError,
    WriteFailedError,
)
from fermix.home import Home
from fermix.model import Scope
from fermix.runtime import prompt_files, repair
from fermix.storage import connection, conversations, memories, messages, migrations
from fermix.storage import open_database as open_db
from fermix.storage.connection import fetch_rows, fetch_value, raw_connect

_vfs = FaultVFS("fermix-faulty-faults")
VFS = _vfs.vfs_name
MODEL = "openai/faults"
SHORT_BUSY_MS = 300
"""Each connection's busy timeout here: a lock that is never released costs the committer's
three attempts about a second, not fifteen."""
BUSY_HOLD_S = 0.05
"""How long a transient lock holder keeps the write lock: well under one busy timeout."""


class Fault:
    """One kind of fault at the write path under test, armed for ``times`` failures.

    ``io-error`` and ``disk-full`` fail writes to the WAL through the fault VFS. ``busy`` is
    another connection (as a second host or the CLI would) holding the write lock: in WAL
    mode a connection keeps its file lock, so only another writer can make it wait; a
    transient holder lets go after ``BUSY_HOLD_S``, a persistent one when cleared.
    """

    def __init__(self, kind: str, db_path: Path) -> None:
        self.kind = kind
        self.db_path = db_path
        self._holder: apsw.Connection | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def arm(self, times: int | None) -> None:
        """Fail the next ``times`` writes (None: until :meth:`clear`)."""
        if self.kind == "busy":
            holder = raw_connect(self.db_path)
            holder.execute("BEGIN IMMEDIATE")
            with self._lock:
                self._holder = holder
            if times is not None:
                self._timer = threading.Timer(BUSY_HOLD_S, self._release, args=(holder,))
                self._timer.start()
            return
        error = apsw.IOError if self.kind == "io-error" else apsw.FullError
        _vfs.plan.fail("write", times=times, error=error, suffix="-wal")

    def clear(self) -> None:
        """No more failures: disarm the VFS, let go of the lock."""
        _vfs.plan.clear()
        if self._holder is not None:
            self._release(self._holder)

    def _release(self, holder: apsw.Connection) -> None:
        with self._lock:
            if self._holder is not holder:
                return  # released already
            self._holder = None
        holder.execute("ROLLBACK")
        holder.close()

    def close(self) -> None:
        """Clear, and wait for a pending release."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(5)
        self.clear()

    def assert_absorbed(self) -> None:
        """The two failures armed happened (a lock holder's wait cannot be counted)."""
        if self.kind != "busy":
            assert _vfs.plan.injected == 2


@pytest.fixture(autouse=True)
def _no_fault_left() -> Iterator[None]:
    """Every test starts and ends with no fault armed, and counts its own faults."""
    _vfs.plan.clear()
    _vfs.plan.injected = 0
    yield
    _vfs.plan.clear()


@pytest.fixture(autouse=True)
def _short_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections opened from now on wait ``SHORT_BUSY_MS`` for a lock, not 5 s."""
    monkeypatch.setattr(
        connection, "set_busy_timeout", lambda conn, ms=SHORT_BUSY_MS: conn.set_busy_timeout(ms)
    )


@pytest.fixture(params=["io-error", "disk-full", "busy"])
def fault(request: pytest.FixtureRequest, home: Path) -> Iterator[Fault]:
    """Each kind of write fault, on the home's database."""
    injected = Fault(request.param, home / "memory.db")
    yield injected
    injected.close()


def config_for(server: ModelServer) -> Config:
    """The loopback model route; background review off, so only explicit reviews run."""
    return Config(
        memory=MemoryConfig(review_interval_hours=0),
        model=ModelConfig(primary=MODEL, api_base=server.url, timeout_s=10),
    )


def ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"operations": list(operations)}


def add(category: str, key: str, value: str) -> dict[str, Any]:
    return {"op": "add", "category": category, "key": key, "value": value}


def arm_when(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, fault: Fault, times: int | None
) -> list[int]:
    """Arm ``fault`` the first time ``owner.name`` is called (a seam between two steps of a
    write path); returns a list that records the arming."""
    original: Callable[..., Any] = getattr(owner, name)
    armed: list[int] = []

    def arming(*args: Any, **kwargs: Any) -> Any:
        if not armed:
            armed.append(1)
            fault.arm(times)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, arming)
    return armed


# -- checking that the database, the caches and the files agree -------------------------


def assert_consistent(memory: Memory, home: Path, *convs: Conversation) -> None:
    """Database, conversation windows, the Store's rows and the prompt files agree."""
    conn = open_db(home / "memory.db")
    try:
        for conv in convs:
            stored = [m.content for m in conversations.window(conn, conv.key)]
            assert [m.content for m in conv.history()] == stored
            contents = [m.content for m in messages.conversation(conn, conv.key)]
            assert len(contents) == len(set(contents)), "a message was stored twice"
        rows = memories.list_rows(conn, archived=None)
        assert memory.list_rows(archived=None) == rows
        for row in rows:
            assert memory.get_row(row.id) == row
        for table in doctor.FTS_TABLES:
            conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")
        _, stale = doctor.stale_prompt_files(conn, Home(home))
        assert not stale, f"prompt files differ from a fresh render: {stale}"
        for agent_id, owner_id, name, content in _current_revisions(conn):
            path = prompt_files.file_path(Home(home), agent_id, name, owner_id)
            on_disk = path.read_text(encoding="utf-8") if path.exists() else ""
            assert on_disk == content, f"{path} is not its current revision"
    finally:
        conn.close()


def _current_revisions(conn: apsw.Connection) -> list[tuple[str, str, str, str]]:
    return [
        (str(a), str(o), str(n), str(c))
        for a, o, n, c in fetch_rows(
            conn,
            "SELECT s.agent_id, s.owner_id, s.name, r.content FROM resources AS s"
            " JOIN resource_revisions AS r"
            " ON r.resource_id = s.id AND r.revision = s.current_revision",
        )
    ]


def stored_contents(home: Path, conv: Conversation) -> list[str]:
    conn = open_db(home / "memory.db")
    try:
        return [m.content for m in messages.conversation(conn, conv.key)]
    finally:
        conn.close()


def state_of(home: Path, conv: Conversation) -> model.ConversationState:
    conn = open_db(home / "memory.db")
    try:
        state = conversations.get(conn, conv.key)
    finally:
        conn.close()
    assert state is not None
    return state


# -- append (A1) ------------------------------------------------------------------------


def test_a1_two_faults_on_an_append_are_absorbed_and_it_lands_once(
    home: Path, fault: Fault
) -> None:
    with Memory(home, vfs=VFS) as memory:
        conv = memory.conversation("agent", "faults", "1")
        conv.append_user("before")
        fault.arm(2)
        conv.append_user("after two faults")
        fault.assert_absorbed()
        assert [m.content for m in conv.history()] == ["before", "after two faults"]
        assert_consistent(memory, home, conv)


def test_a1_h3_a_persistent_fault_on_an_append_is_a_typed_error_and_nothing_is_kept(
    home: Path, fault: Fault
) -> None:
    with Memory(home, vfs=VFS) as memory:
        conv = memory.conversation("agent", "faults", "1")
        conv.append_user("kept")
        fault.arm(None)
        try:
            with pytest.raises(WriteFailedError):
                conv.append_user("lost")
        finally:
            fault.clear()
        assert [m.content for m in conv.history()] == ["kept"]
        conv.append_user("after")
        assert stored_contents(home, conv) == ["kept", "after"]
        assert_consistent(memory, home, conv)


# -- memory writes through the Store (A3, T1) -----------------------------------------------


def _store_call(key: str, value: str) -> dict[str, Any]:
    arguments = json.dumps({"key": key, "value": value})
    return {"id": "call_1", "function": {"name": "memory_store", "arguments": arguments}}


def test_a3_t1_memory_writes_absorb_two_faults_and_report_a_persistent_one_typed(
    home: Path, fault: Fault
) -> None:
    with Memory(home, vfs=VFS) as memory:
        conv = memory.conversation("agent", "faults", "1", owner_id="ana")
        fault.arm(2)
        stored = json.loads(memory.tools.run(_store_call("flight", "Friday"), conv))
        assert stored["stored"]["value"] == "Friday"
        assert [r.value for r in memory.list_rows(key="flight")] == ["Friday"]

        fault.close()  # a transient lock holder may still hold on
        fault.arm(None)
        try:
            # The tool never raises into the host: the failure is its result (T4).
            refused = json.loads(memory.tools.run(_store_call("flight", "Monday"), conv))
            with pytest.raises(WriteFailedError):
                memory.write(
                    lambda c: memories.upsert(
                        c,
                        agent_id="agent",
                        owner_id="ana",
                        scope=Scope("owner", "ana"),
                        category="goal",
                        key="marathon",
                        value="Runs a marathon in May",
                        promote_target=None,
                    )
                )
        finally:
            fault.clear()
        assert "not written" in refused["error"]
        assert [r.value for r in memory.list_rows(key="flight")] == ["Friday"]
        assert memory.list_rows(key="marathon") == []
        assert_consistent(memory, home, conv)


def test_h3_a_units_own_database_error_reaches_its_caller_typed(memory: Memory) -> None:
    def broken(conn: apsw.Connection) -> None:
        conn.execute("INSERT INTO memory_changes (id, counter) VALUES (1, 0)")  # taken id

    with pytest.raises(WriteFailedError) as caught:
        memory.write(broken)
    assert isinstance(caught.value.__cause__, apsw.ConstraintError)


# -- the memory apply of a review (E6) ---------------------------------------------------


@pytest.fixture
def reviewing(home: Path, model_server: ModelServer) -> Iterator[Memory]:
    with Memory(home, config=config_for(model_server), vfs=VFS) as memory:
        yield memory


def test_e6_two_faults_on_a_reviews_apply_are_absorbed(
    reviewing: Memory,
    model_server: ModelServer,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Fault,
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I am Ana and I drink green tea")
    model_server.reply_json(ops(add("preference", "drink", "Drinks green tea")))
    armed = arm_when(monkeypatch, review_rules, "parse", fault, times=2)
    result = reviewing.review(conv)
    assert armed
    fault.assert_absorbed()
    assert result.status == "applied", result.error
    assert [r.value for r in reviewing.list_rows(key="drink")] == ["Drinks green tea"]
    state = state_of(home, conv)
    assert state.review_claim_token is None and state.last_reviewed_message_id > 0
    assert "green tea" in prompt_files.read_files(Home(home), "agent", "ana")[0]
    assert_consistent(reviewing, home, conv)


def test_e6_h3_a_persistent_fault_on_a_reviews_apply_fails_the_review_typed_and_writes_nothing(
    reviewing: Memory,
    model_server: ModelServer,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Fault,
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I am Ana and I drink green tea")
    model_server.reply_json(ops(add("preference", "drink", "Drinks green tea")))
    arm_when(monkeypatch, review_rules, "parse", fault, times=None)
    try:
        result = reviewing.review(conv)
    finally:
        fault.clear()
    assert result.status == "failed"
    assert result.error is not None and "not written" in result.error
    assert reviewing.list_rows(archived=None) == []
    assert_consistent(reviewing, home, conv)

    # The failure could not even be recorded, so the claim is held until it expires: a
    # review after that takes it over and completes (E2).
    state = state_of(home, conv)
    if state.review_claim_token is not None:
        assert state.review_claim_expires_at is not None
        assert state.review_claim_expires_at <= now_ms() + CLAIM_TTL_MS
        later = state.review_claim_expires_at
        reviewing.review_context.clock = lambda: later
    model_server.reply_json(ops(add("preference", "drink", "Drinks green tea")))
    again = reviewing.review(conv)
    assert again.status == "applied", again
    assert [r.value for r in reviewing.list_rows(key="drink")] == ["Drinks green tea"]
    assert_consistent(reviewing, home, conv)


# -- the prompt-file rebuild and its revision (C5, P2) -----------------------------------


def test_p2_two_faults_on_the_rebuild_are_absorbed_and_file_and_revision_agree(
    reviewing: Memory,
    model_server: ModelServer,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Fault,
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I live in Porto")
    model_server.reply_json(ops(add("identity", "city", "Lives in Porto")))
    armed = arm_when(monkeypatch, prompt_files, "rebuild_for_rows", fault, times=2)
    result = reviewing.review(conv)
    assert armed
    fault.assert_absorbed()
    assert result.status == "applied" and result.files_changed, result
    assert "Porto" in prompt_files.read_files(Home(home), "agent", "ana")[0]
    assert_consistent(reviewing, home, conv)


def test_p2_a_persistent_fault_on_the_rebuild_keeps_the_rows_and_the_next_review_repairs_files(
    reviewing: Memory,
    model_server: ModelServer,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Fault,
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I live in Porto")
    model_server.reply_json(ops(add("identity", "city", "Lives in Porto")))
    arm_when(monkeypatch, prompt_files, "rebuild_for_rows", fault, times=None)
    try:
        result = reviewing.review(conv)
    finally:
        fault.clear()
    # The rows were committed before the rebuild: the review applied, its files lag.
    assert result.status == "applied"
    assert result.error is not None and "prompt files" in result.error
    assert [r.value for r in reviewing.list_rows(key="city")] == ["Lives in Porto"]
    # Any later review repairs them, even one with nothing to review.
    other = reviewing.conversation("agent", "faults", "2", owner_id="bob")
    assert reviewing.review(other).status == "skipped"
    assert "Porto" in prompt_files.read_files(Home(home), "agent", "ana")[0]
    assert_consistent(reviewing, home, conv)


def settled(memory: Memory) -> None:
    """Return once the Reviewer has started: its start repairs stale prompt files."""
    assert memory.review(memory.conversation("probe", "probe", "probe")).status == "skipped"


def test_c5_s1_prompt_files_left_behind_their_rows_are_repaired_when_the_reviewer_starts(
    home: Path,
) -> None:
    """As after a crash between a review's commit and its rebuild."""
    with Memory(home) as memory:
        conv = memory.conversation("agent", "faults", "1", owner_id="ana")
        memory.write(
            lambda c: memories.upsert(
                c,
                agent_id="agent",
                owner_id="ana",
                scope=Scope("owner", "ana"),
                category="identity",
                key="city",
                value="Lives in Porto",
                promote_target="user_md",
            )
        )
    conn = open_db(home / "memory.db")
    try:
        _, stale = doctor.stale_prompt_files(conn, Home(home))
    finally:
        conn.close()
    assert stale  # memory.write does not render: the files lag like after a crash
    with Memory(home) as memory:
        settled(memory)
        assert "Porto" in prompt_files.read_files(Home(home), "agent", "ana")[0]
        assert_consistent(memory, home, memory.conversation(*conv.key.as_tuple()))


def test_c5_an_old_temporary_file_of_a_killed_write_is_removed_at_start_a_new_one_kept(
    home: Path,
) -> None:
    folder = home / "memory" / "agent"
    folder.mkdir(parents=True)
    old, new = folder / ".USER.md.killed.tmp", folder / ".MEMORY.md.writing.tmp"
    for path in (old, new):
        path.write_text("half a file")
    hour_ago = time.time() - repair.TEMP_GRACE_S - 1
    os.utime(old, (hour_ago, hour_ago))
    with Memory(home) as memory:
        settled(memory)
        assert not old.exists()
        assert new.exists()  # may belong to another process writing right now


def test_p2_a_rollback_is_kept_by_the_repair_at_start(home: Path) -> None:
    """The repair at start restores derived files, not an operator's rollback (P2)."""
    with Memory(home) as memory:
        for value in ("Lives in Porto", "Lives in Lisbon"):
            row = memory.write(
                lambda c, value=value: memories.upsert(
                    c,
                    agent_id="agent",
                    owner_id="",
                    scope=categories.owner_scope(""),
                    category="identity",
                    key="city",
                    value=value,
                    promote_target="user_md",
                )
            )
            conn = open_db(home / "memory.db")
            try:
                prompt_files.rebuild_for_rows(conn, Home(home), [row])
            finally:
                conn.close()
    conn = open_db(home / "memory.db")
    try:
        prompt_files.rollback(conn, Home(home), "agent", "user_md", 1)
    finally:
        conn.close()
    with Memory(home) as memory:
        settled(memory)
        assert "Porto" in prompt_files.read_files(Home(home), "agent")[0]


# -- migrations (S2) ----------------------------------------------------------------------


def _schema(conn: apsw.Connection) -> set[tuple[str, str]]:
    return {
        (str(name), str(sql))
        for name, sql in fetch_rows(
            conn, "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"
        )
    }


def _recorded(path: Path) -> tuple[int, int, set[tuple[str, str]]]:
    """``PRAGMA user_version``, the newest ``schema_migrations`` row and the schema."""
    conn = raw_connect(path)
    try:
        version = migrations.current_version(conn)
        tables = {name for name, _ in _schema(conn)}
        newest = (
            int(fetch_value(conn, "SELECT coalesce(max(version), 0) FROM schema_migrations"))
            if "schema_migrations" in tables
            else 0
        )
        return version, newest, _schema(conn)
    finally:
        conn.close()


def _migrated_to(path: Path, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database at schema ``version``, as an older fermix left it."""
    if version == 0:
        return
    shipped = migrations.migrations()
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "migrations", lambda: shipped[:version])
        open_db(path).close()


MIGRATION_FAULTS = [
    pytest.param("write", apsw.IOError, id="io-error"),
    pytest.param("write", apsw.FullError, id="disk-full"),
    pytest.param("sync", apsw.IOError, id="sync-error"),
]


@pytest.mark.parametrize("version", range(1, len(migrations.migrations()) + 1))
@pytest.mark.parametrize(("op", "error"), MIGRATION_FAULTS)
def test_s2_a_migration_that_fails_leaves_the_database_before_it_and_a_retry_completes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: int,
    op: str,
    error: type[apsw.Error],
) -> None:
    path = tmp_path / "memory.db"
    _migrated_to(path, version - 1, monkeypatch)
    before = _recorded(path) if path.exists() else (0, 0, set())
    _vfs.plan.fail(op, times=None, error=error)
    try:
        with pytest.raises(StorageError):
            open_db(path, vfs=VFS).close()
    finally:
        _vfs.plan.clear()
    after_fault = _recorded(path)
    assert after_fault[0] == after_fault[1] == version - 1  # user_version and the table agree
    assert after_fault[2] == before[2]  # not half a migration: the schema is untouched
    open_db(path, vfs=VFS).close()
    reference = tmp_path / "reference.db"
    open_db(reference).close()
    latest = migrations.latest_version()
    version_now, newest, schema = _recorded(path)
    assert version_now == newest == latest
    assert schema == _recorded(reference)[2]


@pytest.mark.parametrize("version", range(1, len(migrations.migrations()) + 1))
@pytest.mark.parametrize(("op", "error"), [*MIGRATION_FAULTS, ("lock", apsw.BusyError)])
def test_s2_two_faults_during_migrations_are_absorbed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: int,
    op: str,
    error: type[apsw.Error],
) -> None:
    path = tmp_path / "memory.db"
    _migrated_to(path, version - 1, monkeypatch)
    _vfs.plan.fail(op, times=2, error=error)
    open_db(path, vfs=VFS).close()
    assert _vfs.plan.injected == 2
    latest = migrations.latest_version()
    assert _recorded(path)[:2] == (latest, latest)


# -- actor crashes and restart intensity (A6) ----------------------------------------------


def crash(ref: Any) -> None:
    """Crash an actor with a message it does not know, and wait until it has stopped."""
    ref.tell("crash")
    assert ref.actor_stopped.wait(5)


def test_a6_a_crashed_conversation_store_is_restarted_and_serves_its_window(
    memory: Memory, home: Path
) -> None:
    conv = memory.conversation("agent", "faults", "1")
    conv.append_user("one")
    conv.history()  # makes the actor live
    supervisor = memory._child_supervisor("conversations")
    crash(supervisor.await_child(child_id(conv.key)))
    conv.append_user("two")
    assert [m.content for m in conv.history()] == ["one", "two"]
    assert_consistent(memory, home, conv)


def test_a6_a_crashed_store_is_restarted_and_serves_rows(memory: Memory, home: Path) -> None:
    conv = memory.conversation("agent", "faults", "1", owner_id="ana")
    stored = json.loads(memory.tools.run(_store_call("k", "v"), conv))["stored"]
    assert memory.get_row(stored["id"]) is not None
    crash(memory.tree.await_child("store"))
    assert memory.get_row(stored["id"]) is not None
    json.loads(memory.tools.run(_store_call("k2", "v2"), conv))
    assert {r.key for r in memory.list_rows()} == {"k", "k2"}
    assert_consistent(memory, home, conv)


def test_a6_a_crashed_reviewer_and_compactor_are_restarted_and_answer(memory: Memory) -> None:
    conv = memory.conversation("agent", "faults", "1")
    for child in ("reviewer", "compactor"):
        crash(memory.tree.await_child(child))
    # Neither needs the model to answer these: no new message, a cold conversation.
    assert memory.review(conv).skip is review_rules.Skip.NO_NEW_MESSAGES
    assert memory.compact(conv).reason == "cold"


def test_a6_a_conversations_supervisor_that_gives_up_is_restarted_and_appends_stay_true(
    memory: Memory, home: Path
) -> None:
    """21 crashes within the period exceed the conversations supervisor's intensity (20):
    it stops its actors and its parent starts it again. Meanwhile appends from another
    thread either land and are acknowledged, or raise and are not stored (A1), and reads
    wait for the new supervisor instead of failing."""
    conv = memory.conversation("agent", "faults", "1")
    stop = threading.Event()
    acked: list[str] = []
    refused: list[tuple[str, BaseException]] = []
    unread: list[BaseException] = []

    def appender() -> None:
        i = 0
        other = memory.conversation("agent", "faults", "2")
        while not stop.is_set():
            text = f"m{i}"
            i += 1
            try:
                other.append_user(text)
            except FermixError as exc:
                refused.append((text, exc))
            else:
                acked.append(text)
            try:
                other.history()  # keeps its actor live, so appends are told to it
            except FermixError as exc:
                unread.append(exc)

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        conversations_sup = memory._child_supervisor("conversations")
        # The bound only matters on a machine so slow that crashes fall out of the period.
        for _ in range(200):
            conv.history()
            try:
                ref = conversations_sup.await_child(child_id(conv.key))
            except (ActorUnavailableError, LookupError):
                break  # it is giving up right now
            crash(ref)
            if not conversations_sup.is_alive():
                break
        with pytest.raises(SupervisorEscalationError):
            conversations_sup.wait(10)  # it gave up
        conv.append_user("after")
        assert [m.content for m in conv.history()] == ["after"]
    finally:
        stop.set()
        thread.join(30)
    assert memory.failure is None
    other = memory.conversation("agent", "faults", "2")
    stored = stored_contents(home, other)
    assert stored == acked, f"refused but stored: {[t for t, _ in refused if t in stored]}"
    assert not unread, f"reads failed while the supervisor was restarted: {unread[:3]}"
    assert_consistent(memory, home, conv, other)


def test_a6_past_the_restart_intensity_the_tree_gives_up_and_every_call_is_refused_typed(
    home: Path,
) -> None:
    memory = Memory(home).start()
    try:
        conv = memory.conversation("agent", "faults", "1")
        conv.append_user("kept")
        # Default intensity: more than 3 restarts in 5 s. Crash until it gives up; the
        # bound only matters on a machine so slow that restarts fall out of the period.
        for _ in range(50):
            if memory.failure is not None:
                break
            try:
                ref = memory.tree.await_child("reviewer")
            except ActorUnavailableError:
                break  # giving up right now
            crash(ref)
        with pytest.raises(FermixError):
            memory.tree.wait(10)
        assert memory.failure is not None and "gave up" in str(memory.failure)
        for call in (
            lambda: conv.append_user("lost"),
            lambda: conv.history(),
            lambda: memory.get_row(1),
            lambda: memory.review(conv),
            lambda: memory.conversation("agent", "faults", "2"),
        ):
            with pytest.raises(ActorUnavailableError):
                call()
    finally:
        memory.close(timeout=10)
    # Nothing acknowledged was lost, and the home opens again.
    with Memory(home) as again:
        conv = again.conversation("agent", "faults", "1")
        assert [m.content for m in conv.history()] == ["kept"]
        assert_consistent(again, home, conv)
