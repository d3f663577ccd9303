"""Injected faults at every write path, and crashes in every actor kind (S1, S2, A1, A6, C5,
E6, P2, T1, H3).

``tests/faults.py``'s VFS makes chosen writes, syncs and locks of the database files fail:
an I/O error (``apsw.IOError``), a full disk (``apsw.FullError``) or a lock held elsewhere
(``apsw.BusyError``). At each write path (an append, a memory tool's write, a review's
memory apply, the prompt-file rebuild that records a revision, a migration) a transient
fault (one or two failures) must be absorbed, and a persistent one must reach the caller as
a typed :class:`~fermix.errors.FermixError`, never as a raw apsw error or a crash of the
tree. In every case the database, the conversation windows and the prompt files agree
afterwards, and a prompt file is never left behind its current revision by a database
fault. A rebuild whose file write fails leaves its rows (and revision) committed, and the
writer's repair renders the files later. Then every actor kind is crashed: the supervisor
restores service, and past the restart intensity the tree gives up as designed.

Faults reach the code under test only through constructor seams: ``Memory(vfs=...)`` and
``Database(path, vfs=...)``, a database file whose lock another connection holds, a prompt
file's path taken by a directory, the model server's request hook (the moment a review
waits for its answer, between its claim and its apply) and the clock a Memory is given.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from factories import Clock, StartMemory, config_for, fact, reading, stored_messages
from faults import FaultVFS
from model_server import ModelServer, Step

from fermix import model
from fermix.api import Conversation, Memory
from fermix.core.review import CLAIM_TTL_MS, Skip
from fermix.errors import (
    ActorUnavailableError,
    FermixError,
    StorageError,
    SupervisorEscalationError,
    WriteFailedError,
)
from fermix.home import Home
from fermix.model import MemoryRow
from fermix.runtime.prompt_files import PromptFiles, disk
from fermix.runtime.registry import child_id
from fermix.runtime.writer import Writer
from fermix.storage import Writes
from fermix.storage.integrity import FTS_TABLES
from fermix.storage.sqlite import connection, migrations
from fermix.storage.sqlite.connection import fetch_rows, fetch_value, raw_connect
from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.migrations import open_database as open_db

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


@pytest.fixture(params=["io-error", "disk-full"])
def disk_fault(request: pytest.FixtureRequest, home: Path) -> Iterator[Fault]:
    """The faults of one connection's disk writes only (a held lock stops every writer)."""
    injected = Fault(request.param, home / "memory.db")
    yield injected
    injected.close()


class HookedModelServer(ModelServer):
    """The loopback model server, calling :attr:`on_request` once when a request arrives.

    A review's request arrives after its claim is committed and before its memory apply:
    a fault armed there hits the apply.
    """

    on_request: Callable[[], None] | None = None

    def _take(self, body: dict[str, Any], headers: dict[str, str]) -> Step:
        step = super()._take(body, headers)
        hook, self.on_request = self.on_request, None
        if hook is not None:
            hook()
        return step


@pytest.fixture
def model_server() -> Iterator[HookedModelServer]:
    server = HookedModelServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"operations": list(operations)}


def add(category: str, key: str, value: str) -> dict[str, Any]:
    return {"op": "add", "category": category, "key": key, "value": value}


def city(value: str, *, owner_id: str = "ana") -> Callable[[Writes], list[MemoryRow]]:
    """A write unit storing ``owner_id``'s city where the reviewer would (USER.md)."""
    return fact("identity", "city", value, owner_id=owner_id)


# -- checking that the database, the windows and the files agree --------------------------


def user_md(home: Path, owner_id: str = "ana") -> str:
    """USER.md of agent ``agent`` for ``owner_id`` as it is on disk (``""`` when missing)."""
    path = disk.file_path(Home(home), "agent", "user_md", owner_id)
    return path.read_text("utf-8") if path.exists() else ""


def current_user_md(db: Database, owner_id: str = "ana") -> model.Revision | None:
    with db.read() as reads:
        return reads.current_revision("agent", "user_md", owner_id=owner_id)


def assert_consistent(home: Path, *convs: Conversation) -> None:
    """Database, conversation windows and prompt files agree (S1): each file is its current
    revision, and no file or revision lags its rows."""
    db = Database(home / "memory.db")
    try:
        with db.read() as reads:
            for conv in convs:
                stored = [m.content for m in reads.window(conv.key)]
                assert [m.content for m in conv.history()] == stored
                contents = [m.content for m in reads.messages(conv.key)]
                assert len(contents) == len(set(contents)), "a message was stored twice"
            for table in FTS_TABLES:
                assert reads.fts_problem(table, full=True) is None, table
            current = [
                (r, reads.current_revision(r.agent_id, r.name, owner_id=r.owner_id))
                for r in reads.resources()
            ]
        for resource, revision in current:
            path = disk.file_path(Home(home), resource.agent_id, resource.name, resource.owner_id)
            on_disk = path.read_text("utf-8") if path.exists() else ""
            assert on_disk == ("" if revision is None else revision.content), (
                f"{path} is not its current revision"
            )
        stale = PromptFiles(Home(home), db).stale()
        assert not stale, f"prompt files differ from a fresh render: {stale}"
    finally:
        db.close()


def stored_contents(home: Path, conv: Conversation) -> list[str]:
    return [m.content for m in stored_messages(home, conv.key)]


def state_of(home: Path, conv: Conversation) -> model.ConversationState:
    with reading(home) as reads:
        state = reads.conversation(conv.key)
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
        assert_consistent(home, conv)


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
        assert_consistent(home, conv)


# -- memory writes: the tools and the writer (T1, H3) -------------------------------------


def _store_call(key: str, value: str) -> dict[str, Any]:
    arguments = json.dumps({"key": key, "value": value})
    return {"id": "call_1", "function": {"name": "memory_store", "arguments": arguments}}


def test_t1_h3_memory_writes_absorb_two_faults_and_report_a_persistent_one_typed(
    home: Path, fault: Fault
) -> None:
    with Memory(home, vfs=VFS) as memory:
        conv = memory.conversation("agent", "faults", "1", owner_id="ana")
        fault.arm(2)
        stored = json.loads(memory.tools.run(_store_call("flight", "Friday"), conv))
        assert stored["stored"]["value"] == "Friday"
        fault.assert_absorbed()
        assert [r.value for r in memory.list_rows(key="flight")] == ["Friday"]

        fault.close()  # a transient lock holder may still hold on
        fault.arm(None)
        try:
            # The tool never raises into the host: the failure is its result (T4).
            refused = json.loads(memory.tools.run(_store_call("flight", "Monday"), conv))
            with pytest.raises(WriteFailedError):
                memory._runtime.services.writer.write_rows(
                    fact("goal", "marathon", "Runs a marathon in May", owner_id="ana"),
                    label="marathon",
                )
        finally:
            fault.clear()
        assert "not written" in refused["error"]
        assert [r.value for r in memory.list_rows(key="flight")] == ["Friday"]
        assert memory.list_rows(key="marathon") == []
        assert_consistent(home, conv)


def test_h3_a_units_own_database_error_reaches_its_caller_typed(memory: Memory) -> None:
    conv = memory.conversation("agent", "faults", "1", trust="operator")
    conv.append_user("hello")

    def broken(writes: Writes) -> None:
        writes.update_conversation(conv.key, trust="root")  # breaks the trust CHECK

    with pytest.raises(WriteFailedError) as caught:
        memory._runtime.services.writer.write(broken, label="broken")
    assert isinstance(caught.value.__cause__, apsw.ConstraintError)
    state = conv.state()
    assert state is not None and state.trust == "operator"  # nothing of the unit was kept


# -- the memory apply of a review (E6) ---------------------------------------------------


@pytest.fixture
def reviewing(start_memory: StartMemory, model_server: HookedModelServer, clock: Clock) -> Memory:
    """A Memory on the faulty VFS whose reviewer calls the loopback model (background review
    off, so only explicit reviews run) and reads ``clock``."""
    return start_memory(config_for(model_server, primary=MODEL), vfs=VFS, clock=clock)


def test_e6_two_faults_on_a_reviews_apply_are_absorbed(
    reviewing: Memory, model_server: HookedModelServer, home: Path, fault: Fault
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I am Ana and I drink green tea")
    model_server.reply_json(ops(add("preference", "drink", "Drinks green tea")))
    model_server.on_request = lambda: fault.arm(2)
    result = reviewing.review(conv)
    assert model_server.on_request is None  # armed while the review waited for its answer
    fault.assert_absorbed()
    assert result.status == "applied", result.error
    assert [r.value for r in reviewing.list_rows(key="drink")] == ["Drinks green tea"]
    state = state_of(home, conv)
    assert state.review_claim_token is None and state.last_reviewed_message_id > 0
    assert "green tea" in user_md(home)
    assert "green tea" in conv.memory_files()[0]
    assert_consistent(home, conv)


def test_e6_h3_a_persistent_fault_on_a_reviews_apply_fails_the_review_typed_and_writes_nothing(
    reviewing: Memory,
    model_server: HookedModelServer,
    home: Path,
    clock: Clock,
    fault: Fault,
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I am Ana and I drink green tea")
    model_server.reply_json(ops(add("preference", "drink", "Drinks green tea")))
    model_server.on_request = lambda: fault.arm(None)
    try:
        result = reviewing.review(conv)
    finally:
        fault.clear()
    assert model_server.on_request is None
    assert result.status == "failed"
    assert result.error is not None and "not written" in result.error
    assert reviewing.list_rows(archived=None) == []
    assert_consistent(home, conv)

    # The failure could not even be recorded, so the claim is held until it expires: a
    # review after that takes it over and completes (E2).
    state = state_of(home, conv)
    if state.review_claim_token is not None:
        assert state.review_claim_expires_at is not None
        assert state.review_claim_expires_at <= clock() + CLAIM_TTL_MS
        clock.advance(CLAIM_TTL_MS + 1)
    model_server.reply_json(ops(add("preference", "drink", "Drinks green tea")))
    again = reviewing.review(conv)
    assert again.status == "applied", again
    assert [r.value for r in reviewing.list_rows(key="drink")] == ["Drinks green tea"]
    assert_consistent(home, conv)


# -- the prompt-file rebuild and its revision (C5, P2, S1) ---------------------------------


def test_p2_two_faults_on_a_rebuilds_revision_are_absorbed_and_file_and_revision_agree(
    home: Path, fault: Fault
) -> None:
    db = Database(home / "memory.db", vfs=VFS)
    try:
        prompt = PromptFiles(Home(home), db)
        db.write(city("Lives in Porto"), label="seed")  # the files lag, as after a crash
        fault.arm(2)
        result = prompt.rebuild("agent", "ana")
        fault.assert_absorbed()
        assert result.user_md.written and result.user_md.revision is not None
        revision = current_user_md(db)
        assert revision is not None and "Porto" in revision.content
        assert user_md(home) == revision.content
    finally:
        db.close()
    assert_consistent(home)


def test_p2_h3_a_persistent_fault_on_a_rebuild_is_typed_and_leaves_no_file_behind_its_revision(
    home: Path, fault: Fault
) -> None:
    """The revision is recorded before the file is written: when recording fails, neither
    moves, so the file is still its (older) current revision; a repair renders both."""
    db = Database(home / "memory.db", vfs=VFS)
    try:
        prompt = PromptFiles(Home(home), db)
        db.write(city("Lives in Porto"), label="seed")
        prompt.rebuild("agent", "ana")
        db.write(city("Lives in Lisbon"), label="seed")
        fault.arm(None)
        try:
            with pytest.raises(WriteFailedError):
                prompt.rebuild("agent", "ana")
        finally:
            fault.clear()
        revision = current_user_md(db)
        assert revision is not None and revision.revision == 1 and "Porto" in revision.content
        assert user_md(home) == revision.content
        assert prompt.stale() == [("agent", "ana")]
        assert [r.owner_id for r in prompt.repair()] == ["ana"]
        assert "Lisbon" in user_md(home)
    finally:
        db.close()
    assert_consistent(home)


def test_e6_p2_two_faults_on_only_the_rebuild_after_a_memory_write_are_absorbed(
    home: Path, disk_fault: Fault
) -> None:
    """The rows' database writes on a sound disk, the prompt files' on a faulty one."""
    rows_db = Database(home / "memory.db")
    files_db = Database(home / "memory.db", vfs=VFS)
    try:
        writer = Writer(rows_db, PromptFiles(Home(home), files_db))
        disk_fault.arm(2)
        written = writer.write_rows(city("Lives in Porto"), label="seed", also=[("agent", "ana")])
        disk_fault.assert_absorbed()
        assert written.error is None and written.files_changed
        assert not writer.has_stale_files
        assert "Porto" in user_md(home)
    finally:
        files_db.close()
        rows_db.close()
    assert_consistent(home)


def test_e6_p2_s1_a_persistent_fault_on_only_the_rebuild_keeps_the_rows_and_a_repair_renders_them(
    home: Path, disk_fault: Fault
) -> None:
    rows_db = Database(home / "memory.db")
    files_db = Database(home / "memory.db", vfs=VFS)
    try:
        writer = Writer(rows_db, PromptFiles(Home(home), files_db))
        disk_fault.arm(None)
        try:
            written = writer.write_rows(
                city("Lives in Porto"), label="seed", also=[("agent", "ana")]
            )
        finally:
            disk_fault.clear()
        # The rows were committed before the rebuild: the write stands, its files lag.
        assert [r.value for r in written.rows] == ["Lives in Porto"]
        assert written.error is not None and "prompt files" in written.error
        assert writer.has_stale_files
        with rows_db.read() as reads:
            assert [r.value for r in reads.rows(key="city")] == ["Lives in Porto"]
        assert current_user_md(rows_db) is None and user_md(home) == ""  # nothing half-done
        assert writer.repair_files() == 1
        assert not writer.has_stale_files
        assert "Porto" in user_md(home)
    finally:
        files_db.close()
        rows_db.close()
    assert_consistent(home)


def test_p2_s1_a_file_that_cannot_be_replaced_fails_the_rebuild_and_a_later_repair_writes_it(
    home: Path,
) -> None:
    """USER.md's path is taken by a directory: the revision is recorded, the file cannot
    be written. The writer remembers it, a repair while the path is taken changes nothing,
    and the first repair after it is free writes the revision's content."""
    path = disk.file_path(Home(home), "agent", "user_md", "ana")
    (path / "in-the-way").mkdir(parents=True)
    db = Database(home / "memory.db")
    try:
        writer = Writer(db, PromptFiles(Home(home), db))
        written = writer.write_rows(city("Lives in Porto"), label="seed")
        assert written.error is not None and "prompt files" in written.error
        assert writer.has_stale_files
        revision = current_user_md(db)
        assert revision is not None and "Porto" in revision.content
        assert writer.repair_files() == 0 and writer.has_stale_files
        shutil.rmtree(path)
        assert writer.repair_files() == 1 and not writer.has_stale_files
        assert path.read_text("utf-8") == revision.content
        assert current_user_md(db) == revision  # the repair needed no new revision
    finally:
        db.close()
    assert_consistent(home)


def test_p2_a_review_whose_rebuild_fails_keeps_its_rows_and_the_next_review_repairs_the_files(
    reviewing: Memory, model_server: HookedModelServer, home: Path
) -> None:
    conv = reviewing.conversation("agent", "faults", "1", owner_id="ana")
    conv.append_user("I live in Porto")
    model_server.reply_json(ops(add("identity", "city", "Lives in Porto")))
    path = disk.file_path(Home(home), "agent", "user_md", "ana")
    (path / "in-the-way").mkdir(parents=True)
    result = reviewing.review(conv)
    # The rows were committed before the rebuild: the review applied, its files lag.
    assert result.status == "applied"
    assert result.error is not None and "prompt files" in result.error
    assert [r.value for r in reviewing.list_rows(key="city")] == ["Lives in Porto"]
    shutil.rmtree(path)
    # Any later review repairs them, even one with nothing to review.
    other = reviewing.conversation("agent", "faults", "2", owner_id="bob")
    assert reviewing.review(other).status == "skipped"
    assert "Porto" in user_md(home)
    assert_consistent(home, conv)


def settled(memory: Memory) -> None:
    """Return once the Reviewer has started: its start repairs stale prompt files."""
    assert memory.review(memory.conversation("probe", "probe", "probe")).status == "skipped"


def test_c5_s1_prompt_files_left_behind_their_rows_are_repaired_when_the_reviewer_starts(
    home: Path,
) -> None:
    """As after a crash between a review's commit and its rebuild."""
    db = Database(home / "memory.db")
    try:
        db.write(city("Lives in Porto"), label="seed")  # rows only: the files lag
        assert PromptFiles(Home(home), db).stale() == [("agent", "ana")]
    finally:
        db.close()
    with Memory(home) as memory:
        settled(memory)
        assert "Porto" in user_md(home)
        assert_consistent(home, memory.conversation("agent", "faults", "1", owner_id="ana"))


def test_c5_an_old_temporary_file_of_a_killed_write_is_removed_at_start_a_new_one_kept(
    home: Path,
) -> None:
    folder = home / "memory" / "agent"
    folder.mkdir(parents=True)
    old, new = folder / ".USER.md.killed.tmp", folder / ".MEMORY.md.writing.tmp"
    for path in (old, new):
        path.write_text("half a file")
    hour_ago = time.time() - disk.TEMP_GRACE_S - 1
    os.utime(old, (hour_ago, hour_ago))
    with Memory(home) as memory:
        settled(memory)
        assert not old.exists()
        assert new.exists()  # may belong to another process writing right now


def test_c5_only_temporary_files_of_prompt_files_past_the_grace_are_orphans(
    home: Path,
) -> None:
    owners = home / "memory" / "agent" / "owners" / "ana"
    owners.mkdir(parents=True)
    orphans = [owners / ".USER.md.a1.tmp", home / "memory" / "agent" / ".MEMORY.md.b2.tmp"]
    kept = [owners / "USER.md", owners / ".rebuild.lock", owners / ".notes.tmp"]
    for path in orphans + kept:
        path.write_text("x")
    later = time.time() + disk.TEMP_GRACE_S + 1
    assert disk.remove_orphan_temp_files(Home(home), now=later) == 2
    assert [p.exists() for p in orphans] == [False, False]
    assert all(p.exists() for p in kept)
    assert disk.remove_orphan_temp_files(Home(home), now=later) == 0


def test_p2_a_rollback_is_kept_by_the_repair_at_start(home: Path) -> None:
    """The repair at start restores derived files, not an operator's rollback (P2)."""
    db = Database(home / "memory.db")
    try:
        prompt = PromptFiles(Home(home), db)
        writer = Writer(db, prompt)
        for value in ("Lives in Porto", "Lives in Lisbon"):
            assert writer.write_rows(city(value, owner_id=""), label="seed").error is None
        prompt.rollback("agent", "user_md", 1)
    finally:
        db.close()
    with Memory(home) as memory:
        settled(memory)
        assert "Porto" in user_md(home, owner_id="")
        assert_consistent(home)


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


def conversations_supervisor(memory: Memory) -> Any:
    """The supervisor of the conversation actors (waits while it is being restarted)."""
    return memory._runtime.services.tree.await_child("conversations")


def test_a6_a_crashed_conversation_store_is_restarted_and_serves_its_window(
    memory: Memory, home: Path
) -> None:
    conv = memory.conversation("agent", "faults", "1")
    conv.append_user("one")
    conv.history()  # makes the actor live
    crash(conversations_supervisor(memory).await_child(child_id(conv.key)))
    conv.append_user("two")
    assert [m.content for m in conv.history()] == ["one", "two"]
    assert_consistent(home, conv)


def test_a6_a_crashed_reviewer_and_compactor_are_restarted_and_answer_and_rows_stay_served(
    memory: Memory, home: Path
) -> None:
    """Memory rows are read and written directly (no actor holds them): a crash of any
    child leaves them served, and the restarted children answer."""
    conv = memory.conversation("agent", "faults", "1", owner_id="ana")
    stored = json.loads(memory.tools.run(_store_call("k", "v"), conv))["stored"]
    for child in ("reviewer", "compactor"):
        crash(memory._runtime.services.tree.await_child(child))
    # Neither needs the model to answer these: no new message, a cold conversation.
    assert memory.review(conv).skip is Skip.NO_NEW_MESSAGES
    assert memory.compact(conv).reason == "cold"
    assert memory.get_row(stored["id"]) is not None
    json.loads(memory.tools.run(_store_call("k2", "v2"), conv))
    assert {r.key for r in memory.list_rows()} == {"k", "k2"}
    assert_consistent(home, conv)


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
        conversations_sup = conversations_supervisor(memory)
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
    assert_consistent(home, conv, other)


def test_a6_past_the_restart_intensity_the_tree_gives_up_and_every_call_is_refused_typed(
    home: Path,
) -> None:
    memory = Memory(home).start()
    tree = memory._runtime.services.tree
    try:
        conv = memory.conversation("agent", "faults", "1")
        conv.append_user("kept")
        # Default intensity: more than 3 restarts in 5 s. Crash until it gives up; the
        # bound only matters on a machine so slow that restarts fall out of the period.
        for _ in range(50):
            if memory.failure is not None:
                break
            try:
                ref = tree.await_child("reviewer")
            except ActorUnavailableError:
                break  # giving up right now
            crash(ref)
        with pytest.raises(FermixError):
            tree.wait(10)
        assert memory.failure is not None and "gave up" in str(memory.failure)
        for call in (
            lambda: conv.append_user("lost"),
            lambda: conv.history(),
            lambda: memory.get_row(1),
            lambda: memory.list_rows(),
            lambda: memory.review(conv),
            lambda: memory.conversation("agent", "faults", "2"),
        ):
            with pytest.raises(ActorUnavailableError):
                call()
        refused = json.loads(memory.tools.run(_store_call("k", "v"), conv))
        assert "error" in refused  # the tools answer with the refusal, typed (T4)
    finally:
        memory.close(timeout=10)
    # Nothing acknowledged was lost, and the home opens again.
    with Memory(home) as again:
        conv = again.conversation("agent", "faults", "1")
        assert [m.content for m in conv.history()] == ["kept"]
        assert_consistent(home, conv)
