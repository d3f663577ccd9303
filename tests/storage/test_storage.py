"""Storage layer on real SQLite in temporary directories (S1-S8)."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fermix import model
from fermix.errors import InvalidInputError, NotFoundError, SchemaTooNewError
from fermix.model import ConversationKey, NewMessage, Scope
from fermix.storage import conversations, jobs
from fermix.storage import messages as message_reads
from fermix.storage.sqlite import messages
from fermix.storage.sqlite.connection import MMAP_BYTES, fetch_rows, fetch_value, transaction
from fermix.storage.sqlite.migrations import latest_version, migrate, open_database
from fermix.storage.sqlite.session import SqliteWrites
from fermix.storage.sqlite.sql import SqliteSql

KEY = ConversationKey("agent", "telegram", "123")


def _add_memory(conn: apsw.Connection, key: str, value: str, **kw: object) -> model.MemoryRow:
    args: dict[str, object] = {
        "agent_id": "agent",
        "owner_id": "alice",
        "scope": Scope("owner", "alice"),
        "category": "preference",
        "key": key,
        "value": value,
        "promote_target": "user_md",
    }
    args.update(kw)
    with transaction(conn):
        return SqliteWrites(conn).upsert_row(**args)  # type: ignore[arg-type]


def test_s2_migrations_are_recorded_and_idempotent(db: apsw.Connection) -> None:
    recorded = fetch_rows(db, "SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in recorded] == list(range(1, latest_version() + 1))
    assert migrate(db) == []
    assert fetch_value(db, "SELECT count(*) FROM schema_migrations") == latest_version()


def test_s2_reopening_a_database_applies_nothing(tmp_path: Path) -> None:
    open_database(tmp_path / "m.db").close()
    conn = open_database(tmp_path / "m.db")
    assert fetch_value(conn, "PRAGMA user_version") == latest_version()
    assert fetch_value(conn, "SELECT count(*) FROM schema_migrations") == latest_version()


def test_s2_database_from_a_newer_version_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    conn = apsw.Connection(str(path))
    conn.execute(f"CREATE TABLE future (x); PRAGMA user_version = {latest_version() + 1}")
    conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(SchemaTooNewError, match="newer"):
        open_database(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not Path(str(path) + "-wal").exists()


def test_s8_connection_uses_wal_foreign_keys_and_busy_timeout(db: apsw.Connection) -> None:
    assert fetch_value(db, "PRAGMA journal_mode") == "wal"
    assert fetch_value(db, "PRAGMA foreign_keys") == 1
    assert fetch_value(db, "PRAGMA busy_timeout") > 0
    assert fetch_value(db, "PRAGMA synchronous") == 1  # NORMAL


def test_s8_connection_reads_the_file_through_a_memory_map(db: apsw.Connection) -> None:
    """A search's scattered pages are read in place, not copied into SQLite's cache."""
    assert fetch_value(db, "PRAGMA mmap_size") == MMAP_BYTES


def test_s3_messages_come_back_in_order_for_their_conversation_only(db: apsw.Connection) -> None:
    other = ConversationKey("agent", "telegram", "999")
    with transaction(db):
        for i in range(5):
            messages.insert(db, NewMessage(KEY, "user", f"m{i}"), created_at=1000)
            messages.insert(db, NewMessage(other, "user", f"o{i}"), created_at=1000)
    window = message_reads.conversation(SqliteSql(db), KEY)
    assert [m.content for m in window] == [f"m{i}" for i in range(5)]
    newest = message_reads.conversation(SqliteSql(db), KEY, limit=2, newest=True)
    assert [m.content for m in newest] == ["m3", "m4"]
    after = message_reads.conversation(SqliteSql(db), KEY, after_id=window[2].id)
    assert [m.content for m in after] == ["m3", "m4"]
    assert message_reads.count(SqliteSql(db), KEY) == 5


def test_s3_the_conversation_index_exists_with_the_seed_columns(db: apsw.Connection) -> None:
    cols = [r[2] for r in fetch_rows(db, "PRAGMA index_info('messages_conversation')")]
    assert cols == ["agent_id", "channel", "chat_id", "thread_scope", "created_at", "id"]


def test_s4_fts_follows_insert_update_and_delete(db: apsw.Connection) -> None:
    with transaction(db):
        msg = messages.insert(db, NewMessage(KEY, "user", "I adore pottery"))
    assert [h.message.id for h in messages.search(db, "pottery", key=KEY)] == [msg.id]
    with transaction(db):
        db.execute("UPDATE messages SET content = 'I adore painting' WHERE id = ?", (msg.id,))
    assert messages.search(db, "pottery", key=KEY) == []
    assert [h.message.id for h in messages.search(db, "painting", key=KEY)] == [msg.id]
    with transaction(db):
        db.execute("DELETE FROM messages WHERE id = ?", (msg.id,))
    assert messages.search(db, "painting", key=KEY) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("role", "wizard"), ("content", "\ud800"), ("kind", ""), ("content", "x" * 1_000_001)],
)
def test_s3_a_bad_message_is_refused_before_anything_is_written(
    db: apsw.Connection, field: str, value: str
) -> None:
    args = {"key": KEY, "role": "user", "content": "ok", field: value}
    with pytest.raises(InvalidInputError):
        NewMessage(**args)  # type: ignore[arg-type]
    assert message_reads.count(SqliteSql(db), KEY) == 0


def test_s3_metadata_that_json_cannot_hold_is_refused(db: apsw.Connection) -> None:
    new = NewMessage(KEY, "user", "hi", metadata={"x": object()})
    with pytest.raises(InvalidInputError), transaction(db):
        messages.insert(db, new)
    assert message_reads.count(SqliteSql(db), KEY) == 0


def test_s5_upsert_on_the_unique_key_never_duplicates(db: apsw.Connection) -> None:
    first = _add_memory(db, "drink", "tea")
    second = _add_memory(db, "drink", "coffee")
    assert first.id == second.id
    assert second.value == "coffee"
    assert len(SqliteWrites(db).rows(agent_id="agent")) == 1


def test_s5_the_same_key_in_another_scope_is_another_row(db: apsw.Connection) -> None:
    a = _add_memory(db, "drink", "tea")
    b = _add_memory(db, "drink", "tea", owner_id="bob", scope=Scope("owner", "bob"))
    assert a.id != b.id


@given(ops=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("xyz")), max_size=30))
@settings(max_examples=30, deadline=None)
def test_s5_any_sequence_of_upserts_leaves_one_row_per_key(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str]]
) -> None:
    conn = open_database(tmp_path_factory.mktemp("u") / "m.db")
    expected: dict[str, str] = {}
    for key, value in ops:
        _add_memory(conn, key, value)
        expected[key] = value
    rows = SqliteWrites(conn).rows(agent_id="agent")
    assert {r.key: r.value for r in rows} == expected
    assert len(rows) == len(expected)
    conn.close()


def test_s7_archive_and_restore_round_trip(db: apsw.Connection) -> None:
    ops = SqliteWrites(db)
    row = _add_memory(db, "city", "Lisbon")
    with transaction(db):
        archived = ops.archive_row(row.id, by="reviewer", reason="moved to Porto", now=5)
    assert (archived.archived_at, archived.archived_by, archived.archive_reason) == (
        5,
        "reviewer",
        "moved to Porto",
    )
    assert ops.rows(agent_id="agent") == []
    assert [r.id for r in ops.rows(agent_id="agent", archived=True)] == [row.id]
    with transaction(db):
        restored = ops.restore_row(row.id)
    assert restored.archived_at is None and restored.archived_by is None
    assert restored.archive_reason is None and restored.value == "Lisbon"
    assert fetch_value(db, "SELECT count(*) FROM memories") == 1


def test_s7_archiving_an_unknown_row_is_a_typed_error(db: apsw.Connection) -> None:
    with pytest.raises(NotFoundError), transaction(db):
        SqliteWrites(db).archive_row(404, by="operator", reason="x")


def test_sc3_listing_by_scopes_returns_only_those_scopes(db: apsw.Connection) -> None:
    ops = SqliteWrites(db)
    _add_memory(db, "a", "1")
    _add_memory(db, "b", "2", owner_id="bob", scope=Scope("owner", "bob"))
    _add_memory(db, "c", "3", scope=Scope("agent", "agent"), category="context")
    rows = ops.rows(scopes=[Scope("owner", "alice"), Scope("agent", "agent")])
    assert sorted(r.key for r in rows) == ["a", "c"]
    assert ops.rows(scopes=[]) == []
    found = ops.search_rows("2 OR 1", scopes=[Scope("owner", "alice")])
    assert all(r.owner_id == "alice" for r in found)


def test_a3_change_counter_moves_on_every_memory_write(db: apsw.Connection) -> None:
    ops = SqliteWrites(db)
    start = ops.memory_version()
    row = _add_memory(db, "k", "v")
    after_insert = ops.memory_version()
    with transaction(db):
        ops.archive_row(row.id, by="operator", reason="r")
    assert start < after_insert < ops.memory_version()


def test_p2_revisions_are_recorded_only_when_content_changes(db: apsw.Connection) -> None:
    ops = SqliteWrites(db)
    with transaction(db):
        first = ops.record_revision("agent", "user_md", "# User\n", reason="rebuild")
        same = ops.record_revision("agent", "user_md", "# User\n", reason="rebuild")
        second = ops.record_revision("agent", "user_md", "# User\n- tea\n", reason="rebuild")
    assert first is not None and first.revision == 1
    assert same is None
    assert second is not None and second.revision == 2
    assert [r.revision for r in ops.revisions("agent", "user_md")] == [2, 1]
    assert ops.revision("agent", "user_md", 1).content == "# User\n"
    with pytest.raises(NotFoundError):
        ops.revision("agent", "user_md", 9)
    with pytest.raises(InvalidInputError):
        ops.revisions("agent", "passwords", limit=1)


def test_s6_a_job_gets_its_own_memory_source_and_runs(db: apsw.Connection) -> None:
    sql = SqliteSql(db)
    with transaction(db):
        job = jobs.create_job(
            sql, agent_id="agent", name="digest", schedule="0 8 * * *", prompt="p"
        )
        run = jobs.start_run(sql, job.id)
        done = jobs.finish_run(sql, run.id, status="succeeded", output="ok")
    source = jobs.get_source(sql, job.memory_source_id)
    assert source is not None and source.source_type == "job" and source.name == "digest"
    assert done.status == "succeeded" and done.finished_at is not None
    assert [r.id for r in jobs.list_runs(sql, job.id)] == [run.id]
    assert [j.id for j in jobs.list_jobs(sql, agent_id="agent")] == [job.id]
    assert jobs.list_jobs(sql, agent_id="someone-else") == []
    with pytest.raises(InvalidInputError), transaction(db):
        jobs.create_job(sql, agent_id="agent", name="digest", schedule="x", prompt="p")


_WRITER = textwrap.dedent(
    """
    import sys
    from fermix.storage.sqlite.migrations import open_database
    from fermix.storage.sqlite.connection import transaction
    from fermix.storage.sqlite import messages
    from fermix.model import ConversationKey, NewMessage
    conn = open_database(sys.argv[1])
    key = ConversationKey("agent", "proc", sys.argv[2])
    for i in range(int(sys.argv[3])):
        with transaction(conn):
            messages.insert(conn, NewMessage(key, "user", f"{sys.argv[2]}-{i}"))
    print("done")
    """
)


def test_s8_two_processes_append_at_once_without_database_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    open_database(path).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), name, "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("p1", "p2")
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err and out.strip() == "done"
    conn = open_database(path)
    for name in ("p1", "p2"):
        rows = message_reads.conversation(SqliteSql(conn), ConversationKey("agent", "proc", name))
        assert [m.content for m in rows] == [f"{name}-{i}" for i in range(300)]


def test_s3_insert_returns_exactly_the_row_it_stored(db: apsw.Connection) -> None:
    guest_key = ConversationKey("agent", "telegram", "no-row")
    with transaction(db):
        conversations.touch(SqliteSql(db), KEY, owner_id="alice", trust="operator")
        returned = [
            messages.insert(db, NewMessage(KEY, "user", "given", owner_id="bob", trust="guest")),
            messages.insert(db, NewMessage(KEY, "user", "its conversation's", sender="alice")),
            messages.insert(db, NewMessage(guest_key, "tool", "no conversation row")),
            messages.insert(
                db, NewMessage(KEY, "assistant", "meta", metadata={"n": [1, "é"]}), created_at=7
            ),
        ]
    stored = [message_reads.get(SqliteSql(db), m.id) for m in returned]
    assert returned == stored
    assert [m.trust for m in returned] == ["guest", "operator", "guest", "operator"]
    assert returned[3].created_at == 7 and returned[3].metadata == {"n": [1, "é"]}


def test_a1_a_messages_key_is_validated_once_per_key_and_never_skipped(
    db: apsw.Connection,
) -> None:
    with transaction(db):
        stored = messages.insert(db, NewMessage(KEY, "user", "hi", trust="operator"))
    assert stored.key == KEY and stored.key is stored.key  # the same validated key again
    bad = dataclasses.replace(stored, agent_id="bad\x00agent")
    with pytest.raises(InvalidInputError):
        _ = bad.key
    with pytest.raises(InvalidInputError):  # a failed validation is not remembered as good
        _ = bad.key


def test_s1_a_sessions_operations_are_bound_to_its_connection_once(tmp_path: Path) -> None:
    from fermix.storage.sqlite.session import SqliteReads as Reads
    from fermix.storage.sqlite.session import SqliteWrites as Writes

    one, two = open_database(tmp_path / "one.db"), open_database(tmp_path / "two.db")
    try:
        with transaction(one):
            messages.insert(one, NewMessage(KEY, "user", "in one", trust="operator"))
        reads_one, reads_two = Reads(one), Reads(two)
        assert reads_one.count_messages is reads_one.count_messages
        assert reads_one.count_messages(KEY) == 1 and reads_two.count_messages(KEY) == 0
        assert Reads(one).count_messages is not reads_one.count_messages
        assert Writes.insert_message.__doc__ == messages.insert.__doc__
        assert reads_one.tokens is reads_one.tokens  # an operation written once binds alike
    finally:
        one.close()
        two.close()
