"""A fork server for tests that run hosts in child processes (the soak, two hosts at once).

A fresh Python process that reviews imports litellm, which costs seconds of CPU: a soak that
kills its host a dozen times, or a test with two hosts, would spend its time importing. The
zygote imports fermix, litellm and the host workload once, then forks one child per request.
Each child runs ``<module>.main(argv)`` with the requester's pipes as its stdin, stdout and
stderr, and the requester gets a pidfd of it: a signal through the pidfd reaches exactly that
process (no pid reuse), and a ``select`` on it says when the process has ended.

:class:`Zygote` starts ``python tests/soak/zygote.py FD MODULE...`` (FD: its end of a Unix
SEQPACKET socket pair; MODULEs: imported before forking) and asks it for children. Linux
only (pidfds), like the CI machine.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent


class LineReader:
    """Whole lines from a pipe, read without blocking; the rest stays buffered."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.closed = False
        self._buffer = b""

    def read_available(self) -> list[str]:
        """Read what the pipe holds now; return the complete lines (EOF closes the reader)."""
        data = os.read(self.fd, 1 << 16)
        if not data:
            self.closed = True
            rest, self._buffer = self._buffer, b""
            return [rest.decode("utf-8", "replace")] if rest else []
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]


class Child:
    """A forked host: its pid, a pidfd, its stdin, and readers of its stdout and stderr."""

    def __init__(self, pid: int, pidfd: int, in_fd: int, out_fd: int, err_fd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.in_fd = in_fd
        self.out = LineReader(out_fd)
        self.err = LineReader(err_fd)
        self.stderr: list[str] = []

    def send(self, line: str) -> None:
        """Write one line to the child's stdin."""
        os.write(self.in_fd, line.encode("utf-8") + b"\n")

    def lines(self, deadline: float) -> list[str]:
        """Stdout lines that arrive before ``deadline`` (monotonic), waiting for at least one
        unless stdout is closed; stderr is collected on the way."""
        while True:
            readers = [r for r in (self.out, self.err) if not r.closed]
            if not readers:
                return []
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            ready, _, _ = select.select([r.fd for r in readers], [], [], remaining)
            got: list[str] = []
            for reader in readers:
                if reader.fd in ready:
                    lines = reader.read_available()
                    if reader is self.err:
                        self.stderr += lines
                    else:
                        got += lines
            if got or self.out.closed:
                return got

    def kill(self) -> None:
        """SIGKILL, through the pidfd: never another process that reused the pid."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it had ended already

    def wait(self, timeout: float) -> bool:
        """Whether the process ended within ``timeout`` seconds."""
        ready, _, _ = select.select([self.pidfd], [], [], timeout)
        return bool(ready)

    def drain(self, timeout: float = 30.0) -> list[str]:
        """Every stdout line left once the process has ended (its pipes reach EOF)."""
        deadline = time.monotonic() + timeout
        got: list[str] = []
        while not (self.out.closed and self.err.closed):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"pipes of child {self.pid} still open after {timeout}s")
            got += self.lines(deadline)
        return got

    def close(self) -> None:
        """Kill it if it still runs, and close every descriptor."""
        self.kill()
        self.wait(10)
        for fd in (self.pidfd, self.in_fd, self.out.fd, self.err.fd):
            try:
                os.close(fd)
            except OSError:
                pass


class Zygote:
    """The test side: start the fork server, ask it for children, stop it."""

    def __init__(self, *preload: str, env: dict[str, str] | None = None) -> None:
        self._preload = preload
        self._env = env
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()

    def start(self, timeout: float = 300.0) -> Zygote:
        """Start the server and wait until its imports are done (they take seconds)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        env = {**os.environ, **(self._env or {})}
        env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        self._proc = subprocess.Popen(
            [sys.executable, str(HERE / "zygote.py"), str(theirs.fileno()), *self._preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
        )
        theirs.close()
        ready, _, _ = select.select([ours], [], [], timeout)
        if not ready or ours.recv(64) != b"ready":
            raise RuntimeError(f"the zygote did not start: {self.log()}")
        return self

    def spawn(self, module: str, argv: list[str]) -> Child:
        """Fork a child that runs ``module.main(argv)``."""
        assert self._sock is not None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            request = json.dumps({"module": module, "argv": argv}).encode()
            socket.send_fds(self._sock, [request], [in_r, out_w, err_w])
        finally:
            # Only the child may hold these ends: its stdout reaches EOF when it ends.
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        ready, _, _ = select.select([self._sock], [], [], 60)
        if not ready:
            raise RuntimeError(f"the zygote did not answer: {self.log()}")
        reply, fds, _, _ = socket.recv_fds(self._sock, 1024, 1)
        if not fds:
            raise RuntimeError(f"the zygote could not fork: {reply!r} {self.log()}")
        return Child(json.loads(reply)["pid"], fds[0], in_w, out_r, err_r)

    def log(self) -> str:
        """What the zygote itself printed (its import warnings, a traceback)."""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def close(self) -> None:
        """Stop the server (its children are the caller's to kill)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._log.close()

    def __enter__(self) -> Zygote:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


PRELOAD = ("soak.host", "soak.twin")
"""What the shared zygote imports: the workloads of the soak and of the two-host tests."""

_shared: list[Zygote] = []


def shared(config: Any) -> Zygote:
    """The session's zygote, started on first use and stopped when pytest ends (``config``
    is pytest's, whose cleanup stops it): its imports are paid once for every test file."""
    if not _shared:
        zygote = Zygote(*PRELOAD).start()
        _shared.append(zygote)
        config.add_cleanup(zygote.close)
        config.add_cleanup(_shared.clear)
    return _shared[0]


# -- the server side --------------------------------------------------------------------


def _run_child(request: dict[str, Any], fds: list[int], sock: socket.socket) -> None:
    """In the forked child: take the pipes as stdin, stdout and stderr, run the module, exit."""
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
    code = 1
    try:
        module = importlib.import_module(request["module"])
        code = int(module.main(request["argv"]) or 0)
    except BaseException:  # noqa: BLE001 - printed for the test; the child exits anyway
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _serve(fd: int, preload: list[str]) -> None:
    sys.path[:0] = [str(HERE), str(TESTS)]
    for name in preload:
        importlib.import_module(name)
    sock = socket.socket(fileno=fd)
    sock.send(b"ready")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        except ConnectionResetError:
            break
        if not message:
            break  # the test closed its end
        _reap()
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            _run_child(request, fds, sock)
        for received in fds:
            os.close(received)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)
    _reap()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2:])
