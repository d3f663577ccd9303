"""Two hosts and the CLI on one database at once (S8, A3, E2).

Each host is the real tree in its own process (``tests/soak/twin.py``, forked by the shared
zygote), driven one JSON command at a time over its stdin; the model server runs in this
process, on loopback, so the test can count its requests and hold an answer back. The CLI
runs as separate ``python -m fermix.cli`` processes on the same home.

- No "database is locked" ever reaches a caller: not when both hosts start on a fresh home
  (both migrate), not under concurrent appends and memory writes with CLI commands beside.
- No review runs twice: both hosts review the same conversation at once, the model is
  asked once, and the other host reports ``claimed`` (or ``no_new_messages``).
- Each host's reads (``Memory.get_row`` / ``list_rows``, no cache) see the other's writes,
  and the CLI's restore, at once.

Slow (processes, a zygote, hundreds of writes): ``bin/test -m "not slow"`` leaves it out.
"""

from __future__ import annotations

import json
import random
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer, Step
from soak.cli import ERROR_MARKS, CliLoop
from soak.zygote import Child, Zygote

from fermix.model import ConversationKey
from fermix.storage import messages
from fermix.storage.sqlite.connection import fetch_rows
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.sql import SqliteSql

pytestmark = pytest.mark.slow

AGENT = "twin"
ANSWER_S = 60.0


class GatedModelServer(ModelServer):
    """The loopback model server, holding every answer until :attr:`gate` is set."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gate = threading.Event()

    def _take(self, body: dict[str, Any], headers: dict[str, str]) -> Step:
        step = super()._take(body, headers)
        self.gate.wait(ANSWER_S)
        return step

    def requests_mentioning(self, text: str) -> int:
        """How many requests carry ``text`` in their messages (a review's user messages)."""
        with self._lock:
            return sum(text in json.dumps(r.get("messages")) for r in self.requests)


class Host:
    """A twin host process: send it commands, read its answers."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self._lines: deque[str] = deque()

    def send(self, op: str, **arguments: Any) -> None:
        self.child.send(json.dumps({"op": op, **arguments}))

    def has_answer(self) -> bool:
        return bool(self._lines)

    def read_ready(self) -> None:
        """Take whatever the process has written (after a select said it wrote)."""
        self._lines.extend(self.child.lines(time.monotonic() + 0.01))

    def recv(self, timeout: float = ANSWER_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self._lines:
            lines = self.child.lines(deadline)
            if not lines and (self.child.out.closed or time.monotonic() >= deadline):
                raise AssertionError(f"no answer from host {self.child.pid}: {self.stderr()}")
            self._lines.extend(lines)
        answer: dict[str, Any] = json.loads(self._lines.popleft())
        return answer

    def call(self, op: str, **arguments: Any) -> Any:
        self.send(op, **arguments)
        answer = self.recv()
        assert "error" not in answer, answer
        return answer["ok"]

    def stderr(self) -> str:
        return "\n".join(self.child.stderr[-40:])

    def quit(self) -> None:
        """Close its tree gracefully and check that nothing went wrong on the way."""
        self.send("quit")
        assert self.recv() == {"done": True}
        assert self.child.wait(30)
        self.child.drain()
        bad = [line for line in self.child.stderr if any(m in line for m in ERROR_MARKS)]
        assert not bad, self.stderr()


def first_to_answer(hosts: list[Host], timeout: float = ANSWER_S) -> Host:
    """The host whose answer arrives first."""
    deadline = time.monotonic() + timeout
    while True:
        for host in hosts:
            if host.has_answer():
                return host
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no host answered"
        ready, _, _ = select.select([h.child.out.fd for h in hosts], [], [], remaining)
        for host in hosts:
            if host.child.out.fd in ready:
                host.read_ready()


@pytest.fixture
def gated_server() -> Iterator[GatedModelServer]:
    with GatedModelServer() as server:
        yield server


@pytest.fixture
def hosts(
    zygote: Zygote, home: Path, gated_server: GatedModelServer
) -> Iterator[tuple[Host, Host]]:
    """Two hosts started at the same moment on a fresh home: both migrate it at once."""
    children = [zygote.spawn("soak.twin", [str(home), gated_server.url]) for _ in range(2)]
    try:
        pair = (Host(children[0]), Host(children[1]))
        for host in pair:
            assert host.recv() == {"ready": True}, host.stderr()
        yield pair
        for host in pair:
            host.quit()
    finally:
        for child in children:
            child.close()


def fermix_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not any(mark in done.stderr for mark in ERROR_MARKS), done.stderr
    return done


# -- no review runs twice (E2) ------------------------------------------------------------


def ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"operations": list(operations)}


def test_e2_two_hosts_reviewing_one_conversation_at_once_ask_the_model_once(
    hosts: tuple[Host, Host], gated_server: GatedModelServer
) -> None:
    a, b = hosts
    a.call("append", chat="r0", owner="ana", text="marker-r0: I drink green tea")
    add = {"op": "add", "category": "preference", "key": "drink", "value": "Drinks green tea"}
    gated_server.reply_json(ops(add))
    a.send("review", chat="r0", owner="ana")
    b.send("review", chat="r0", owner="ana")
    # One of them holds the claim and waits for the model; the other is refused meanwhile.
    assert gated_server.wait_for_requests(1, ANSWER_S)
    refused = first_to_answer([a, b])
    answer = refused.recv()["ok"]
    assert (answer["status"], answer["skip"]) == ("skipped", "claimed"), answer
    gated_server.gate.set()
    claimer = b if refused is a else a
    applied = claimer.recv()["ok"]
    assert applied["status"] == "applied" and applied["added"] == 1, applied
    assert gated_server.requests_mentioning("marker-r0") == 1
    # Both again, nothing new: no model call at all.
    for host in (a, b):
        again = host.call("review", chat="r0", owner="ana")
        assert again["skip"] == "no_new_messages", again
    assert len(gated_server.requests) == 1


def test_e2_two_hosts_reviewing_many_conversations_in_opposite_orders_review_each_once(
    hosts: tuple[Host, Host], gated_server: GatedModelServer
) -> None:
    a, b = hosts
    chats = [f"m{i}" for i in range(6)]
    for chat in chats:
        a.call("append", chat=chat, owner="ana", text=f"marker-{chat}: I like hiking")
    gated_server.gate.set()
    add = {"op": "add", "category": "interest", "key": "hobby", "value": "Likes hiking"}
    gated_server.default = Step(content=json.dumps(ops(add)))
    for chat_a, chat_b in zip(chats, reversed(chats), strict=True):
        a.send("review", chat=chat_a, owner="ana")
        b.send("review", chat=chat_b, owner="ana")
    results: dict[str, list[dict[str, Any]]] = {chat: [] for chat in chats}
    for host in (a, b):
        for _ in chats:
            result = host.recv()["ok"]
            results[result["conversation"].rsplit(":", 1)[1]].append(result)
    for chat in chats:
        statuses = sorted((r["status"], r["skip"]) for r in results[chat])
        assert statuses[0] == ("applied", None), results[chat]
        assert statuses[1] in (("skipped", "claimed"), ("skipped", "no_new_messages"))
        assert gated_server.requests_mentioning(f"marker-{chat}:") == 1, chat
    assert len(gated_server.requests) == len(chats)


# -- no "database is locked" reaches a caller (S8) ----------------------------------------


def test_s8_two_hosts_and_the_cli_write_at_once_and_no_caller_sees_a_locked_database(
    hosts: tuple[Host, Host], home: Path
) -> None:
    a, b = hosts
    with CliLoop(home, random.Random(8)) as cli:
        cli.resume()
        a.send("load", tag="a", n=150)
        b.send("load", tag="b", n=150)
        loads = {"a": a.recv(timeout=240)["ok"], "b": b.recv(timeout=240)["ok"]}
        cli.pause()
    assert not cli.failures, cli.failures
    assert sum(cli.ran.values()) > 0
    conn = open_database(home / "memory.db")
    try:
        for tag, load in loads.items():
            assert load["errors"] == [], load["errors"]
            acked = load["acked"]
            assert len(acked["messages"]) == 300 and len(acked["rows"]) == 150
            for t in range(2):
                key = ConversationKey(AGENT, "chat", f"{tag}{t}")
                stored = messages.conversation(SqliteSql(conn), key)
                assert [m.content for m in stored] == [f"{tag}{t}-{i}" for i in range(150)]
            keys = fetch_rows(conn, "SELECT count(*) FROM memories WHERE key LIKE ?", (f"{tag}-%",))
            assert keys == [(7,)]
    finally:
        conn.close()


# -- reads see each other's writes at once (A3) ------------------------------------------


def test_a3_each_host_reads_the_other_hosts_writes_and_the_clis_restore_at_once(
    hosts: tuple[Host, Host], home: Path
) -> None:
    a, b = hosts
    assert a.call("list", key="city") == [] and b.call("list", key="city") == []
    row_id = a.call("write", owner="ana", key="city", value="Lives in Porto")
    assert b.call("get", id=row_id)["value"] == "Lives in Porto"
    assert [r["value"] for r in b.call("list", key="city")] == ["Lives in Porto"]

    a.call("archive", id=row_id)
    assert b.call("get", id=row_id)["archived_at"] is not None
    assert b.call("list", key="city")[0]["archived_by"] == "twin"

    restored = fermix_cli(home, "memory", "restore", str(row_id), "--json")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["was_archived"] is True
    for host in (a, b):
        row = host.call("get", id=row_id)
        assert row["archived_at"] is None and row["value"] == "Lives in Porto"

    b.call("write", owner="ana", key="city", value="Lives in Lisbon")
    assert a.call("get", id=row_id)["value"] == "Lives in Lisbon"
    assert [r["value"] for r in a.call("list", key="city")] == ["Lives in Lisbon"]
    listed = fermix_cli(home, "memory", "list", "--json")
    assert [r["value"] for r in json.loads(listed.stdout) if r["key"] == "city"] == [
        "Lives in Lisbon"
    ]
