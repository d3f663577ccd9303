"""The memory server under load and under SIGKILL: nothing acknowledged is lost (N3, N8).

Real processes on loopback: the server is ``fermix server start --foreground`` on a
fixed port; the load is 32 keep-alive clients (aiohttp sessions, one connection each) in
this process, appending to 1,000 conversations. Each conversation is fed by one client,
in order, so "in per-conversation order" has a meaning: a client's appends to one
conversation are acknowledged one after another, and the stored order must be theirs.

Every append carries its client key. A client whose request fails (connection refused or
reset while the server is down, a 503) sends the same request again, with the same key,
until it is acknowledged: the server stores it once (N3), whether the first attempt
committed before the kill or not.

``FERMIX_SOAK_KILLS`` sets the kills of the soak (3 by default; more by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fermix.home import Home
from fermix.model import ConversationKey
from fermix.runtime.access import Tokens
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage.sqlite.database import Database
from fermix.wire import encode_handle

pytestmark = pytest.mark.slow

CLIENTS = 32
CONVERSATIONS = 1_000
AGENT = "assistant"
READY_S = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _make_token(home: Path) -> str:
    db = Database(Home(home).db_path, readers=1)
    try:
        _, secret = Tokens(db, Writer(db, PromptFiles(Home(home), db))).create([AGENT])
    finally:
        db.close()
    return secret


class ServerProcess:
    """A ``fermix server start --foreground`` process on a fixed loopback port."""

    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home.parent / "server.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
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
                    "--port",
                    str(self.port),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited: {self.log.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock,
            ):
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return
            time.sleep(0.05)  # polling another process's port, not a thread of ours
        raise AssertionError(f"the server did not answer within {READY_S} s")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    token = _make_token(home)
    proc = ServerProcess(home, _free_port())
    proc.start()
    try:
        yield proc, token
    finally:
        proc.stop()


@dataclass
class Client:
    """One keep-alive client: its conversations, and what the server acknowledged."""

    index: int
    handles: list[str]
    acked: dict[str, list[str]] = field(default_factory=dict)  # handle -> texts, in order
    retries: int = 0


def _handle(i: int) -> str:
    return encode_handle(ConversationKey(AGENT, "load", f"chat-{i}", ""), f"user-{i}", "guest")


async def _append(
    session: aiohttp.ClientSession, url: str, handle: str, text: str, key: str, client: Client
) -> dict[str, Any]:
    """POST one append until it is acknowledged, the same key every time (N3)."""
    body = {"role": "user", "text": text, "client_key": key}
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.post(
                f"{url}/v1/conversations/{handle}/messages", json=body
            ) as response:
                if response.status in (200, 201):
                    stored: dict[str, Any] = await response.json()
                    return stored
                if response.status != 503:
                    raise AssertionError(f"{response.status}: {await response.text()}")
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            # Refused, reset, or cut off mid-answer by the kill: send it again, same key.
            pass
        client.retries += 1
        if time.monotonic() > deadline:
            raise AssertionError(f"append {key} was never acknowledged")
        await asyncio.sleep(0.02)  # back off before a retry, as a real client does


async def _run_client(
    url: str, token: str, client: Client, rounds: int, stop: asyncio.Event | None
) -> None:
    connector = aiohttp.TCPConnector(limit=1, force_close=False)
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(
        connector=connector, headers=headers, timeout=timeout
    ) as session:
        for n in range(rounds):
            if stop is not None and stop.is_set():
                return
            for handle in client.handles:
                done = client.acked.setdefault(handle, [])
                text = f"c{client.index} {handle[-6:]} #{len(done)}"
                key = f"c{client.index}-{handle[-12:]}-{len(done)}"
                stored = await _append(session, url, handle, text, key, client)
                assert stored["content"] == text
                done.append(text)
            del n


def _clients() -> list[Client]:
    return [
        Client(i, [_handle(c) for c in range(i, CONVERSATIONS, CLIENTS)]) for i in range(CLIENTS)
    ]


def _check_stored(home: Path, clients: list[Client]) -> int:
    """Every acknowledged append stored once, in its client's order; returns the count."""
    db = Database(Home(home).db_path, readers=1)
    checked = 0
    try:
        with db.read() as reads:
            for client in clients:
                for handle, texts in client.acked.items():
                    chat = f"chat-{int(handle_chat(handle))}"
                    key = ConversationKey(AGENT, "load", chat, "")
                    stored = [m.content for m in reads.messages(key)]
                    assert stored == texts, f"{chat}: stored {stored[:5]}..., acked {texts[:5]}..."
                    checked += len(texts)
    finally:
        db.close()
    return checked


def handle_chat(handle: str) -> str:
    from fermix.wire import decode_handle

    key, _, _ = decode_handle(handle)
    return key.chat_id.removeprefix("chat-")


def test_n8_32_keep_alive_clients_on_1000_conversations_lose_nothing(
    server: tuple[ServerProcess, str],
) -> None:
    """32 clients, 1,000 conversations: every acknowledged append is there, in order, once."""
    proc, token = server
    clients = _clients()

    async def load() -> None:
        await asyncio.gather(*(_run_client(proc.url, token, c, 3, None) for c in clients))

    asyncio.run(load())
    proc.stop()
    assert _check_stored(proc.home, clients) == CONVERSATIONS * 3


def test_n8_sigkill_under_load_loses_no_acknowledged_append(
    server: tuple[ServerProcess, str],
) -> None:
    """SIGKILL the server many times under load; after each restart the clients retry with
    their keys: every acknowledged append is stored exactly once, in order (N3, N8)."""
    proc, token = server
    kills = int(os.environ.get("FERMIX_SOAK_KILLS", "3"))
    clients = _clients()
    rng = random.Random(8)

    async def soak() -> None:
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_run_client(proc.url, token, c, 1_000_000, stop)) for c in clients
        ]
        loop = asyncio.get_running_loop()
        for _ in range(kills):
            before = sum(len(t) for c in clients for t in c.acked.values())
            await asyncio.sleep(rng.uniform(0.3, 1.0))  # let load build up before the kill
            await loop.run_in_executor(None, proc.kill)
            await loop.run_in_executor(None, proc.start)
            after = sum(len(t) for c in clients for t in c.acked.values())
            assert after >= before
        await asyncio.sleep(0.5)  # some load after the last restart
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(soak())
    proc.stop()
    total = _check_stored(proc.home, clients)
    assert total > CLIENTS * kills
    retried = sum(c.retries for c in clients)
    print(json.dumps({"kills": kills, "acknowledged": total, "retries": retried}))
    assert retried > 0, "no client saw a kill: the soak did not test anything"
