"""MCP over stdio (``fermix mcp``) and streamable HTTP: memory tools and prompt files (N5).

Every test talks to a real server through the official SDK's own client: ``fermix mcp`` as
a child process over stdio, or the memory server's app under uvicorn on 127.0.0.1 over
streamable HTTP. What the tools wrote is checked in the database itself.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_support import http_client, served, snapshot, stdio_params

from fermix.api import Memory
from fermix.errors import InvalidInputError
from fermix.home import Home
from fermix.server.mcp import SCHEME, Identity, build_server, parse_resource_uri, resource_uri
from fermix.tools import MemoryTools

pytestmark = pytest.mark.keep_actors

SCHEMAS = {tool["function"]["name"]: tool["function"] for tool in MemoryTools.schemas()}


def _text(result: Any) -> str:
    (content,) = result.content
    return str(content.text)


# -- URIs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "owner"),
    [("a", ""), ("a", "o"), ("a/b", "c/d"), ("owners", "owners"), ("日本", "x y%2F")],
)
def test_n5_a_prompt_file_uri_names_one_agent_and_owner_and_reads_back(
    agent: str, owner: str
) -> None:
    for name in ("USER.md", "MEMORY.md"):
        uri = resource_uri(agent, owner, name)
        assert parse_resource_uri(uri) == (agent, owner, name)
    # the default owner has its own shape (two segments), which no owner id spells
    assert resource_uri(agent, "", "USER.md").removeprefix(SCHEME).count("/") == 1
    assert resource_uri(agent, owner or "x", "USER.md").removeprefix(SCHEME).count("/") == 3


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/passwd",
        "fermix://agents/a/owners//USER.md",
        "fermix://agents/a/owners/o/secret.txt",
        "fermix://agents/a/../USER.md/x",
        "fermix://agents//USER.md",
        "fermix://agents/a/owners/%ff/USER.md",
        "fermix://agents/a%00/USER.md",
    ],
)
def test_n5_a_malformed_prompt_file_uri_is_invalid_input(uri: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_resource_uri(uri)


# -- stdio --------------------------------------------------------------------------------


@pytest.mark.slow
def test_n5_fermix_mcp_over_stdio_serves_our_tools_stores_recalls_and_reads_user_md(
    tmp_path: Path,
) -> None:
    """``fermix mcp`` through the SDK's stdio client: the same schemas as the host's tools, a
    store then a recall, USER.md readable, a bad argument an isError that writes nothing,
    another agent's files refused (N5)."""
    home = tmp_path / "home"
    with Memory(Home(home)) as memory:  # the home exists and holds a shared rule
        memory.tools.run(
            {"function": {"name": "memory_store", "arguments": {"key": "seed", "value": "x"}}},
            memory.conversation("a", "cli", "seed", owner_id="o"),
        )

    async def session() -> None:
        async with Client(stdio_params(home, "--agent", "a", "--owner", "o")) as client:
            tools = (await client.list_tools()).tools
            assert {t.name: t.input_schema for t in tools} == {
                name: function["parameters"] for name, function in SCHEMAS.items()
            }
            assert {t.name: t.description for t in tools} == {
                name: function["description"] for name, function in SCHEMAS.items()
            }

            stored = await client.call_tool("memory_store", {"key": "flight", "value": "May 3"})
            assert not stored.is_error
            assert json.loads(_text(stored))["stored"]["value"] == "May 3"
            found = await client.call_tool("memory_recall", {"key": "flight"})
            assert not found.is_error
            assert [m["value"] for m in json.loads(_text(found))["memories"]] == ["May 3"]

            before = snapshot(home / "memory.db")
            bad = await client.call_tool("memory_store", {"key": "k", "value": 5})
            assert bad.is_error
            assert json.loads(_text(bad)) == {"error": "value must be a string, not an integer"}
            unknown = await client.call_tool("memory_forget", {})
            assert unknown.is_error and "unknown tool" in _text(unknown)
            assert snapshot(home / "memory.db") == before

            listed = (await client.list_resources()).resources
            assert [str(r.uri) for r in listed] == [
                "fermix://agents/a/owners/o/USER.md",
                "fermix://agents/a/owners/o/MEMORY.md",
            ]
            read = await client.read_resource("fermix://agents/a/owners/o/USER.md")
            (contents,) = read.contents
            assert isinstance(contents.text, str)  # type: ignore[union-attr]
            with pytest.raises(MCPError, match="may not act for agent 'b'"):
                await client.read_resource("fermix://agents/b/owners/o/USER.md")
            with pytest.raises(MCPError, match="own owner"):
                await client.read_resource("fermix://agents/a/USER.md")

    anyio.run(session)
    with Memory(Home(home)) as memory:
        (row,) = memory.list_rows(agent_id="a", owner_id="o", key="flight")
        assert (row.value, row.scope_type, row.scope_id) == ("May 3", "conversation", "mcp:o")


@pytest.mark.slow
def test_n5_fermix_mcp_operator_reads_another_owners_prompt_files(tmp_path: Path) -> None:
    """``--operator`` (the local user on their own home) reads any owner's files of the
    agent; the files are those the host's conversation shows (N5)."""
    home = tmp_path / "home"
    with Memory(Home(home)) as memory:
        user_md, memory_md = memory.conversation("a", "cli", "x", owner_id="bob").memory_files()

    async def session() -> None:
        params = stdio_params(home, "--agent", "a", "--operator", "--chat", "ops")
        async with Client(params) as client:
            read = await client.read_resource("fermix://agents/a/owners/bob/MEMORY.md")
            assert read.contents[0].text == memory_md  # type: ignore[union-attr]
            read = await client.read_resource("fermix://agents/a/owners/bob/USER.md")
            assert read.contents[0].text == user_md  # type: ignore[union-attr]

    anyio.run(session)


def test_n5_the_stdio_server_in_process_acts_as_its_one_identity(tmp_path: Path) -> None:
    """The server ``fermix mcp`` runs, through the SDK's in-process client: a quick check
    of what the stdio tests check through a child process (N5)."""
    with Memory(Home(tmp_path / "home")) as memory:
        server = build_server(memory, Identity("a", "o", "c"))

        async def session() -> None:
            async with Client(server) as client:
                stored = await client.call_tool("memory_store", {"key": "k", "value": "v"})
                assert not stored.is_error
                before = snapshot(memory.home.db_path)
                bad = await client.call_tool("memory_store", {"key": " ", "value": "v"})
                assert bad.is_error and json.loads(_text(bad)) == {"error": "key must not be empty"}
                assert snapshot(memory.home.db_path) == before
                with pytest.raises(MCPError, match="may not act for agent 'z'"):
                    await client.read_resource("fermix://agents/z/owners/o/USER.md")

        anyio.run(session)
        (row,) = memory.list_rows(agent_id="a", owner_id="o")
        assert (row.key, row.value, row.scope_id) == ("k", "v", "mcp:c")


def test_n5_the_cli_refuses_a_bad_identity_before_serving(tmp_path: Path) -> None:
    from fermix.cli import main

    assert main(["--home", str(tmp_path / "h"), "mcp", "--agent", "a", "--chat", "x\x01"]) == 2


# -- streamable HTTP ------------------------------------------------------------------------


class Served:
    def __init__(self, memory: Memory, url: str) -> None:
        self.memory = memory
        self.url = url
        self.db = memory.home.db_path
        self.secret_a = memory.tokens.create(["a"], name="a")[1]
        self.secret_ab = memory.tokens.create(["a", "b"], name="ab")[1]
        self.secret_op = memory.tokens.create(["a"], operator=True, name="op")[1]
        revoked, self.secret_revoked = memory.tokens.create(["a"], name="gone")
        memory.tokens.revoke(revoked.id)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = Home(tmp_path_factory.mktemp("mcp") / "home")
    with Memory(home) as memory, served(memory) as url:
        yield Served(memory, url)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_n5_streamable_http_serves_our_tools_and_prompt_files_with_a_token(
    server: Served, mode: str
) -> None:
    """The same tools and files over the memory server's /mcp endpoint, in the handshake
    era and the 2026 per-request era the SDK negotiates by default (N5)."""
    chat = f"http-{mode}"

    async def session() -> None:
        async with http_client(
            server.url, server.secret_a, mode, owner="alice", chat=chat
        ) as client:
            tools = (await client.list_tools()).tools
            assert {t.name: t.input_schema for t in tools} == {
                name: function["parameters"] for name, function in SCHEMAS.items()
            }
            stored = await client.call_tool("memory_store", {"key": "k", "value": mode})
            assert not stored.is_error
            found = await client.call_tool("memory_recall", {"key": "k"})
            assert [m["value"] for m in json.loads(_text(found))["memories"]] == [mode]

            before = snapshot(server.db)
            bad = await client.call_tool("memory_recall", {"limit": 99, "query": "k"})
            assert bad.is_error and "limit must be an integer from 1 to 20" in _text(bad)
            assert snapshot(server.db) == before

            listed = (await client.list_resources()).resources
            assert [str(r.uri) for r in listed] == [
                "fermix://agents/a/owners/alice/USER.md",
                "fermix://agents/a/owners/alice/MEMORY.md",
            ]
            read = await client.read_resource(str(listed[1].uri))
            _, memory_md = server.memory.conversation(
                "a", "mcp", chat, owner_id="alice"
            ).memory_files()
            assert read.contents[0].text == memory_md  # type: ignore[union-attr]
            with pytest.raises(MCPError, match="own owner"):
                await client.read_resource("fermix://agents/a/owners/bob/USER.md")

    anyio.run(session)
    rows = server.memory.list_rows(agent_id="a", owner_id="alice", key="k")
    assert [(r.value, r.scope_id) for r in rows if r.value == mode] == [(mode, f"mcp:{chat}")]


def _post(server: Served, headers: dict[str, Any], body: Any = None) -> httpx2.Response:
    message = body or {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx2.post(
        server.url,
        content=json.dumps(message),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
            **headers,
        },
        timeout=30.0,
    )


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer", "Basic abc", "Bearer fmx_not-a-token", "Bearer nothing", "revoked"],
)
def test_n5_n2_the_mcp_endpoint_answers_401_json_without_a_live_token(
    server: Served, authorization: str | None
) -> None:
    if authorization == "revoked":
        authorization = f"Bearer {server.secret_revoked}"
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = _post(server, headers)
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "unauthorized"
    assert answer.json()["error"]["field"] == "header.authorization"


def test_n5_n2_the_mcp_endpoint_answers_403_for_an_agent_the_token_does_not_list(
    server: Served,
) -> None:
    answer = _post(server, {"Authorization": f"Bearer {server.secret_a}", "X-Fermix-Agent": "b"})
    assert answer.status_code == 403
    assert answer.json()["error"] == {
        "type": "forbidden",
        "message": "this token may not act for agent 'b'",
        "field": "header.x-fermix-agent",
    }
    # a token of several agents must name one
    answer = _post(server, {"Authorization": f"Bearer {server.secret_ab}"})
    assert answer.status_code == 422
    assert answer.json()["error"]["field"] == "header.x-fermix-agent"
    answer = _post(
        server, {"Authorization": f"Bearer {server.secret_a}", "X-Fermix-Chat": "x" * 201}
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["field"] == "header.x-fermix-chat"
    answer = _post(
        server, {"Authorization": f"Bearer {server.secret_a}", "X-Fermix-Owner": b"\xff"}
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["field"] == "header.x-fermix-owner"


def test_n5_the_sdk_client_without_a_token_fails_to_connect(server: Served) -> None:
    async def session() -> None:
        async with http_client(server.url, None, "legacy"):
            raise AssertionError("connected without a token")

    with pytest.raises(BaseExceptionGroup) as caught:
        anyio.run(session)
    assert caught.group_contains(MCPError)


def test_n5_a_token_of_two_agents_acts_for_the_agent_it_names(server: Served) -> None:
    async def session() -> None:
        async with http_client(server.url, server.secret_ab, agent="b", owner="o") as client:
            stored = await client.call_tool("memory_store", {"key": "which", "value": "b"})
            assert not stored.is_error
            listed = (await client.list_resources()).resources
            assert str(listed[0].uri) == "fermix://agents/b/owners/o/USER.md"
            read = await client.read_resource("fermix://agents/a/owners/o/USER.md")
            assert read.contents  # agent a is the token's too

    anyio.run(session)
    (row,) = server.memory.list_rows(agent_id="b", owner_id="o")
    assert (row.key, row.value, row.scope_id) == ("which", "b", "mcp:o")


def test_n5_an_operator_token_reads_another_owners_files_only_as_the_configs_operator(
    server: Served,
) -> None:
    """An operator token gets the config's trust of the owner it names (M2), as the HTTP
    API's trust_for: a guest's for an owner the config does not name (N5)."""

    async def session() -> None:
        async with http_client(server.url, server.secret_op, owner="zoe") as client:
            with pytest.raises(MCPError, match="own owner"):
                await client.read_resource("fermix://agents/a/owners/alice/USER.md")
            assert (await client.read_resource("fermix://agents/a/owners/zoe/USER.md")).contents

    anyio.run(session)


def test_n5_two_concurrent_sessions_with_different_identities_never_see_each_others(
    server: Served,
) -> None:
    """Two clients, interleaving store and recall of the same key at once: each recalls only
    its own values, lists only its own files, and the rows land in its own scope (N5)."""
    rounds = 15
    seen: dict[str, list[str]] = {"ann": [], "ben": []}
    mixed = threading.Event()

    async def one(owner: str) -> None:
        async with http_client(server.url, server.secret_a, owner=owner, chat=f"iso-{owner}") as c:
            for i in range(rounds):
                value = f"{owner}-{i}"
                stored = await c.call_tool("memory_store", {"key": "same", "value": value})
                assert not stored.is_error, _text(stored)
                found = await c.call_tool("memory_recall", {"key": "same", "scope": "all"})
                seen[owner] += [m["value"] for m in json.loads(_text(found))["memories"]]
                if len(seen["ann"]) and len(seen["ben"]):
                    mixed.set()
            listed = (await c.list_resources()).resources
            assert {str(r.uri) for r in listed} == {
                f"fermix://agents/a/owners/{owner}/USER.md",
                f"fermix://agents/a/owners/{owner}/MEMORY.md",
            }

    async def both() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(one, "ann")
            tasks.start_soon(one, "ben")

    anyio.run(both)
    assert mixed.is_set()
    for owner, values in seen.items():
        assert values and all(v.startswith(f"{owner}-") for v in values), values
        (row,) = server.memory.list_rows(agent_id="a", owner_id=owner)
        assert (row.value, row.scope_id) == (f"{owner}-{rounds - 1}", f"mcp:iso-{owner}")


def test_n5_the_endpoint_without_a_trailing_slash_redirects_within_the_origin(
    server: Served,
) -> None:
    url = server.url.rstrip("/")

    async def session() -> None:
        async with http_client(url, server.secret_a, "legacy", owner="slash") as client:
            assert len((await client.list_tools()).tools) == 3

    anyio.run(session)


def test_n5_identity_holds_its_default_chat() -> None:
    assert Identity("a").chat_id == "default"
    assert Identity("a", "o").chat_id == "o"
    assert Identity("a", "o", "c").key.scope_id == "mcp:c"
    with pytest.raises(InvalidInputError):
        Identity("a", trust="root")
