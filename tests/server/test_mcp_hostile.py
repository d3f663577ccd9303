"""The hostile-input catalogue through the MCP endpoint (N8 through N5; issue 13 item 8).

Every text and number of ``tests/data/hostile_inputs.json`` goes to the memory tools, the
prompt file resources and the identity headers of the server's streamable HTTP endpoint,
through the SDK's own client. Each is answered with a typed error (a tool error, a JSON-RPC
error, a 4xx JSON answer) or a normal result, never a crash (no 5xx, no internal error);
what must be refused leaves every table and every prompt file as it was, and what is
stored lands in the caller's own conversation only.

An input the SDK's client cannot even send (a lone surrogate has no UTF-8 form) goes as
a raw JSON-RPC body with the surrogate escaped, so the server still has to answer it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import anyio
import h11
import httpx2
import pytest
from hostile_data import NUMBERS, TEXTS
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_support import files_of, http_client, served, snapshot

from fermix.api import Memory
from fermix.home import Home
from fermix.server.mcp import SCHEME

pytestmark = pytest.mark.keep_actors

INTERNAL_ERROR = -32603
CHAT = "hostile"
SCOPE = f"mcp:{CHAT}"


class Target:
    def __init__(self, memory: Memory, url: str) -> None:
        self.memory, self.url = memory, url
        self.home = memory.home.root
        self.secret = memory.tokens.create(["agent"], name="hostile")[1]
        self.http = httpx2.Client(timeout=60.0)

    def state(self, *, skip: str | None = None) -> tuple[Any, ...]:
        return snapshot(self.home / "memory.db", skip=skip), files_of(self.home)

    def post(self, method: str, params: dict[str, Any], headers: dict[str, Any]) -> Any:
        """One JSON-RPC request as bytes the SDK would not send, on one kept-alive
        connection; returns the HTTP answer after checking it is no crash."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        answer = self.http.post(
            self.url,
            content=body.encode("ascii"),  # ensure_ascii: a lone surrogate goes as \udxxx
            headers={
                "Authorization": f"Bearer {self.secret}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-06-18",
                **headers,
            },
        )
        assert answer.status_code < 500, answer.text[:300]
        return answer

    def raw(self, method: str, params: dict[str, Any], headers: dict[str, Any]) -> Any:
        """:meth:`post`, whose answer must be JSON: a JSON-RPC answer (no internal error)
        or the HTTP API's error JSON."""
        answer = self.post(method, params, headers)
        data = answer.json()
        if answer.status_code == 413:
            assert data["error"]["type"] == "too_large", data
        assert data.get("error", {}).get("code") != INTERNAL_ERROR, data
        return data


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    home = Home(tmp_path_factory.mktemp("mcp-hostile") / "home")
    with Memory(home) as memory:
        bob = memory.conversation("agent", "cli", "bystander", owner_id="bob")
        bob.append_user("bob's own message")
        memory.tools.run(
            {"function": {"name": "memory_store", "arguments": {"key": "bob", "value": "bob's"}}},
            bob,
        )
        bob.memory_files()  # bob's prompt files exist on disk, and must stay as they are
        with served(memory) as url:
            target = Target(memory, url)
            with target.http:
                yield target


def _sendable(target: Target, value: Any) -> bool:
    """Whether the SDK's client can send ``value`` whole: its JSON has a UTF-8 form and fits
    the server's body limit (a client that fails to encode one, or whose request is cut
    off with a 413, ends its whole session, as it should)."""
    try:
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return size < target.memory.config.server.max_body_bytes - 4096


async def _call(
    target: Target, client: Client, name: str, arguments: dict[str, Any], chat: str
) -> tuple[bool, Any]:
    """``(refused, payload)`` of one tool call through the SDK, or raw when it cannot send."""
    if not _sendable(target, arguments):
        params = {"name": name, "arguments": arguments}
        data = target.raw("tools/call", params, {"X-Fermix-Owner": "alice", "X-Fermix-Chat": chat})
        if "result" not in data:  # a JSON-RPC error, or the HTTP API's 413 JSON
            return True, data["error"]
        result = data["result"]
        return bool(result.get("isError")), json.loads(result["content"][0]["text"])
    try:
        answer = await client.call_tool(name, arguments)
    except MCPError as exc:
        assert exc.code != INTERNAL_ERROR, exc
        return True, exc.message
    (content,) = answer.content
    return bool(answer.is_error), json.loads(content.text)  # type: ignore[union-attr]


@pytest.mark.slow
def test_n8_n5_memory_store_of_any_text_over_mcp_stores_it_here_or_refuses(target: Target) -> None:
    """Each catalogue text as a key and a value of memory_store: stored trimmed in the
    caller's conversation, or refused with nothing changed anywhere (N8, N5, T1)."""
    stored = refused = 0

    async def run() -> None:
        nonlocal stored, refused
        async with http_client(target.url, target.secret, owner="alice", chat=CHAT) as client:
            for text in TEXTS:
                before, before_elsewhere = target.state(), target.state(skip=SCOPE)
                arguments = {"key": text[:150] or "k", "value": text}
                is_error, out = await _call(target, client, "memory_store", arguments, CHAT)
                if is_error:
                    refused += 1
                    assert target.state() == before, text[:80]
                    continue
                stored += 1
                row = target.memory.get_row(out["stored"]["id"])
                assert row is not None and row.value == text.strip()
                assert (row.agent_id, row.owner_id, row.scope_id) == ("agent", "alice", SCOPE)
                assert target.state(skip=SCOPE) == before_elsewhere, text[:80]

    anyio.run(run)
    assert stored and refused and stored + refused == len(TEXTS)


@pytest.mark.slow
def test_n8_n5_memory_recall_of_any_text_or_number_over_mcp_changes_nothing(
    target: Target,
) -> None:
    """Each text as a query and as a key, each number as a limit: a result or a tool error,
    never another owner's memory, and nothing written (N8, N5, T2, T4)."""

    async def run() -> None:
        async with http_client(target.url, target.secret, owner="alice", chat="reader") as client:
            before = target.state()
            for text in TEXTS:
                for arguments in ({"query": text, "scope": "all", "source": "all"}, {"key": text}):
                    _, out = await _call(target, client, "memory_recall", arguments, "reader")
                    assert "bob's" not in json.dumps(out, ensure_ascii=False), text[:80]
            answers = []
            for number in NUMBERS:
                arguments = {"query": "bob", "limit": number}
                answers.append(
                    (await _call(target, client, "memory_recall", arguments, "reader"))[0]
                )
            assert answers.count(False) == sum(
                1 for n in NUMBERS if type(n) in (int, float) and 1 <= n <= 20
            ), answers
            assert target.state() == before

    anyio.run(run)


@pytest.mark.slow
def test_n8_n5_a_prompt_file_uri_of_any_text_is_refused_and_reads_nothing(
    target: Target,
) -> None:
    """Each text as an owner and an agent in a resource URI, encoded or raw: an error,
    never another owner's file, nothing rendered or written (N8, N5)."""

    async def run() -> None:
        async with http_client(target.url, target.secret, owner="alice", chat="uris") as client:
            before = target.state()
            for text in TEXTS:
                encoded = quote(text, safe="", errors="surrogatepass")
                for uri in (
                    f"{SCHEME}agent/owners/{encoded}/USER.md",
                    f"{SCHEME}{encoded}/owners/alice/MEMORY.md",
                    f"{SCHEME}agent/owners/{text}/USER.md",
                ):
                    if not _sendable(target, uri):
                        data = target.raw(
                            "resources/read", {"uri": uri}, {"X-Fermix-Owner": "alice"}
                        )
                        assert "error" in data
                        continue
                    try:
                        await client.read_resource(uri)
                    except MCPError as exc:
                        assert exc.code != INTERNAL_ERROR, (uri[:80], exc)
                    else:
                        raise AssertionError(f"read {uri[:80]!r}")
            assert target.state() == before

    anyio.run(run)


def test_n8_n5_identity_headers_of_any_text_are_refused_or_act_as_that_owner(
    target: Target,
) -> None:
    """Each text as X-Fermix-Owner, X-Fermix-Chat and X-Fermix-Agent of a recall: refused
    by the HTTP parser (a control character), a 4xx JSON error, or a normal answer that
    shows no other owner's memory, and nothing written (N8, N5)."""
    before = target.state()
    outcomes: dict[str, int] = {"unsendable": 0, "parser": 0, "refused": 0, "answered": 0}
    for text in TEXTS[:-5]:  # the generated megabytes are no header any client sends
        for header in ("X-Fermix-Owner", "X-Fermix-Chat", "X-Fermix-Agent"):
            try:
                answer = target.post(
                    "tools/call",
                    {"name": "memory_recall", "arguments": {"query": "bob", "scope": "all"}},
                    {header: text.encode("utf-8", "surrogatepass")},
                )
            except (h11.LocalProtocolError, httpx2.LocalProtocolError):
                outcomes["unsendable"] += 1  # a CR, LF or NUL: no HTTP client sends it
                continue
            if answer.status_code == 400 and "json" not in answer.headers["content-type"]:
                outcomes["parser"] += 1  # uvicorn's HTTP parser refused the header
                continue
            data = answer.json()
            if answer.status_code >= 400:
                outcomes["refused"] += 1
                assert data["error"]["field"] == f"header.{header.lower()}", data
                continue
            outcomes["answered"] += 1
            assert "bob's" not in json.dumps(data, ensure_ascii=False), (header, text[:60])
    assert outcomes["answered"] and outcomes["refused"], outcomes
    assert target.state() == before
