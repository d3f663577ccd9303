"""``fermix.Client`` against a real server process: the host's surface over HTTP (N1-N3).

The same host code runs against an embedded ``Memory`` and against the client, and stores
the same history; worker processes sharing one conversation through the server see one
consistent conversation.
"""

from __future__ import annotations

import json
import multiprocessing
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from factories import StartMemory, fact, other_process
from server_fixtures import AGENT, ServerProcess, StartServer

import fermix
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult, Skip
from fermix.errors import (
    AccessDeniedError,
    ActorUnavailableError,
    ConflictError,
    InvalidInputError,
)
from fermix.model import ConversationState, Message
from fermix.remote import Client, RemoteConversation

SYSTEM = "You are a helpful assistant."


def test_n1_a_whole_turn_over_http(module_server: ServerProcess) -> None:
    with other_process(module_server.home) as writer:
        writer.write_rows(
            fact("identity", "job", "nurse in Porto", agent_id=AGENT, owner_id="ana"),
            label="a fact the reviewer would have stored",
        )
    with fermix.Memory.connect(module_server.url, module_server.host_token) as client:
        assert isinstance(client, Client)
        conv = client.conversation(AGENT, "telegram", "turn", owner_id="ana")
        assert isinstance(conv, RemoteConversation)
        assert (conv.key.chat_id, conv.owner_id, conv.trust) == ("turn", "ana", "guest")
        assert conv.preflight() is None and conv.handle_command("hello") is None
        asked = conv.append_user("What do I do for a living?")
        assert isinstance(asked, Message) and asked.sender == "ana" and asked.client_key

        user_md, _ = conv.memory_files()
        assert "nurse in Porto" in user_md
        messages = conv.compose(system=SYSTEM)
        assert messages[0] == {"role": "system", "content": SYSTEM}
        assert any("nurse in Porto" in str(m["content"]) for m in messages[1:-1])
        assert messages[-1] == {"role": "user", "content": "What do I do for a living?"}

        reply = conv.commit("You are a nurse.", usage={"prompt_tokens": 321}, metadata={"n": 1})
        assert reply.role == "assistant" and reply.metadata == {"n": 1}
        history = conv.history()
        assert [(m.role, m.content) for m in history] == [
            ("user", "What do I do for a living?"),
            ("assistant", "You are a nurse."),
        ]
        assert history == [asked, reply]
        assert conv.history(limit=1) == [reply]
        assert conv.history(limit=0) == []  # H1: none, not the whole window
        state = conv.state()
        assert isinstance(state, ConversationState) and state.peak_prompt_tokens == 321
        conv.reload()
        assert conv.history() == history

        review = client.review(conv)
        assert isinstance(review, ReviewResult) and review.skip is Skip.NO_MODEL
        compaction = client.compact(conv, force=True)
        assert isinstance(compaction, CompactionResult) and compaction.key == conv.key


def test_n3_the_clients_keys_make_appends_idempotent(module_server: ServerProcess) -> None:
    client = module_server.client()
    conv = client.conversation(AGENT, "telegram", "keys", owner_id="ana")
    first = conv.append_user("once", client_key="k-1")
    assert conv.append_user("once", client_key="k-1") == first
    with pytest.raises(ConflictError, match="k-1"):
        conv.append_user("twice", client_key="k-1")
    # Without a key of the caller's, each append gets its own: two sends, two messages.
    conv.append_user("same text")
    conv.append_user("same text")
    assert [m.content for m in conv.history()] == ["once", "same text", "same text"]
    assert len({m.client_key for m in conv.history()}) == 3


def test_n2_errors_come_back_as_fermix_errors(module_server: ServerProcess) -> None:
    client = module_server.client()
    with pytest.raises(AccessDeniedError) as caught:
        client.conversation("another-agent", "telegram", "1")
    assert caught.value.status == 403  # type: ignore[attr-defined]
    with pytest.raises(AccessDeniedError):
        client.conversation(AGENT, "telegram", "1", trust="operator")
    conv = client.conversation(AGENT, "telegram", "errors")
    with pytest.raises(InvalidInputError) as invalid:
        conv.append("owner", "hi")
    assert invalid.value.field == "body.role"  # type: ignore[attr-defined]
    with pytest.raises(InvalidInputError):
        conv.history(limit=-1)
    assert conv.state() is None
    with pytest.raises(AccessDeniedError) as unknown:
        module_server.client("fmx_" + "0" * 43).conversation(AGENT, "telegram", "1")
    assert unknown.value.status == 401  # type: ignore[attr-defined]


def test_n1_one_client_serves_many_threads(module_server: ServerProcess) -> None:
    client = module_server.client()
    conv = client.conversation(AGENT, "telegram", "threads")

    def append(thread: int) -> list[int]:
        return [conv.append_user(f"{thread}:{i}").id for i in range(10)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(append, range(8)))
    assert all(own == sorted(own) for own in ids)
    assert sorted(m.id for m in conv.history()) == sorted(i for own in ids for i in own)
    assert len(conv.history()) == 80


def test_t4_the_tools_run_on_the_server(module_server: ServerProcess) -> None:
    client = module_server.client()
    conv = client.conversation(AGENT, "telegram", "tools", owner_id="ana")
    assert {t["function"]["name"] for t in client.tools.schemas()} >= {"memory_recall"}
    call = {
        "id": "c1",
        "function": {"name": "memory_store", "arguments": '{"key": "k", "value": "v"}'},
    }
    assert "error" not in json.loads(client.tools.run(call, conv))
    refused = json.loads(client.tools.run({"function": {"name": "nope"}}, conv))
    assert "error" in refused


def test_n1_a_server_that_does_not_answer_is_actor_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}", "fmx_x", retries=1)
    with pytest.raises(ActorUnavailableError, match="not reachable"):
        client.conversation(AGENT, "telegram", "1")
    with pytest.raises(InvalidInputError, match="url"):
        Client("ftp://example.org", "fmx_x")


def test_n1_the_client_talks_over_a_unix_socket(start_server: StartServer) -> None:
    server = start_server(socket=True)
    assert server.url.startswith("http+unix://")
    with Client(server.url, server.host_token) as client:
        conv = client.conversation(AGENT, "cli", "unix")
        conv.append_user("over a socket")
        assert [m.content for m in conv.history()] == ["over a socket"]


@pytest.mark.slow
def test_n1_a_client_outlives_a_server_restart(start_server: StartServer) -> None:
    """The pooled connections die with the server; the next call opens new ones."""
    server = start_server(socket=True)
    with Client(server.url, server.host_token) as client:
        conv = client.conversation(AGENT, "cli", "restart")
        conv.append_user("before")
        server.restart()
        conv.append_user("after")
        assert [m.content for m in conv.history()] == ["before", "after"]


# -- one host function, two memories ------------------------------------------------------


def scripted_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A model that stores a fact with a tool first, then answers: deterministic."""
    assert any(t["function"]["name"] == "memory_store" for t in tools)
    if messages[-1]["role"] == "user":
        arguments = json.dumps({"key": "job", "value": "nurse"})
        call = {
            "id": "call-1",
            "type": "function",
            "function": {"name": "memory_store", "arguments": arguments},
        }
        return {"content": None, "tool_calls": [call]}
    return {"content": "Nice to meet you, Ana.", "tool_calls": None}


def host_turn(memory: Any, chat_id: str, user_id: str, text: str) -> str:
    """The README's host, using only what a Memory and a Client both offer."""
    conv = memory.conversation("assistant", "telegram", chat_id, owner_id=user_id, trust="guest")
    if (reply := conv.handle_command(text)) is not None:
        return str(reply)
    notice = conv.preflight()
    conv.append_user(text)
    while True:
        message = scripted_model(conv.compose(system=SYSTEM), memory.tools.schemas())
        if not message["tool_calls"]:
            break
        calls = message["tool_calls"]
        conv.append("assistant", message["content"] or "", metadata={"tool_calls": calls})
        for call in calls:
            conv.append(
                "tool",
                memory.tools.run(call, conv),
                metadata={"tool_call_id": call["id"], "name": call["function"]["name"]},
            )
    conv.commit(message["content"] or "", usage={"prompt_tokens": 42})
    return "\n\n".join(filter(None, [notice, message["content"]]))


def _stored(memory: Any) -> list[tuple[Any, ...]]:
    conv = memory.conversation("assistant", "telegram", "42", owner_id="ana", trust="guest")
    return [
        (m.role, m.owner_id, m.sender, m.kind, m.content, m.metadata, m.trust)
        for m in conv.history()
    ]


def test_n1_the_readme_host_runs_against_both(
    tmp_path: Path, start_memory: StartMemory, server: ServerProcess
) -> None:
    """Both homes start empty, so even the stored rows' ids in the tool results agree."""
    embedded_home = tmp_path / "embedded"
    embedded_home.mkdir(mode=0o700)
    embedded = start_memory(home=embedded_home)
    client = server.client()
    replies = []
    for memory in (embedded, client):
        replies.append(
            [
                host_turn(memory, "42", "ana", "Hi! I'm Ana, a nurse."),
                host_turn(memory, "42", "ana", "/new"),  # a guest's: refused
            ]
        )
    assert replies[0] == replies[1]
    assert replies[0][0] == "Nice to meet you, Ana."
    embedded_history, remote_history = _stored(embedded), _stored(client)
    assert [row[0] for row in remote_history] == ["user", "assistant", "tool", "assistant"]
    assert remote_history == embedded_history
    assert client.conversation("assistant", "telegram", "42").state() is not None


# -- several worker processes, one conversation -----------------------------------------

WORKERS = 4
PER_WORKER = 25


def _worker(url: str, token: str, worker: int, start: Any) -> None:
    """One host worker process: its own client, appending in its own order."""
    with Client(url, token) as client:
        conv = client.conversation(AGENT, "telegram", "shared", owner_id="team")
        start.wait(timeout=60)  # all workers append at the same time
        for i in range(PER_WORKER):
            conv.append_user(f"{worker}:{i}", sender=f"worker{worker}")


@pytest.mark.slow
def test_n1_worker_processes_see_one_consistent_conversation(server: ServerProcess) -> None:
    """A host with 4 worker processes using the client sees one consistent conversation."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WORKERS)
    workers = [
        context.Process(target=_worker, args=(server.url, server.host_token, w, start))
        for w in range(WORKERS)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
        assert process.exitcode == 0, server.log()
    conv = server.client().conversation(AGENT, "telegram", "shared", owner_id="team")
    history = conv.history()
    contents = [m.content for m in history]
    assert len(contents) == WORKERS * PER_WORKER == len(set(contents))
    assert [m.id for m in history] == sorted(m.id for m in history)
    for w in range(WORKERS):
        own = [c for c in contents if c.startswith(f"{w}:")]
        assert own == [f"{w}:{i}" for i in range(PER_WORKER)]
