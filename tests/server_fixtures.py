"""The memory server as a real process, for the tests of its HTTP API and client (N1, N2).

``start_server(config="", *, socket=False)`` writes ``config`` (TOML text) to the test
home's ``config.toml``, makes two tokens, then starts ``python -m fermix.cli server
start --foreground --port 0`` (or on a Unix socket) and waits, with a deadline, until its
``server.json`` names where it listens and ``/v1/health`` answers there. ``server`` is one
started with no config. Each started server is stopped with SIGTERM after the test (it
finishes in-flight writes and closes the memory), and killed if it does not stop in time.

What a test gets (:class:`ServerProcess`): ``.url``, ``.home``, ``.process``,
``.host_token`` (agents ``["assistant"]``, a host's), ``.operator_token`` (agents
``["assistant"]``, operator), ``.restart()``, ``.stop()``, ``.create_token(...)`` and
``.revoke_token(id)`` (through the home's database, as ``fermix token`` does: a running
server sees them from its next request), ``.client(token=None)`` (a
:class:`fermix.Client`, closed after the test) and ``.log()``.

Registered in ``tests/conftest.py`` through ``pytest_plugins``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fermix.cli.context import CommandContext
from fermix.home import Home
from fermix.model import ApiToken
from fermix.remote import Client
from fermix.runtime.access import Tokens
from fermix.server.serving import read_server_file

AGENT = "assistant"
"""The agent both tokens of a started server act for."""
READY_S = 60.0
"""How long a server may take to start listening (imports, migration, the actor tree)."""
STOP_S = 30.0
POLL_S = 0.05
"""Between looks at another process's files and port: not a wait on a thread of ours."""


@dataclass
class ServerProcess:
    """One memory server process on a test's home, and its tokens."""

    home: Path
    host_token: str
    operator_token: str
    socket: Path | None = None
    process: subprocess.Popen[bytes] = field(init=False)
    url: str = field(init=False, default="")
    _clients: list[Client] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        """Where the server's output goes (beside the home, not in it)."""
        return self.home.parent / "server.log"

    def log(self, tail: int = 4000) -> str:
        """The end of the server's log, for an assertion's message."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def start(self) -> None:
        """Start the process and wait until it answers ``/v1/health``."""
        where = ["--socket", str(self.socket)] if self.socket else ["--port", "0"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fermix.cli",
                    "--home",
                    str(self.home),
                    "server",
                    "start",
                    "--foreground",
                    *where,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
        self.url = self._wait_ready()

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited {self.process.returncode}:\n{self.log()}")
            document = read_server_file(Home(self.home))
            if document is not None and document.get("pid") == self.process.pid:
                url = str(document["url"])
                if _healthy(url):
                    return url
            time.sleep(POLL_S)
        self.stop()
        raise AssertionError(f"the server did not answer within {READY_S} s:\n{self.log()}")

    def stop(self) -> int | None:
        """SIGTERM, then wait for it to finish its writes and exit; its exit code."""
        for client in self._clients:
            client.close()
        process = getattr(self, "process", None)
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_S)
                raise AssertionError(f"the server ignored SIGTERM:\n{self.log()}") from None
        return process.returncode

    def restart(self) -> None:
        """Stop the server gracefully and start it again on the same home (a new port)."""
        self.stop()
        self.start()

    def client(self, token: str | None = None, **keywords: Any) -> Client:
        """A :class:`fermix.Client` of this server (the host token unless given)."""
        client = Client(self.url, self.host_token if token is None else token, **keywords)
        self._clients.append(client)
        return client

    def create_token(
        self, agents: list[str], *, operator: bool = False, name: str = ""
    ) -> tuple[ApiToken, str]:
        """Make a token as ``fermix token create`` does; the token and its secret."""
        return _with_tokens(self.home, lambda t: t.create(agents, operator=operator, name=name))

    def revoke_token(self, token_id: int) -> ApiToken:
        """Revoke a token as ``fermix token revoke`` does."""
        revoked: ApiToken = _with_tokens(self.home, lambda t: t.revoke(token_id))
        return revoked


def _with_tokens(home: Path, use: Callable[[Tokens], Any]) -> Any:
    context = CommandContext(Home(home))
    try:
        return use(Tokens(context.db(), context.writer()))
    finally:
        context.close()


def _healthy(url: str) -> bool:
    if url.startswith("http+unix://"):
        return _unix_healthy(url.removeprefix("http+unix://"))
    try:
        with urllib.request.urlopen(f"{url}/v1/health", timeout=5) as answer:
            return bool(json.loads(answer.read())["status"] == "ok")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _unix_healthy(path: str) -> bool:
    from fermix.errors import FermixError

    probe = Client(f"http+unix://{path}", "fmx_probe", retries=0, timeout=5)
    try:
        return probe.health().get("status") == "ok"
    except FermixError:
        return False
    finally:
        probe.close()


StartServer = Callable[..., ServerProcess]


def launch(home: Path, config: str = "", *, socket: bool = False) -> ServerProcess:
    """Write ``config``, make the two tokens, start a server on ``home`` (see the module)."""
    if config:
        (home / "config.toml").write_text(config, encoding="utf-8")
    host, host_secret = _with_tokens(home, lambda t: t.create([AGENT], name="host"))
    _, operator_secret = _with_tokens(
        home, lambda t: t.create([AGENT], operator=True, name="operator")
    )
    assert not host.operator
    server = ServerProcess(
        home,
        host_secret,
        operator_secret,
        # A short path: a Unix socket's path is limited to about 100 bytes.
        socket=Path(tempfile.mkdtemp(prefix="fx-")) / "s.sock" if socket else None,
    )
    try:
        server.start()
    except BaseException:
        _cleanup(server)
        raise
    return server


def _cleanup(server: ServerProcess) -> None:
    server.stop()
    if server.socket is not None:
        shutil.rmtree(server.socket.parent, ignore_errors=True)


@pytest.fixture
def start_server(home: Path) -> Iterator[StartServer]:
    """Start memory servers on the test's home: ``start_server(config="", *, socket=False)``
    (``config``: TOML text for ``config.toml``); each is stopped after the test."""
    started: list[ServerProcess] = []

    def start(config: str = "", *, socket: bool = False) -> ServerProcess:
        server = launch(home, config, socket=socket)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        _cleanup(server)


@pytest.fixture
def server(start_server: StartServer) -> ServerProcess:
    """A memory server started on the test's home with no config (no model: reviews and
    compaction are skipped), and its host and operator tokens."""
    return start_server()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server (no config) shared by a module's tests, which keep apart by using their
    own chat ids: a start costs a second or two. Not for tests that restart or
    reconfigure it."""
    home = tmp_path_factory.mktemp("server") / "home"
    home.mkdir(mode=0o700)
    server = launch(home)
    yield server
    _cleanup(server)
