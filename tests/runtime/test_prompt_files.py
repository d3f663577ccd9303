"""USER.md / MEMORY.md on disk: layout, atomic writes, revisions, rollback (C5, P2, M6).

Every test drives :class:`~fermix.runtime.prompt_files.PromptFiles` over a real
:class:`~fermix.storage.Database` in a temporary home, and seeds rows through the storage
port (``db.write``) as another process would.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import fact

from fermix import model
from fermix.core import categories
from fermix.errors import FermixError, InvalidInputError, NotFoundError, UnsafePathSegmentError
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow, NewMessage
from fermix.runtime.prompt_files import PromptFiles, RebuildResult, rebuilding
from fermix.runtime.prompt_files.disk import (
    FileCache,
    PairLocks,
    file_path,
    prompt_dir,
    write_atomic,
)
from fermix.runtime.writer import Writer
from fermix.storage import Writes
from fermix.storage.sqlite.connection import raw_connect
from fermix.storage.sqlite.database import Database

UNSAFE_IDS = ["..", ".", "a/b", "a\\b", "\x00", "a\x00b", "", "x" * 500, "-rf", " bot"]
WAIT_S = 30
"""The most a test waits for an event another thread sets (a hang fails, it never sleeps)."""


@pytest.fixture
def db(fermix_home: Home) -> Iterator[Database]:
    database = Database(fermix_home.db_path)
    yield database
    database.close()


@pytest.fixture
def files(fermix_home: Home, db: Database) -> PromptFiles:
    return PromptFiles(fermix_home, db)


def remember(
    db: Database, category: str, key: str, value: str, *, agent_id: str = "bot", owner_id: str = ""
) -> MemoryRow:
    """Store a fact where the reviewer would (SC2); the prompt files are not touched."""
    (row,) = db.write(
        fact(category, key, value, agent_id=agent_id, owner_id=owner_id), label="seed"
    )
    return row


def revisions(db: Database, name: str, owner_id: str = "") -> list[str]:
    with db.read() as reads:
        return [r.reason for r in reads.revisions("bot", name, owner_id=owner_id)]


def current(db: Database, name: str, owner_id: str = "") -> model.Revision | None:
    with db.read() as reads:
        return reads.current_revision("bot", name, owner_id=owner_id)


def no_resources(db: Database) -> bool:
    with db.read() as reads:
        return reads.resources() == []


def on_disk(home: Home, agent_id: str = "bot", owner_id: str = "") -> tuple[str, str]:
    """USER.md and MEMORY.md as a host would read them now (``""`` when missing)."""
    return FileCache().texts(home, agent_id, owner_id)


def test_c5_rebuild_writes_user_md_and_memory_md_in_the_agents_directory(
    db: Database, files: PromptFiles, fermix_home: Home
) -> None:
    remember(db, "identity", "job", "Works as a nurse")
    remember(db, "directive", "lang", "Answer in French")
    result = files.rebuild("bot")
    folder = fermix_home.root / "memory" / "bot"
    assert (
        result.user_md.path == folder / "USER.md" and result.memory_md.path == folder / "MEMORY.md"
    )
    assert "- Works as a nurse" in (folder / "USER.md").read_text(encoding="utf-8")
    assert "## Working Rules\n- Answer in French" in (folder / "MEMORY.md").read_text("utf-8")
    assert on_disk(fermix_home, "bot") == (result.user_md.content, result.memory_md.content)
    assert files.texts("bot") == (result.user_md.content, result.memory_md.content)
    assert [f.name for f in folder.iterdir() if f.name.endswith(".tmp")] == []


def test_c5_each_owner_has_own_files_and_never_sees_another_owners_facts(
    db: Database, files: PromptFiles, fermix_home: Home
) -> None:
    remember(db, "identity", "name", "Alice is a nurse", owner_id="alice")
    remember(db, "identity", "name", "Bob is a pilot", owner_id="bob")
    remember(db, "context", "proj", "Alice plans a trip", owner_id="alice")
    remember(db, "context", "shared", "The team ships on Fridays")
    results = files.rebuild_agent("bot")
    assert sorted(r.owner_id for r in results) == ["", "alice", "bob"]
    alice_user, alice_memory = on_disk(fermix_home, "bot", "alice")
    bob_user, bob_memory = on_disk(fermix_home, "bot", "bob")
    assert "Alice is a nurse" in alice_user and "Bob" not in alice_user
    assert "Bob is a pilot" in bob_user and "Alice" not in bob_user + bob_memory
    assert "Alice plans a trip" in alice_memory
    assert "ships on Fridays" in alice_memory and "ships on Fridays" in bob_memory
    assert prompt_dir(fermix_home, "bot", "alice") == fermix_home.root / "memory/bot/owners/alice"


@pytest.mark.parametrize("bad", UNSAFE_IDS, ids=repr)
def test_c5_an_unsafe_agent_id_is_refused_before_anything_is_touched(
    db: Database, files: PromptFiles, fermix_home: Home, bad: str
) -> None:
    for call in (
        lambda: files.rebuild(bad),
        lambda: files.rollback(bad, "user_md", 1),
        lambda: files.texts(bad),
        lambda: files.rebuild_agent(bad),
        lambda: FileCache().texts(fermix_home, bad),
    ):
        with pytest.raises(UnsafePathSegmentError):
            call()
    assert not (fermix_home.root / "memory").exists()
    assert no_resources(db)


@pytest.mark.parametrize("bad", ["\x00", "a\x00b", "x" * 500, "tab\there"], ids=repr)
def test_c5_an_owner_id_that_is_no_identifier_is_refused_before_anything_is_touched(
    db: Database, files: PromptFiles, fermix_home: Home, bad: str
) -> None:
    with pytest.raises(InvalidInputError):
        files.rebuild("bot", bad)
    with pytest.raises(InvalidInputError):
        files.rollback("bot", "user_md", 1, owner_id=bad)
    assert not (fermix_home.root / "memory").exists()
    assert no_resources(db)


@pytest.mark.parametrize("owner", ["..", ".", "a/b", "a\\b", "-rf", " bot", "telegram:42", "_x"])
def test_c5_any_other_owner_id_gets_its_own_directory_inside_owners(
    db: Database, files: PromptFiles, fermix_home: Home, owner: str
) -> None:
    remember(db, "goal", "g", "Run a marathon", owner_id=owner)
    result = files.rebuild("bot", owner)
    owners = (fermix_home.root / "memory" / "bot" / "owners").resolve()
    path = result.user_md.path.resolve()
    assert path.parent.parent == owners
    assert path.parent.name.startswith("_") and len(path.parent.name) == 33
    assert "Run a marathon" in path.read_text()


def test_c5_rebuild_all_covers_owners_whose_ids_are_not_path_segments(
    db: Database, files: PromptFiles
) -> None:
    remember(db, "goal", "g", "Run a marathon", owner_id="telegram:42")
    remember(db, "goal", "g", "Learn Go", owner_id="carol")
    results = files.rebuild_agent("bot")
    assert [r.owner_id for r in results] == ["", "carol", "telegram:42"]


def test_p2_rebuilding_unchanged_rows_changes_neither_the_files_nor_the_revisions(
    db: Database, files: PromptFiles
) -> None:
    remember(db, "preference", "tea", "Prefers green tea")
    first = files.rebuild("bot")
    assert first.user_md.written and first.user_md.revision is not None
    stat = os.stat(first.user_md.path)
    again = files.rebuild("bot")
    assert not again.changed
    after = os.stat(first.user_md.path)
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert revisions(db, "user_md") == ["rebuild"]


def test_p2_no_rows_means_no_file_and_no_revision(
    db: Database, files: PromptFiles, fermix_home: Home
) -> None:
    result = files.rebuild("bot")
    assert not result.changed
    assert not result.user_md.path.exists() and no_resources(db)
    assert on_disk(fermix_home, "bot") == ("", "")


def test_p2_a_changed_row_records_a_new_revision_of_only_its_file(
    db: Database, files: PromptFiles
) -> None:
    remember(db, "preference", "tea", "Prefers green tea")
    remember(db, "context", "proj", "Building fermix")
    files.rebuild("bot")
    remember(db, "preference", "tea", "Prefers black tea")
    result = files.rebuild("bot", reason="review")
    assert result.user_md.revision is not None and result.memory_md.revision is None
    assert revisions(db, "user_md") == ["review", "rebuild"]
    assert revisions(db, "memory_md") == ["rebuild"]
    assert "black tea" in result.user_md.path.read_text("utf-8")


def test_c5_an_archived_row_leaves_the_file_on_the_next_rebuild(
    db: Database, files: PromptFiles
) -> None:
    row = remember(db, "goal", "g", "Learn the cello")
    files.rebuild("bot")
    db.write(lambda w: w.archive_row(row.id, by="reviewer", reason="gave up"))
    result = files.rebuild("bot")
    assert result.user_md.written and result.user_md.path.read_bytes() == b""
    revision = current(db, "user_md")
    assert revision is not None and revision.content == ""


def test_p2_rollback_restores_the_file_and_the_next_rebuild_writes_the_rendered_content_again(
    db: Database, files: PromptFiles
) -> None:
    remember(db, "interest", "music", "Likes jazz")
    one = files.rebuild("bot").user_md.content
    remember(db, "interest", "music", "Likes baroque music")
    two = files.rebuild("bot").user_md.content
    back = files.rollback("bot", "user_md", 1)
    assert back.written and back.revision is not None and back.revision.revision == 3
    assert back.path.read_text("utf-8") == one
    assert revisions(db, "user_md") == ["rollback:1", "rebuild", "rebuild"]
    assert files.stale() == []  # a rolled-back file is the operator's choice, not stale
    again = files.rebuild("bot")
    assert again.user_md.written and again.user_md.path.read_text("utf-8") == two
    assert revisions(db, "user_md") == ["rebuild", "rollback:1", "rebuild", "rebuild"]


def test_p2_rollback_to_a_missing_revision_is_not_found(files: PromptFiles) -> None:
    with pytest.raises(NotFoundError):
        files.rollback("bot", "memory_md", 4)


def test_c5_a_hand_edited_file_is_rewritten_without_a_new_revision(
    db: Database, files: PromptFiles
) -> None:
    remember(db, "identity", "name", "Called Dana")
    path = files.rebuild("bot").user_md.path
    path.write_text("# edited by hand\n", encoding="utf-8")
    assert files.stale() == [("bot", "")]
    result = files.rebuild("bot")
    assert result.user_md.written and result.user_md.revision is None
    assert "Called Dana" in path.read_text("utf-8")
    assert files.stale() == []


def test_c5_after_a_shared_row_changes_every_owners_memory_md_is_rebuilt(
    db: Database, files: PromptFiles
) -> None:
    remember(db, "identity", "n", "Erin", owner_id="erin")
    remember(db, "identity", "n", "Finn", owner_id="finn")
    files.rebuild_agent("bot")
    shared = remember(db, "directive", "tone", "Keep answers short")
    results = files.rebuild_for_rows([shared])
    assert sorted(r.owner_id for r in results if r.memory_md.written) == ["", "erin", "finn"]
    private = remember(db, "identity", "n", "Erin Smith", owner_id="erin")
    results = files.rebuild_for_rows([private])
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
        assert started.wait(WAIT_S)
        for i in range(300):
            write_atomic(path, versions[i % 3])
    finally:
        stop.set()
        reader.join(WAIT_S)
    assert partial == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["USER.md"]


def test_c5_a_reader_polling_during_many_rebuilds_never_sees_a_partial_file(
    db: Database, files: PromptFiles, fermix_home: Home
) -> None:
    values = ["Lives in Porto " * 10, "Lives in Lisbon"]
    contents = set()
    for value in values:
        remember(db, "identity", "home", value)
        contents.add(files.rebuild("bot").user_md.content.encode())
    path = file_path(fermix_home, "bot", "user_md")
    partial: list[bytes] = []
    started, stop = threading.Event(), threading.Event()
    reader = threading.Thread(
        target=_poll_until_stopped, args=(path, contents, partial, started, stop)
    )
    reader.start()
    try:
        assert started.wait(WAIT_S)
        for i in range(100):
            remember(db, "identity", "home", values[i % 2])
            assert files.rebuild("bot").user_md.written
    finally:
        stop.set()
        reader.join(WAIT_S)
    assert partial == []
    with db.read() as reads:
        assert len(reads.revisions("bot", "user_md")) == 102


def test_c5_a_row_written_while_a_rebuild_renders_is_in_the_files_it_leaves(
    db: Database, files: PromptFiles, fermix_home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process writes a row after the rebuild rendered, before it records: the
    revision and the file are rendered again under the write lock."""
    remember(db, "interest", "a", "Likes chess")
    other = Database(fermix_home.db_path)
    real_render = rebuilding.render_pair
    calls: list[int] = []

    def render_then_another_process_writes(*args: object) -> object:
        rendered = real_render(*args)  # type: ignore[arg-type]
        if not calls:
            remember(other, "interest", "b", "Likes go")  # lands before the write lock
        calls.append(1)
        return rendered

    # A timing seam only: the render itself is the real one, and so is the storage.
    monkeypatch.setattr(rebuilding, "render_pair", render_then_another_process_writes)
    try:
        result = files.rebuild("bot")
    finally:
        other.close()
    assert len(calls) == 2
    assert "Likes go" in result.user_md.content and "Likes go" in result.user_md.path.read_text()
    revision = current(db, "user_md")
    assert revision is not None and revision.content == result.user_md.content


def test_c5_concurrent_writers_and_rebuilders_leave_files_that_match_the_final_rows(
    fermix_home: Home, db: Database, files: PromptFiles
) -> None:
    """Each thread opens its own database and prompt files, as another process would."""
    errors: list[Exception] = []

    def writer() -> None:
        own = Database(fermix_home.db_path)
        try:
            own_files = PromptFiles(fermix_home, own)
            for i in range(40):
                remember(own, "goal", "g", f"Goal number {i}")
                own_files.rebuild("bot")
        finally:
            own.close()

    def rebuilder(done: threading.Event) -> None:
        own = Database(fermix_home.db_path)
        try:
            own_files = PromptFiles(fermix_home, own)
            while not done.is_set():
                own_files.rebuild("bot")
        except (FermixError, OSError) as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            own.close()

    done = threading.Event()
    threads = [threading.Thread(target=rebuilder, args=(done,)) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        writer()
    finally:
        done.set()
        for t in threads:
            t.join(WAIT_S)
    assert errors == []
    final = current(db, "user_md")
    assert final is not None and "Goal number 39" in final.content
    assert on_disk(fermix_home, "bot")[0] == final.content
    assert not files.rebuild("bot").changed


def _assert_file_is_newest_revision(db: Database, home: Home, owner_id: str = "") -> None:
    """The file on disk is its current revision, and that revision a fresh render (C5, P2)."""
    for name in model.RESOURCE_NAMES:
        revision = current(db, name, owner_id)
        path = file_path(home, "bot", name, owner_id)
        text = path.read_text("utf-8") if path.exists() else ""
        assert text == ("" if revision is None else revision.content), name
    assert PromptFiles(home, db).stale() == []


@pytest.mark.parametrize("shared", [True, False], ids=["one-prompt-files", "two-processes"])
def test_c5_p2_two_threads_rebuilding_one_pair_never_leave_the_file_older_than_its_newest_revision(
    db: Database, files: PromptFiles, fermix_home: Home, shared: bool
) -> None:
    """Two threads change the row and rebuild the same pair, round after round, together.

    Whichever records its revision last must also be the one whose file stays: after every
    round (the barrier's action, when both rebuilds returned) the file is the newest
    revision. ``two-processes`` gives each thread its own database and prompt files, so only
    the cross-process lock (flock) orders them.
    """
    rounds = 60
    failures: list[BaseException] = []

    def check() -> None:
        try:
            _assert_file_is_newest_revision(db, fermix_home)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    start, end = threading.Barrier(2, timeout=WAIT_S), threading.Barrier(2, action=check)

    def run(name: str) -> None:
        own_db = db if shared else Database(fermix_home.db_path)
        own = files if shared else PromptFiles(fermix_home, own_db)
        try:
            for i in range(rounds):
                start.wait()
                remember(own_db, "goal", "g", f"Goal {name}{i}")
                own.rebuild("bot")
                end.wait(WAIT_S)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)
            start.abort()
            end.abort()
        finally:
            if not shared:
                own_db.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 4)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    with db.read() as reads:
        assert len(reads.revisions("bot", "user_md")) >= rounds


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe (POSIX)")
def test_m6_a_rebuild_writes_its_files_without_holding_the_database_write_lock(
    db: Database, files: PromptFiles, fermix_home: Home
) -> None:
    """The rebuild's revision commits first; its file write then runs outside the write lock.

    USER.md is a named pipe: the rebuild blocks reading it (to compare bytes) once its
    revision is committed, until this test writes to the pipe. While it is blocked there,
    an append through the same writer commits, and another connection takes the write lock
    at once. Nothing sleeps: each step waits on the previous one.
    """
    remember(db, "identity", "city", "Lives in Porto")
    path = file_path(fermix_home, "bot", "user_md")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    writer = Writer(db, files)
    outcome: list[RebuildResult | BaseException] = []

    def rebuild() -> None:
        try:
            outcome.append(files.rebuild("bot"))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            outcome.append(exc)

    rebuilding = threading.Thread(target=rebuild)
    rebuilding.start()
    opened: list[int] = []
    pipe_open = threading.Event()

    def open_pipe() -> None:
        # Returns once the rebuild opened the pipe to read it: it is in its file stage.
        opened.append(os.open(path, os.O_WRONLY))
        pipe_open.set()

    opener = threading.Thread(target=open_pipe)
    opener.start()
    try:
        assert pipe_open.wait(WAIT_S), f"the rebuild never reached its file write: {outcome}"
        revision = current(db, "user_md")
        assert revision is not None and "Porto" in revision.content  # committed already

        appended = threading.Event()
        key = ConversationKey("bot", "cli", "1")

        def append() -> None:
            writer.append(NewMessage(key, "user", "while the file is written"), trust="operator")
            appended.set()

        appender = threading.Thread(target=append)
        appender.start()
        assert appended.wait(WAIT_S), "an append waited for the rebuild's file write"
        appender.join(WAIT_S)

        other = raw_connect(fermix_home.db_path)
        try:
            other.set_busy_timeout(0)
            other.execute("BEGIN IMMEDIATE")  # raises BusyError if the lock were held
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert rebuilding.is_alive() and outcome == []  # still inside its file write
    finally:
        if not opened:  # the rebuild never opened the pipe: let the opener go
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        opener.join(WAIT_S)
        for fd in opened:
            os.write(fd, b"what was there before")
            os.close(fd)
        rebuilding.join(WAIT_S)
    [result] = outcome
    assert isinstance(result, RebuildResult), result
    assert result.user_md.written and path.is_file()
    assert path.read_text("utf-8") == result.user_md.content
    with db.read() as reads:
        assert [m.content for m in reads.messages(key)] == ["while the file is written"]
    _assert_file_is_newest_revision(db, fermix_home)


def test_c4_rows_that_show_nothing_never_crowd_a_section_out_of_its_newest_facts(
    db: Database, files: PromptFiles
) -> None:
    for i in range(6):
        remember(db, "context", f"fact{i}", f"Context fact {i}")

    def newer_rows_that_never_render(writes: Writes) -> None:
        for i in range(30):  # memory_store rows and blanks
            writes.upsert_row(
                agent_id="bot",
                owner_id="",
                scope=categories.agent_scope("bot"),
                category="context",
                key=f"tool{i}",
                value="\u200b" if i % 2 else f"tool fact {i}",
                promote_target=None if i % 2 == 0 else "memory_md",
            )

    db.write(newer_rows_that_never_render, label="seed")
    memory_md = files.rebuild("bot").memory_md.content
    assert all(f"Context fact {i}" in memory_md for i in range(6))
    assert "tool fact" not in memory_md


def test_c5_a_new_owner_sees_the_agents_shared_rows_on_the_first_compose(fermix_home: Home) -> None:
    from fermix.api import Memory

    with Memory(fermix_home) as memory:
        memory._runtime.services.writer.write_rows(
            lambda w: [
                w.upsert_row(
                    agent_id="bot",
                    owner_id="",
                    scope=categories.agent_scope("bot"),
                    category="directive",
                    key="tone",
                    value="Answers in a friendly tone",
                    promote_target="memory_md",
                )
            ],
            label="seed",
        )
        newcomer = memory.conversation("bot", "cli", "9", owner_id="newcomer")
        system = "\n".join(m["content"] for m in newcomer.compose("sys") if m["role"] == "system")
        assert "Answers in a friendly tone" in system


def test_c5_p1_a_new_owner_s_first_compose_renders_in_memory_and_its_rebuild_writes_later(
    fermix_home: Home, db: Database, files: PromptFiles
) -> None:
    def shared(w: Writes) -> list[MemoryRow]:
        return [
            w.upsert_row(
                agent_id="bot",
                owner_id="",
                scope=categories.agent_scope("bot"),
                category="context",
                key="office",
                value="The office opens at nine",
                promote_target="memory_md",
            )
        ]

    db.write(shared, label="seed")  # no rebuild: nobody has files yet
    commits = db.commits
    folder = prompt_dir(fermix_home, "bot", "newcomer")
    with PairLocks().hold(folder):  # as another process would: the queued rebuild waits
        for _ in range(2):
            assert "opens at nine" in files.texts("bot", "newcomer")[1]
        assert files.pending(("bot", "newcomer"))
        assert db.commits == commits and current(db, "memory_md", "newcomer") is None
        assert on_disk(fermix_home, "bot", "newcomer") == ("", "")
    files.settle()  # the queued rebuild, off the compose's path, writes them
    assert db.commits > commits
    assert "opens at nine" in on_disk(fermix_home, "bot", "newcomer")[1]
    assert current(db, "memory_md", "newcomer") is not None
    commits = db.commits
    assert files.texts("bot", "newcomer") == on_disk(fermix_home, "bot", "newcomer")
    assert db.commits == commits and files.queued == 0
