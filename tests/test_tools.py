"""The agent's memory tools through the dispatcher (T1-T4, SC3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix import model
from fermix.api import Conversation, Memory
from fermix.core import categories
from fermix.runtime import prompt_files
from fermix.storage import jobs, memories
from fermix.tools import SCHEMAS, JobCaller


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _run(memory: Memory, caller: Any, name: str, **arguments: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(memory.tools.run(_call(name, **arguments), caller))
    return out


def test_t4_every_tool_has_an_openai_function_schema() -> None:
    names = [tool["function"]["name"] for tool in SCHEMAS]
    assert names == ["memory_store", "memory_recall", "memory_sources_list"]
    for tool in SCHEMAS:
        assert tool["type"] == "function"
        assert tool["function"]["parameters"]["type"] == "object"


def test_t1_memory_store_writes_at_conversation_scope_and_never_renders(
    memory: Memory, home: Path
) -> None:
    conv = memory.conversation("agent", "cli", "1")
    stored = _run(memory, conv, "memory_store", key="flight", value="LIS to OPO on May 3")
    row = memory.get_row(stored["stored"]["id"])
    assert row is not None
    assert (row.scope_type, row.scope_id) == ("conversation", conv.key.scope_id)
    assert row.promote_target is None
    with memory.readers.connection() as conn:
        prompt_files.rebuild(conn, memory.home, "agent")
    user_md, memory_md = prompt_files.read_files(memory.home, "agent")
    assert "LIS to OPO" not in user_md + memory_md


def test_t2_recall_defaults_to_this_conversations_memories(memory: Memory) -> None:
    one = memory.conversation("agent", "cli", "1")
    two = memory.conversation("agent", "cli", "2")
    _run(memory, one, "memory_store", key="color", value="likes teal")
    _run(memory, two, "memory_store", key="color", value="likes mauve")
    found = _run(memory, one, "memory_recall", query="likes")
    assert [m["value"] for m in found["memories"]] == ["likes teal"]
    by_key = _run(memory, two, "memory_recall", key="color")
    assert [m["value"] for m in by_key["memories"]] == ["likes mauve"]
    assert "history" not in found


def test_t2_recall_searches_history_of_this_owner_only(memory: Memory) -> None:
    alice = memory.conversation("agent", "cli", "1", owner_id="alice")
    bob = memory.conversation("agent", "cli", "2", owner_id="bob")
    alice.append_user("my cat is called Biscuit")
    bob.append_user("my cat is called Pepper")
    mine = _run(memory, alice, "memory_recall", query="cat called", source="history", scope="all")
    assert [h["content"] for h in mine["history"]] == ["my cat is called Biscuit"]
    current = _run(memory, alice, "memory_recall", query="Pepper", source="all")
    assert current["history"] == [] and current["memories"] == []


def test_t2_a_job_sees_only_its_own_memories_and_no_history(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    conv.append_user("secret plans for the launch")
    _run(memory, conv, "memory_store", key="plan", value="launch plans in March")
    job_row = memory.write(
        lambda c: jobs.create_job(c, agent_id="agent", name="digest", schedule="@daily", prompt="p")
    )
    job = JobCaller("agent", job_row.memory_source_id)
    other = JobCaller("agent", job_row.memory_source_id + 1000)
    _run(memory, job, "memory_store", key="last_digest", value="sent the launch digest")
    found = _run(memory, job, "memory_recall", query="launch", scope="all")
    assert [m["key"] for m in found["memories"]] == ["last_digest"]
    assert "error" in _run(memory, job, "memory_recall", query="launch", source="history")
    assert _run(memory, other, "memory_recall", query="launch", scope="all")["memories"] == []
    sources = _run(memory, job, "memory_sources_list")["sources"]
    assert [s["type"] for s in sources] == ["job"]


def test_t3_sources_list_shows_job_sources(memory: Memory) -> None:
    memory.write(
        lambda c: jobs.create_job(c, agent_id="agent", name="digest", schedule="@daily", prompt="p")
    )
    conv = memory.conversation("agent", "cli", "1")
    sources = _run(memory, conv, "memory_sources_list")["sources"]
    assert {"type": "job", "name": "digest"}.items() <= sources[0].items()


@pytest.mark.parametrize(
    "call",
    [
        {"function": {"name": "memory_recall", "arguments": "{not json"}},
        {"function": {"name": "memory_recall", "arguments": "[1, 2]"}},
        {"function": {"name": "memory_recall", "arguments": json.dumps({"query": 5})}},
        {"function": {"name": "memory_recall", "arguments": json.dumps({"scope": "everyone"})}},
        {
            "function": {
                "name": "memory_recall",
                "arguments": json.dumps({"query": "x", "limit": 0}),
            }
        },
        {
            "function": {
                "name": "memory_recall",
                "arguments": json.dumps({"query": "x", "limit": True}),
            }
        },
        {"function": {"name": "memory_recall", "arguments": json.dumps({})}},
        {"function": {"name": "memory_recall", "arguments": json.dumps({"query": "x", "sql": 1})}},
        {"function": {"name": "memory_store", "arguments": json.dumps({"key": "k"})}},
        {"function": {"name": "memory_store", "arguments": json.dumps({"key": " ", "value": "v"})}},
        {
            "function": {
                "name": "memory_store",
                "arguments": json.dumps({"key": "k", "value": "x" * 5000}),
            }
        },
        {
            "function": {
                "name": "memory_store",
                "arguments": json.dumps({"key": "k\x00", "value": "v"}),
            }
        },
        {"function": {"name": "memory_store", "arguments": '{"key": "\\ud800", "value": "v"}'}},
        {"function": {"name": "rm_rf", "arguments": "{}"}},
        {"function": {"name": "memory_recall", "arguments": "[" * 100_000}},
        {"function": {}},
        {"name": "no function"},
        "not even a dict",
    ],
)
def test_t4_bad_tool_calls_come_back_as_errors_and_change_nothing(
    memory: Memory, call: Any
) -> None:
    conv = memory.conversation("agent", "cli", "1")
    before = memory.list_rows(archived=None)
    out = json.loads(memory.tools.run(call, conv))
    assert set(out) == {"error"} and out["error"]
    assert memory.list_rows(archived=None) == before


def test_t2_fts_syntax_in_a_query_is_inert(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1")
    _run(memory, conv, "memory_store", key="quote", value='she said "NEAR" (twice)')
    for query in ['"', "NEAR(", "a AND", "*", "key:value", "-(", "\x01"]:
        out = _run(memory, conv, "memory_recall", query=query, source="all")
        assert "error" not in out


owners = st.sampled_from(["", "alice", "bob"])
agents = st.sampled_from(["a1", "a2"])
chats = st.sampled_from(["1", "2"])


@given(
    rows=st.lists(
        st.tuples(
            agents,
            owners,
            st.sampled_from(["owner", "agent", "conversation", "job"]),
            chats,
            st.sampled_from(["k1", "k2"]),
        ),
        max_size=12,
    ),
    who=st.tuples(agents, owners, chats),
    scope=st.sampled_from(["current", "owner", "all"]),
    query=st.sampled_from(["fact", "k1", "fact k2", '"fact" OR *']),
)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_sc3_recall_never_returns_a_row_outside_the_callers_scopes(
    memory: Memory,
    rows: list[tuple[str, str, str, str, str]],
    who: tuple[str, str, str],
    scope: str,
    query: str,
) -> None:
    memory.write(lambda c: c.execute("DELETE FROM memories"))
    for agent, owner, scope_type, chat, key in rows:
        conv_key = memory.conversation(agent, "cli", chat).key
        scope_id = {
            "owner": categories.owner_scope_id(owner),
            "agent": agent,
            "conversation": conv_key.scope_id,
            "job": "7",
        }[scope_type]
        memory.write(
            lambda c, a=agent, o=owner, t=scope_type, s=scope_id, k=key: memories.upsert(
                c,
                agent_id=a,
                owner_id=o,
                scope=model.Scope(t, s),
                category="context",
                key=k,
                value=f"fact {k}",
                promote_target=None,
            )
        )
    agent, owner, chat = who
    conv: Conversation = memory.conversation(agent, "cli", chat, owner_id=owner)
    found = _run(memory, conv, "memory_recall", query=query, scope=scope)["memories"]
    for shown in found:
        row = memory.get_row(shown["id"])
        assert row is not None and row.agent_id == agent
        assert row.scope_type != "job"
        if row.scope_type == "agent":
            assert scope == "all" and row.owner_id in ("", owner)
        else:
            assert row.owner_id == owner
        if scope == "current":
            assert (row.scope_type, row.scope_id) == ("conversation", conv.key.scope_id)
        if row.scope_type == "owner":
            assert row.scope_id == categories.owner_scope_id(owner)
