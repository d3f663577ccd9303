"""The memory server as a background service: ``fermix server start | stop | status`` (A8, N1).

The service is the memory server (:mod:`fermix.server.serving`): a process holding the
runtime of a home open (the database, the write path, the supervised actor tree, the
due-review sweep) and serving it over HTTP and MCP. This module starts, finds and stops
it. It keeps these files in the home, besides ``server.json``:

- ``supervisor.pid``: its pid, created exclusively, so a second start is refused; a pid
  file whose process is gone is stale and replaced;
- ``supervisor.sock``: a Unix socket answering one JSON status document per connection;
- ``supervisor.log``: its log.

``stop`` sends SIGTERM; the service finishes in-flight writes (``Memory.close``), removes
its files and exits. Waiting for it uses ``pidfd_open`` where the kernel has it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fermix.errors import ServiceError
from fermix.home import Home, create_private_file, make_private_dir

log = logging.getLogger(__name__)

PID_FILE = "supervisor.pid"
SOCKET_FILE = "supervisor.sock"
LOG_FILE = "supervisor.log"
READY_LINE = "fermix-server-ready"
WATCH_S = 5.0
"""How often the service checks whether its actor tree gave up."""


@dataclass(frozen=True)
class ServicePaths:
    """Where the service's files live in a home."""

    pid: Path
    socket: Path
    log: Path

    @classmethod
    def of(cls, home: Home) -> ServicePaths:
        """The service files of ``home``."""
        return cls(home.root / PID_FILE, home.root / SOCKET_FILE, home.root / LOG_FILE)


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (and is not a zombie we could reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def read_pid(paths: ServicePaths) -> int | None:
    """The pid in the pid file, or None if there is no readable pid file."""
    try:
        return int(paths.pid.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def running_pid(paths: ServicePaths) -> int | None:
    """The pid of the running service, or None (a stale pid file counts as not running)."""
    pid = read_pid(paths)
    return pid if pid is not None and pid_alive(pid) else None


def claim_pid_file(paths: ServicePaths) -> None:
    """Write this process's pid exclusively; replace a stale file; refuse a live one."""
    for _ in range(2):
        try:
            fd = os.open(paths.pid, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pid = read_pid(paths)
            if pid is not None and pid != os.getpid() and pid_alive(pid):
                raise ServiceError(f"the server already runs (pid {pid})") from None
            log.warning("replacing stale pid file %s (pid %s)", paths.pid, pid)
            paths.pid.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as out:
            out.write(f"{os.getpid()}\n")
        return
    raise ServiceError(f"could not claim {paths.pid}")


def query_status(paths: ServicePaths, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the running service for its status document."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(paths.socket))
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise ServiceError(f"the server does not answer on {paths.socket}: {exc}") from exc
    data: dict[str, Any] = json.loads(b"".join(chunks).decode("utf-8"))
    return data


class StatusServer:
    """Answers each connection on the Unix socket with ``status()`` as JSON, then closes it."""

    def __init__(self, path: Path, status: Callable[[], dict[str, Any]]) -> None:
        self._path = path
        self._status = status
        path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, name="fermix-status", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # the socket was closed: the service is stopping
            with conn, contextlib.suppress(OSError):
                conn.sendall(json.dumps(self._status()).encode("utf-8"))

    def close(self) -> None:
        """Stop answering and remove the socket file."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._path.unlink(missing_ok=True)


def start_background(home: Home, *, timeout: float = 30.0, extra: list[str] | None = None) -> int:
    """Start the service as a detached process; return its pid once it is ready."""
    paths = ServicePaths.of(home)
    pid = running_pid(paths)
    if pid is not None:
        raise ServiceError(f"the server already runs (pid {pid})")
    make_private_dir(home.root)
    create_private_file(paths.log)
    with open(paths.log, "ab") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fermix.cli",
                "--home",
                str(home.root),
                "server",
                "start",
                "--foreground",
                "--announce",
                *(extra or []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
        )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode("utf-8", "replace").strip() if ready else ""
    proc.stdout.close()
    if line != READY_LINE:
        code = proc.poll()
        detail = f"it exited with code {code}" if code is not None else "it did not get ready"
        raise ServiceError(f"the server did not start: {detail}; see {paths.log}")
    return proc.pid


def stop(home: Home, *, timeout: float = 30.0) -> int | None:
    """Ask the running service to stop and wait for it; return its pid (None: not running)."""
    paths = ServicePaths.of(home)
    pid = running_pid(paths)
    if pid is None:
        paths.pid.unlink(missing_ok=True)
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid
    if not wait_for_exit(pid, timeout):
        raise ServiceError(f"the server (pid {pid}) did not stop within {timeout} s")
    return pid


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait until process ``pid`` has ended; False if it still runs after ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
        return _poll_exit(pid, timeout)
    try:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return not pid_alive(pid)
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                return True
    finally:
        os.close(fd)


def _poll_exit(pid: int, timeout: float) -> bool:
    # Kernels without pidfd_open: poll, since another process's exit cannot be waited on.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)
