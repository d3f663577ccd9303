"""Owner-only files whatever the umask (M10): the home 0700, the database and its WAL/SHM,
the prompt files, their temporary files and config.toml 0600, their folders 0700; a
looser path that already exists is left alone by a host, named by ``fermix doctor`` and
tightened by ``--fix``.

Each test runs its creating code under a umask of 022 (the usual one) and 000 (the worst),
set and restored in the test. SQLite gives the ``-wal`` and ``-shm`` files it creates the
database file's own permission bits, so the WAL/SHM assertions check that the database is
created 0600 before SQLite opens it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix import Memory
from fermix.cli import main
from fermix.cli.doctor_checks import diagnosis as doctor
from fermix.cli.doctor_checks import outcome
from fermix.clock import now_ms
from fermix.core import categories
from fermix.home import Home
from fermix.runtime.prompt_files import PromptFiles, disk
from fermix.storage import Writes
from fermix.storage.sqlite.database import Database

AGENT = "assistant"
OWNERS = ("", "alice", "telegram:42")  # the default owner, a safe id, an id made a digest


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under this process umask, restoring the previous one after it."""
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    """A home that does not exist yet (fermix creates it), set as ``FERMIX_HOME``."""
    root = tmp_path / "home"
    monkeypatch.setenv("FERMIX_HOME", str(root))
    return Home(root)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _open_to_others(paths: list[Path]) -> dict[str, str]:
    """Each of ``paths`` with a group or other bit set, with its mode; every one must exist."""
    missing = [str(p) for p in paths if not p.exists()]
    assert missing == [], "the test meant to check these paths, but they do not exist"
    return {str(p): f"{_mode(p):04o}" for p in paths if _mode(p) & 0o077}


def _database_files(db_path: Path) -> list[Path]:
    return [db_path, db_path.with_name(db_path.name + "-wal"), db_path.with_name("memory.db-shm")]


def _tree(root: Path) -> list[Path]:
    """``root`` and every folder and file under it."""
    return [root, *sorted(root.rglob("*"))]


def _remember(owner_id: str, value: str) -> object:
    """A write unit storing one USER.md fact of ``owner_id``."""

    def unit(w: Writes) -> object:
        return w.upsert_row(
            agent_id=AGENT,
            owner_id=owner_id,
            scope=categories.owner_scope(owner_id),
            category="preference",
            key="coffee",
            value=value,
            promote_target="user_md",
        )

    return unit


def test_m10_a_started_memory_creates_the_home_0700_and_the_database_wal_and_shm_0600(
    umask: int, fresh_home: Home
) -> None:
    with Memory(fresh_home) as memory:
        memory.conversation(AGENT, "telegram", "42").append_user("I drink espresso")
        # While it is open the WAL and its index exist: they are checked too.
        loose = _open_to_others([fresh_home.root, *_database_files(fresh_home.db_path)])
    assert loose == {}
    assert _mode(fresh_home.root) == 0o700 and _mode(fresh_home.db_path) == 0o600


def test_m10_opening_a_new_database_creates_its_folder_0700_and_the_file_wal_and_shm_0600(
    umask: int, tmp_path: Path
) -> None:
    path = tmp_path / "new" / "deeper" / "memory.db"
    db = Database(path)
    try:
        db.write(_remember("", "espresso"), label="test")
        with db.read() as reads:
            assert reads.schema_version() > 0
        loose = _open_to_others([path.parent.parent, path.parent, *_database_files(path)])
    finally:
        db.close()
    assert loose == {}
    assert [_mode(p) for p in (path.parent.parent, path.parent, path)] == [0o700, 0o700, 0o600]


def test_m10_rebuilt_prompt_files_their_temporary_files_and_their_folders_are_owner_only(
    umask: int, fresh_home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(fresh_home.db_path)
    try:
        for owner in OWNERS:
            db.write(_remember(owner, f"espresso ({owner or 'default'})"), label="test")
        # Each temporary file is fsynced before its rename: see its mode at that moment.
        synced: list[int] = []
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            synced.append(stat.S_IMODE(os.fstat(fd).st_mode))
            real_fsync(fd)

        monkeypatch.setattr(disk.os, "fsync", fsync)
        PromptFiles(fresh_home, db).rebuild_agent(AGENT)
        monkeypatch.undo()
    finally:
        db.close()
    written = [disk.paths(fresh_home, AGENT, owner)[0] for owner in OWNERS]  # USER.md
    assert all(p.exists() for p in written)
    assert _open_to_others(_tree(fresh_home.root / "memory")) == {}
    assert {_mode(p) for p in written} == {0o600}
    assert synced and all(mode & 0o077 == 0 for mode in synced)  # temp files and folders


def test_m10_config_toml_written_by_the_cli_on_a_new_home_is_0600(
    umask: int, fresh_home: Home
) -> None:
    assert main(["config", "set", "fermix_core.memory.review_interval_hours", "6"]) == 0
    assert _open_to_others([fresh_home.root, fresh_home.config_path]) == {}
    assert _mode(fresh_home.config_path) == 0o600


def test_m10_a_host_leaves_an_existing_looser_database_and_home_as_they_are(
    fresh_home: Home,
) -> None:
    Database(fresh_home.db_path).close()
    os.chmod(fresh_home.root, 0o755)
    os.chmod(fresh_home.db_path, 0o644)
    with Memory(fresh_home) as memory:
        memory.conversation(AGENT, "telegram", "42").append_user("hello")
    assert (_mode(fresh_home.root), _mode(fresh_home.db_path)) == (0o755, 0o644)


def _permissions(home: Home, *, fix: bool = False) -> tuple[outcome.Check, list[str]]:
    report = doctor.diagnose(home, now=now_ms(), fix=fix)
    return {c.name: c for c in report.checks}["permissions"], report.fixed


def test_m10_doctor_warns_about_a_0644_database_and_a_0755_home_and_fix_makes_them_owner_only(
    fresh_home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    db = Database(fresh_home.db_path)
    try:
        db.write(_remember("alice", "espresso"), label="test")
        PromptFiles(fresh_home, db).rebuild_agent(AGENT)
    finally:
        db.close()
    check, _ = _permissions(fresh_home)
    assert check.status == "pass"  # what fermix created is owner-only

    user_md = disk.paths(fresh_home, AGENT, "alice")[0]
    loosened = {
        fresh_home.root: 0o755,
        fresh_home.db_path: 0o644,
        user_md.parent: 0o750,
        user_md: 0o640,
    }
    for path, mode in loosened.items():
        os.chmod(path, mode)

    check, _ = _permissions(fresh_home)
    assert check.status == "warn" and check.fix == "permissions"
    assert "the home (0755)" in check.summary and "memory.db (0644)" in check.summary
    assert {d["path"]: d["mode"] for d in check.details} == {
        str(p): f"{m:04o}" for p, m in loosened.items()
    }
    assert "--fix" in check.hint

    assert main(["doctor"]) == 0  # a warning, not a failure
    out = capsys.readouterr().out
    assert "warn  permissions" in out and "memory.db (0644)" in out

    check, fixed = _permissions(fresh_home, fix=True)
    assert fixed == ["made 4 path(s) owner-only (removed group and other bits)"]
    assert check.status == "pass"
    assert [_mode(p) for p in loosened] == [0o700, 0o600, 0o700, 0o600]
    check, fixed = _permissions(fresh_home)
    assert check.status == "pass" and fixed == []
