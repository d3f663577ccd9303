"""``fermix.Client`` retries an append whose answer was lost, and it is stored once (N3, N4).

Between the client and a real server sits a loopback proxy that forwards every request but,
for the first append, closes the client's connection after the server answered and before
the answer is relayed: the append was committed, and the client never heard so. The
client sends it again with the same client key; the server answers with the stored
message, and history holds it once.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
from collections.abc import Iterator

import pytest
from server_fixtures import ServerProcess

pytestmark = pytest.mark.slow


class DroppingProxy:
    """Relays loopback TCP to ``target``; drops the answer to the first request whose
    head contains ``drop``, after the server sent it."""

    def __init__(self, target: tuple[str, int], drop: bytes) -> None:
        self.target = target
        self.drop = drop
        self.dropped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.target) as upstream:
            while True:
                request = _read_message(client)
                if not request:
                    return
                upstream.sendall(request)
                answer = _read_message(upstream)
                if self.drop in request and not self.dropped.is_set():
                    self.dropped.set()
                    return  # committed upstream; the client's connection just closes
                client.sendall(answer)

    def close(self) -> None:
        self.listener.close()


def _read_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message with a Content-Length body (what client and server send)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[DroppingProxy]:
    parsed = urllib.parse.urlsplit(server.url)
    assert parsed.hostname is not None and parsed.port is not None
    relay = DroppingProxy((parsed.hostname, parsed.port), drop=b"/messages")
    yield relay
    relay.close()


def test_n3_n4_an_append_whose_answer_was_lost_is_retried_and_stored_once(
    server: ServerProcess, proxy: DroppingProxy
) -> None:
    from fermix import Client

    with Client(f"http://127.0.0.1:{proxy.port}", server.host_token) as client:
        conv = client.conversation("assistant", "cli", "lost", owner_id="ana")
        stored = conv.append_user("I moved to Porto")
        assert proxy.dropped.is_set(), "the proxy never dropped an answer: nothing was tested"
        history = conv.history()
    assert [m.content for m in history] == ["I moved to Porto"]
    assert history[0].id == stored.id
    assert stored.client_key is not None  # the client made one up, so the retry was safe
