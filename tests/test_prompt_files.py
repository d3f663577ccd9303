"""USER.md / MEMORY.md on disk: layout, atomic writes, revisions, rollback (C5, P2)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from fermix import model
from fermix.core import categories
from fermix.errors import FermixError, InvalidInputError, NotFoundError, UnsafePathSegmentError
from fermix.home import Home
from fermix.model import MemoryRow
from fermix.runtime import prompt_files
from fermix.runtime.prompt_files import rebuild, rollback, write_atomic
from fermix.storage import memories, open_database, resources, transaction

UNSAFE_IDS = ["..", ".", "a/b", "a\\b", "\x00", "a\x00b", "", "x" * 500, "-rf", " bot"]


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home")


@pytest.fixture
def conn(home: Home) -> Iterator[apsw.Connection]:
    db = open_database(home.db_path)
    yield db
    db.close()


def remember(
    conn: apsw.Connection,
    category: str,
    key: str,
    value: str,
    *,
    agent_id: str = "bot",
    owner_id: str = "",
    trust: str = "operator",
) -> MemoryRow:
    """Store a fact where the reviewer would (SC2)."""
    scope, row_owner = categories.reviewer_scope(
        category, agent_id=agent_id, owner_id=owner_id, trust=trust
    )
    with transaction(conn):
        return memories.upsert(
            conn,
            agent_id=agent_id,
            owner_id=row_owner,
            scope=scope,
            category=category,
            key=key,
            value=value,
            promote_target=model.TARGET_OF[category],
        )


def revisions(conn: apsw.Connection, name: str, owner_id: str = "") -> list[str]:
    return [r.reason for r in resources.history(conn, "bot", name, owner_id=owner_id)]


def test_c5_rebuild_writes_user_md_and_memory_md_in_the_agents_directory(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "identity", "job", "Works as a nurse")
    remember(conn, "directive", "lang", "Answer in French")
    result = rebuild(conn, home, "bot")
    folder = home.root / "memory" / "bot"
    assert (
        result.user_md.path == folder / "USER.md" and result.memory_md.path == folder / "MEMORY.md"
    )
    assert "- Works as a nurse" in (folder / "USER.md").read_text(encoding="utf-8")
    assert "## Working Rules\n- Answer in French" in (folder / "MEMORY.md").read_text("utf-8")
    assert prompt_files.read_files(home, "bot") == (
        result.user_md.content,
        result.memory_md.content,
    )
    assert [f.name for f in folder.iterdir() if f.name.endswith(".tmp")] == []


def test_c5_each_owner_has_own_files_and_never_sees_another_owners_facts(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "identity", "name", "Alice is a nurse", owner_id="alice", trust="guest")
    remember(conn, "identity", "name", "Bob is a pilot", owner_id="bob", trust="guest")
    remember(conn, "context", "proj", "Alice plans a trip", owner_id="alice", trust="guest")
    remember(conn, "context", "shared", "The team ships on Fridays", owner_id="op")
    results = prompt_files.rebuild_all_for_agent(conn, home, "bot")
    assert sorted(r.owner_id for r in results) == ["", "alice", "bob"]
    alice_user, alice_memory = prompt_files.read_files(home, "bot", "alice")
    bob_user, bob_memory = prompt_files.read_files(home, "bot", "bob")
    assert "Alice is a nurse" in alice_user and "Bob" not in alice_user
    assert "Bob is a pilot" in bob_user and "Alice" not in bob_user + bob_memory
    assert "Alice plans a trip" in alice_memory
    assert "ships on Fridays" in alice_memory and "ships on Fridays" in bob_memory
    assert prompt_files.prompt_dir(home, "bot", "alice") == home.root / "memory/bot/owners/alice"


@pytest.mark.parametrize("bad", UNSAFE_IDS, ids=repr)
def test_c5_an_unsafe_agent_id_is_refused_before_anything_is_touched(
    conn: apsw.Connection, home: Home, bad: str
) -> None:
    for call in (
        lambda: rebuild(conn, home, bad),
        lambda: rollback(conn, home, bad, "user_md", 1),
        lambda: prompt_files.read_files(home, bad),
        lambda: prompt_files.rebuild_all_for_agent(conn, home, bad),
    ):
        with pytest.raises(UnsafePathSegmentError):
            call()
    assert not (home.root / "memory").exists()
    assert resources.list_resources(conn) == []


@pytest.mark.parametrize("bad", ["\x00", "a\x00b", "x" * 500, "tab\there"], ids=repr)
def test_c5_an_owner_id_that_is_no_identifier_is_refused_before_anything_is_touched(
    conn: apsw.Connection, home: Home, bad: str
) -> None:
    with pytest.raises(InvalidInputError):
        rebuild(conn, home, "bot", bad)
    with pytest.raises(InvalidInputError):
        rollback(conn, home, "bot", "user_md", 1, owner_id=bad)
    assert not (home.root / "memory").exists()
    assert resources.list_resources(conn) == []


@pytest.mark.parametrize("owner", ["..", ".", "a/b", "a\\b", "-rf", " bot", "telegram:42", "_x"])
def test_c5_any_other_owner_id_gets_its_own_directory_inside_owners(
    conn: apsw.Connection, home: Home, owner: str
) -> None:
    remember(conn, "goal", "g", "Run a marathon", owner_id=owner, trust="guest")
    result = rebuild(conn, home, "bot", owner)
    owners = (home.root / "memory" / "bot" / "owners").resolve()
    path = result.user_md.path.resolve()
    assert path.parent.parent == owners
    assert path.parent.name.startswith("_") and len(path.parent.name) == 33
    assert "Run a marathon" in path.read_text()


def test_c5_rebuild_all_covers_owners_whose_ids_are_not_path_segments(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "goal", "g", "Run a marathon", owner_id="telegram:42", trust="guest")
    remember(conn, "goal", "g", "Learn Go", owner_id="carol", trust="guest")
    results = prompt_files.rebuild_all_for_agent(conn, home, "bot")
    assert [r.owner_id for r in results] == ["", "carol", "telegram:42"]


def test_p2_rebuilding_unchanged_rows_changes_neither_the_files_nor_the_revisions(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "preference", "tea", "Prefers green tea")
    first = rebuild(conn, home, "bot")
    assert first.user_md.written and first.user_md.revision is not None
    stat = os.stat(first.user_md.path)
    again = rebuild(conn, home, "bot")
    assert not again.changed
    after = os.stat(first.user_md.path)
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert revisions(conn, "user_md") == ["rebuild"]


def test_p2_no_rows_means_no_file_and_no_revision(conn: apsw.Connection, home: Home) -> None:
    result = rebuild(conn, home, "bot")
    assert not result.changed
    assert not result.user_md.path.exists() and resources.list_resources(conn) == []
    assert prompt_files.read_files(home, "bot") == ("", "")


def test_p2_a_changed_row_records_a_new_revision_of_only_its_file(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "preference", "tea", "Prefers green tea")
    remember(conn, "context", "proj", "Building fermix")
    rebuild(conn, home, "bot")
    remember(conn, "preference", "tea", "Prefers black tea")
    result = rebuild(conn, home, "bot", reason="review")
    assert result.user_md.revision is not None and result.memory_md.revision is None
    assert revisions(conn, "user_md") == ["review", "rebuild"]
    assert revisions(conn, "memory_md") == ["rebuild"]
    assert "black tea" in result.user_md.path.read_text("utf-8")


def test_c5_an_archived_row_leaves_the_file_on_the_next_rebuild(
    conn: apsw.Connection, home: Home
) -> None:
    row = remember(conn, "goal", "g", "Learn the cello")
    rebuild(conn, home, "bot")
    with transaction(conn):
        memories.archive(conn, row.id, by="reviewer", reason="gave up")
    result = rebuild(conn, home, "bot")
    assert result.user_md.written and result.user_md.path.read_bytes() == b""
    assert resources.current(conn, "bot", "user_md") is not None
    assert resources.current(conn, "bot", "user_md").content == ""  # type: ignore[union-attr]


def test_p2_rollback_restores_the_file_and_the_next_rebuild_writes_the_rendered_content_again(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "interest", "music", "Likes jazz")
    one = rebuild(conn, home, "bot").user_md.content
    remember(conn, "interest", "music", "Likes baroque music")
    two = rebuild(conn, home, "bot").user_md.content
    back = rollback(conn, home, "bot", "user_md", 1)
    assert back.written and back.revision is not None and back.revision.revision == 3
    assert back.path.read_text("utf-8") == one
    assert revisions(conn, "user_md") == ["rollback:1", "rebuild", "rebuild"]
    again = rebuild(conn, home, "bot")
    assert again.user_md.written and again.user_md.path.read_text("utf-8") == two
    assert revisions(conn, "user_md") == ["rebuild", "rollback:1", "rebuild", "rebuild"]


def test_p2_rollback_to_a_missing_revision_is_not_found(conn: apsw.Connection, home: Home) -> None:
    with pytest.raises(NotFoundError):
        rollback(conn, home, "bot", "memory_md", 4)


def test_c5_a_hand_edited_file_is_rewritten_without_a_new_revision(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "identity", "name", "Called Dana")
    path = rebuild(conn, home, "bot").user_md.path
    path.write_text("# edited by hand\n", encoding="utf-8")
    result = rebuild(conn, home, "bot")
    assert result.user_md.written and result.user_md.revision is None
    assert "Called Dana" in path.read_text("utf-8")


def test_c5_after_a_shared_row_changes_every_owners_memory_md_is_rebuilt(
    conn: apsw.Connection, home: Home
) -> None:
    remember(conn, "identity", "n", "Erin", owner_id="erin", trust="guest")
    remember(conn, "identity", "n", "Finn", owner_id="finn", trust="guest")
    prompt_files.rebuild_all_for_agent(conn, home, "bot")
    shared = remember(conn, "directive", "tone", "Keep answers short")
    results = prompt_files.rebuild_for_rows(conn, home, [shared])
    assert sorted(r.owner_id for r in results if r.memory_md.written) == ["", "erin", "finn"]
    private = remember(conn, "identity", "n", "Erin Smith", owner_id="erin", trust="guest")
    results = prompt_files.rebuild_for_rows(conn, home, [private])
    assert [(r.owner_id, r.user_md.written) for r in results] == [("erin", True)]


def _poll_until_stopped(
    path: Path,
    allowed: set[bytes],
    seen: list[bytes],
    started: threading.Event,
    stop: threading.Event,
) -> None:
    """Read ``path`` over and over; keep every content that is not one of ``allowed``."""
    while True:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = None
        if data is not None and data not in allowed:
            seen.append(data)
        started.set()
        if stop.is_set():
            return


def test_c5_a_reader_polling_during_many_atomic_writes_never_sees_a_partial_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "USER.md"
    versions = ["a" * 300_000, "# b\n" * 100_000, "c"]
    write_atomic(path, versions[0])
    partial: list[bytes] = []
    started, stop = threading.Event(), threading.Event()
    allowed = {v.encode() for v in versions}
    reader = threading.Thread(
        target=_poll_until_stopped, args=(path, allowed, partial, started, stop)
    )
    reader.start()
    try:
        assert started.wait(5)
        for i in range(300):
            write_atomic(path, versions[i % 3])
    finally:
        stop.set()
        reader.join(5)
    assert partial == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["USER.md"]


def test_c5_a_reader_polling_during_many_rebuilds_never_sees_a_partial_file(
    conn: apsw.Connection, home: Home
) -> None:
    values = ["Lives in Porto " * 10, "Lives in Lisbon"]
    contents = set()
    for value in values:
        remember(conn, "identity", "home", value)
        contents.add(rebuild(conn, home, "bot").user_md.content.encode())
    path = prompt_files.file_path(home, "bot", "user_md")
    partial: list[bytes] = []
    started, stop = threading.Event(), threading.Event()
    reader = threading.Thread(
        target=_poll_until_stopped, args=(path, contents, partial, started, stop)
    )
    reader.start()
    try:
        assert started.wait(5)
        for i in range(100):
            remember(conn, "identity", "home", values[i % 2])
            assert rebuild(conn, home, "bot").user_md.written
    finally:
        stop.set()
        reader.join(5)
    assert partial == []
    assert len(resources.history(conn, "bot", "user_md")) == 102


def test_c5_a_row_written_while_a_rebuild_renders_is_in_the_files_it_leaves(
    conn: apsw.Connection, home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    remember(conn, "interest", "a", "Likes chess")
    other = open_database(home.db_path)
    real_render = prompt_files._render
    calls: list[int] = []

    def render_then_another_process_writes(*args: object) -> object:
        rendered = real_render(*args)  # type: ignore[arg-type]
        if not calls:
            remember(other, "interest", "b", "Likes go")  # lands before the lock is taken
        calls.append(1)
        return rendered

    monkeypatch.setattr(prompt_files, "_render", render_then_another_process_writes)
    try:
        result = rebuild(conn, home, "bot")
    finally:
        other.close()
    assert len(calls) == 2
    assert "Likes go" in result.user_md.content and "Likes go" in result.user_md.path.read_text()


def test_c5_concurrent_writers_and_rebuilders_leave_files_that_match_the_final_rows(
    home: Home, conn: apsw.Connection
) -> None:
    errors: list[Exception] = []

    def writer() -> None:
        db = open_database(home.db_path)
        try:
            for i in range(40):
                remember(db, "goal", "g", f"Goal number {i}")
                rebuild(db, home, "bot")
        finally:
            db.close()

    def rebuilder(done: threading.Event) -> None:
        db = open_database(home.db_path)
        try:
            while not done.is_set():
                rebuild(db, home, "bot")
        except (FermixError, apsw.Error, OSError) as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            db.close()

    done = threading.Event()
    threads = [threading.Thread(target=rebuilder, args=(done,)) for _ in range(2)]
    for t in threads:
        t.start()
    writer()
    done.set()
    for t in threads:
        t.join(30)
    assert errors == []
    final = resources.current(conn, "bot", "user_md")
    assert final is not None and "Goal number 39" in final.content
    assert prompt_files.read_files(home, "bot")[0] == final.content
    assert not rebuild(conn, home, "bot").changed


def test_c4_rows_that_show_nothing_never_crowd_a_section_out_of_its_newest_facts(
    conn: apsw.Connection, home: Home
) -> None:
    for i in range(6):
        remember(conn, "context", f"fact{i}", f"Context fact {i}")
    with transaction(conn):
        for i in range(30):  # newer rows that never render: memory_store rows and blanks
            memories.upsert(
                conn,
                agent_id="bot",
                owner_id="",
                scope=categories.agent_scope("bot"),
                category="context",
                key=f"tool{i}",
                value="\u200b" if i % 2 else f"tool fact {i}",
                promote_target=None if i % 2 == 0 else "memory_md",
            )
    memory_md = rebuild(conn, home, "bot").memory_md.content
    assert all(f"Context fact {i}" in memory_md for i in range(6))
    assert "tool fact" not in memory_md


def test_c5_a_new_owner_sees_the_agents_shared_rows_on_the_first_compose(tmp_path: Path) -> None:
    from fermix.api import Memory

    with Memory(tmp_path / "home") as memory:
        memory.write(
            lambda c: memories.upsert(
                c,
                agent_id="bot",
                owner_id="",
                scope=categories.agent_scope("bot"),
                category="directive",
                key="tone",
                value="Answers in a friendly tone",
                promote_target="memory_md",
            )
        )
        newcomer = memory.conversation("bot", "cli", "9", owner_id="newcomer", trust="guest")
        system = "\n".join(m["content"] for m in newcomer.compose("sys") if m["role"] == "system")
        assert "Answers in a friendly tone" in system
