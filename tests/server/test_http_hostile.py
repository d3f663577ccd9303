"""The hostile-input catalogue through the HTTP API: typed 4xx, nothing else changed (N8).

Each text and number of ``tests/data/hostile_inputs.json`` is sent, as a real client would,
to a real server process, in every field a host fills: the message text (which is the
intended change: stored once, verbatim, or refused), the role, the author, the sender, the
metadata, the handle, the client key, a search query and a limit. Every answer is a JSON
body of a 2xx or a 4xx, never a 5xx or a traceback; after each refused request the
database holds exactly what it held before, and after an accepted append exactly one
message more, in the conversation named.

Bodies over the limit are refused before they are read whole: a declared length past it
is answered 413 without the body being sent, and a chunked body is cut off once it passes
the limit.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_data import NUMBERS, TEXTS
from mcp_support import snapshot
from server_fixtures import ServerProcess

from fermix.model import ConversationKey
from fermix.wire import encode_handle

pytestmark = pytest.mark.slow

KEY = ConversationKey("assistant", "hostile", "chat", "")
HANDLE = encode_handle(KEY, "ana", "guest")
LIMIT = 1_048_576
"""``[fermix_core.server] max_body_bytes`` by default."""


class Http:
    """A keep-alive HTTP/1.1 connection to the server, JSON in and out."""

    def __init__(self, url: str, token: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.token = token
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode("utf-8", "surrogatepass")
        headers = {"Authorization": f"Bearer {self.token}"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=payload, headers=headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (http.client.HTTPException, OSError):
            # The server may close a connection after a 413: open another one.
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            if payload is not None and len(payload) > LIMIT:
                # Refused while it was still being sent: the server answered 413 and
                # closed the connection without reading the rest.
                return 413, {"error": {"message": "refused while sending"}}
            raise
        if response.getheader("connection", "").lower() == "close":
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        if not response.getheader("content-type", "").startswith("application/json"):
            # Only the HTTP parser itself answers in plain text: a request line it cannot
            # read (a path of megabytes) never reaches the app.
            assert response.status in (400, 414) and b"Invalid HTTP request" in raw, raw[:200]
            return response.status, {"error": {"message": raw.decode()}}
        return response.status, json.loads(raw)


@pytest.fixture(scope="module")
def api(module_server: ServerProcess) -> Iterator[Http]:
    client = Http(module_server.url, module_server.host_token)
    status, _ = client.call(
        "POST", f"/v1/conversations/{HANDLE}/messages", {"role": "user", "text": "seed"}
    )
    assert status == 201
    yield client
    client.conn.close()


def _db(server: ServerProcess) -> Path:
    return server.home / "memory.db"


def _check(status: int, body: Any) -> None:
    assert status < 500, body
    if status >= 400:
        assert set(body) == {"error"} and body["error"]["message"], body
        assert "Traceback" not in json.dumps(body)


@pytest.mark.parametrize("text", TEXTS, ids=[f"text{i}" for i in range(len(TEXTS))])
def test_n8_hostile_text_in_every_field_of_an_append(
    api: Http, module_server: ServerProcess, text: str
) -> None:
    db = _db(module_server)
    before = snapshot(db)
    status, body = api.call(
        "POST", f"/v1/conversations/{HANDLE}/messages", {"role": "user", "text": text}
    )
    _check(status, body)
    after = snapshot(db)
    if status == 201:
        assert body["content"] == text  # stored verbatim, once
        added = [row for row in after["messages"] if row not in before["messages"]]
        assert len(added) == 1
        assert {t: rows for t, rows in after.items() if t not in ("messages", "conversations")} == {
            t: rows for t, rows in before.items() if t not in ("messages", "conversations")
        }
    else:
        assert after == before
    before = after
    for field in ("role", "owner_id", "sender", "kind", "trust", "client_key"):
        request = {"role": "user", "text": "fine", field: text}
        if field == "role":
            request["role"] = text
        status, body = api.call("POST", f"/v1/conversations/{HANDLE}/messages", request)
        _check(status, body)
        if status >= 400:
            assert snapshot(db) == before, field
        before = snapshot(db)
    quoted = urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")
    for path in (
        f"/v1/conversations/{quoted}/messages",
        f"/v1/agents/assistant/memories/search?q={quoted}",
    ):
        try:
            status, body = api.call("GET", path)
        except (http.client.HTTPException, OSError):
            continue  # a path the HTTP layer itself refuses to carry
        _check(status, body)
    assert snapshot(db) == before


@pytest.mark.parametrize("number", NUMBERS, ids=[f"n{i}" for i in range(len(NUMBERS))])
def test_n8_hostile_numbers_as_limits_and_tokens(
    api: Http, module_server: ServerProcess, number: Any
) -> None:
    db = _db(module_server)
    before = snapshot(db)
    for method, path, body in (
        ("GET", f"/v1/conversations/{HANDLE}/messages?limit={number}", None),
        ("POST", f"/v1/conversations/{HANDLE}/compose", {"system": "s", "limit": number}),
        (
            "POST",
            f"/v1/conversations/{HANDLE}/messages",
            {"role": "user", "text": "x", "peak_prompt_tokens": number, "client_key": "n"},
        ),
        ("GET", f"/v1/agents/assistant/memories?limit={number}", None),
        ("POST", f"/v1/conversations/{HANDLE}/messages", {"role": "user", "text": number}),
    ):
        status, answer = api.call(method, path, body)
        _check(status, answer)
    after = snapshot(db)
    added = [row for row in after["messages"] if row not in before["messages"]]
    assert len(added) <= 1  # at most the one keyed append, whatever its peak was


def _raw(url: str, request: bytes) -> bytes:
    """Send ``request`` (as much as the server reads of it) and read one answer."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        try:
            sock.sendall(request)
        except OSError:
            pass  # the server answered and closed before reading everything: as intended
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return head + b"\r\n\r\n" + body


def test_n8_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    module_server: ServerProcess,
) -> None:
    """10 MB declared, none sent: the 413 comes at once (the server did not wait for it)."""
    head = (
        f"POST /v1/conversations/{HANDLE}/messages HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {module_server.host_token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
    ).encode()
    answer = _raw(module_server.url, head)
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 413 " in status_line
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["type"] == "too_large" and body["error"]["field"] == "body"


def test_n8_a_chunked_body_over_the_limit_is_cut_off(module_server: ServerProcess) -> None:
    before = snapshot(module_server.home / "memory.db")
    chunk = b"x" * 65536
    pieces = [
        (
            f"POST /v1/conversations/{HANDLE}/messages HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {module_server.host_token}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
    ]
    pieces += [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 20  # 1.25 MiB, over 1 MiB
    pieces.append(b"0\r\n\r\n")
    answer = _raw(module_server.url, b"".join(pieces))
    assert b" 413 " in answer.partition(b"\r\n")[0]
    assert snapshot(module_server.home / "memory.db") == before
