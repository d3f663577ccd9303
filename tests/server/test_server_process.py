"""The memory server as a process: where it listens, its files, its replica (N1, N2, N9)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix.cli import main
from fermix.config import ServerConfig
from fermix.errors import ServiceError
from fermix.server.serving import Listen, is_loopback

READY_S = 30.0


def test_n2_loopback_addresses_are_recognised() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert not is_loopback("example.com")


def test_n2_a_public_address_is_refused_without_tls_in_front() -> None:
    with pytest.raises(ServiceError, match="TLS") as caught:
        Listen.of(ServerConfig(), host="0.0.0.0")
    assert "--allow-public-bind" in str(caught.value)
    assert Listen.of(ServerConfig(), host="0.0.0.0", allow_public=True).host == "0.0.0.0"
    assert Listen.of(ServerConfig(host="0.0.0.0", allow_public_bind=True)).host == "0.0.0.0"
    # A Unix socket never crosses the network: no address check.
    assert Listen.of(ServerConfig(host="0.0.0.0"), socket="/tmp/x.sock").socket == "/tmp/x.sock"


def test_n2_the_command_refuses_a_public_address_and_says_why(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--home", str(home), "server", "start", "--foreground", "--host", "0.0.0.0"])
    assert code != 0
    err = capsys.readouterr().err
    assert "not a loopback address" in err and "TLS" in err
    assert not (home / "supervisor.pid").exists()
    assert not (home / "server.json").exists()


def _start(home: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fermix.cli",
            "--home",
            str(home),
            "server",
            "start",
            "--foreground",
            *args,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(home.parent / "server.log", "ab"),
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )


def _wait_for_server_file(home: Path, proc: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + READY_S
    path = home / "server.json"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError((home.parent / "server.log").read_text()[-2000:])
        if path.exists():
            data: dict[str, object] = json.loads(path.read_text())
            return data
        time.sleep(0.05)  # another process's file, not a thread of ours
    raise AssertionError("server.json never appeared")


def _get(url_or_socket: str, path: str, *, unix: bool = False) -> tuple[int, bytes]:
    if unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(url_or_socket)
    else:
        host, port = url_or_socket.removeprefix("http://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
    with sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


@pytest.mark.slow
def test_n1_n2_server_json_is_private_and_names_where_it_answers(
    home: Path, stopped: list[subprocess.Popen[bytes]]
) -> None:
    proc = _start(home, "--port", "0")
    stopped.append(proc)
    data = _wait_for_server_file(home, proc)
    assert data["pid"] == proc.pid
    assert stat.S_IMODE((home / "server.json").stat().st_mode) == 0o600
    url = str(data["url"])
    assert url.startswith("http://127.0.0.1:")
    status, body = _get(url, "/v1/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = _get(url, "/openapi.json")
    assert status == 200 and json.loads(body)["info"]["title"] == "fermix memory server"
    status, body = _get(url, "/v1/conversations/x/messages")
    assert status == 401 and json.loads(body)["error"]["type"] == "unauthorized"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not (home / "server.json").exists()
    assert not (home / "supervisor.pid").exists()


@pytest.mark.slow
def test_n2_the_server_listens_on_a_unix_socket(
    home: Path, tmp_path: Path, stopped: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "fx.sock"
    proc = _start(home, "--socket", str(path))
    stopped.append(proc)
    data = _wait_for_server_file(home, proc)
    assert data["url"] == f"http+unix://{path}"
    status, body = _get(str(path), "/v1/health", unix=True)
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.mark.slow
def test_n9_the_server_replicates_while_it_runs_and_stops_litestream_with_it(
    home: Path, tmp_path: Path, stopped: list[subprocess.Popen[bytes]]
) -> None:
    replica = tmp_path / "replica"
    (home / "config.toml").write_text(
        f'[fermix_core.replica]\nurl = "file://{replica}"\n', encoding="utf-8"
    )
    proc = _start(home, "--port", "0")
    stopped.append(proc)
    _wait_for_server_file(home, proc)
    pid_file = home / "replica.pid"
    assert pid_file.exists()
    litestream = int(pid_file.read_text().strip())
    os.kill(litestream, 0)  # runs
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(litestream, 0)
    assert any(replica.rglob("*")), "Litestream shipped nothing to the replica"


@pytest.mark.slow
def test_n5_the_server_serves_mcp_beside_the_http_api(server: Any) -> None:
    """The memory server mounts MCP at /mcp/ with the same tokens: a fact stored through
    MCP is a memory row the HTTP client lists (N5)."""
    import anyio
    from mcp_support import http_client

    async def session() -> None:
        async with http_client(f"{server.url}/mcp/", server.host_token, owner="ana") as client:
            stored = await client.call_tool("memory_store", {"key": "city", "value": "Porto"})
            assert not stored.is_error

    anyio.run(session)
    with server.client() as client:
        rows = client.list_rows(agent_id="assistant", key="city")
    assert [r.value for r in rows] == ["Porto"]
