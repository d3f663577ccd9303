"""The agent's memory tools through the dispatcher (T1-T4, SC3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from fermix import model
from fermix.config import Config
from fermix.core import categories, tool_calls
from fermix.errors import InvalidInputError
from fermix.home import Home
from fermix.model import ConversationKey, JobCaller, MemoryRow, NewMessage
from fermix.runtime.engine import Runtime
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Writes
from fermix.storage.sqlite.database import Database
from fermix.tools import SCHEMAS, MemoryTools


@dataclass(frozen=True)
class Caller:
    """A conversation as the tools see it: its key, owner and trust."""

    key: ConversationKey
    owner_id: str = ""
    trust: str = "operator"


@dataclass
class Setup:
    db: Database
    writer: Writer
    tools: MemoryTools
    files: PromptFiles

    def conversation(self, agent: str, chat: str, owner_id: str = "") -> Caller:
        return Caller(ConversationKey(agent, "cli", chat), owner_id)

    def say(self, caller: Caller, text: str) -> None:
        new = NewMessage(caller.key, "user", text, owner_id=caller.owner_id)
        self.writer.append(new, trust=caller.trust)

    def rows(self) -> list[MemoryRow]:
        with self.db.read() as reads:
            return reads.rows(archived=None)

    def row(self, memory_id: int) -> MemoryRow | None:
        with self.db.read() as reads:
            return reads.row(memory_id)

    def job(self, agent: str, name: str = "digest") -> model.ScheduledJob:
        return self.db.write(
            lambda w: w.create_job(agent_id=agent, name=name, schedule="@daily", prompt="p")
        )


def open_setup(root: Path) -> Setup:
    home = Home(root)
    home.root.mkdir(parents=True, exist_ok=True)
    db = Database(home.db_path)
    files = PromptFiles(home, db)
    writer = Writer(db, files)
    return Setup(db, writer, MemoryTools(db, writer), files)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    opened = open_setup(tmp_path / "home")
    yield opened
    opened.files.settle()  # a queued rebuild reads the store on its own thread
    opened.db.close()


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _run(setup: Setup, caller: Any, name: str, **arguments: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(setup.tools.run(_call(name, **arguments), caller))
    return out


def _error(setup: Setup, name: str, raw: str) -> str:
    conv = setup.conversation("agent", "1")
    out = json.loads(setup.tools.run({"function": {"name": name, "arguments": raw}}, conv))
    assert set(out) == {"error"}
    error: str = out["error"]
    return error


def test_t4_every_tool_has_an_openai_function_schema() -> None:
    names = [tool["function"]["name"] for tool in SCHEMAS]
    assert names == ["memory_store", "memory_recall", "memory_sources_list"]
    for tool in SCHEMAS:
        assert tool["type"] == "function"
        assert tool["function"]["parameters"]["type"] == "object"


# Keywords every tool-calling provider accepts in a function's parameters (no $ref, anyOf,
# pattern or format, which some reject or drop).
PORTABLE_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "description",
    "enum",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
}


def _keywords(schema: dict[str, Any]) -> set[str]:
    found = set(schema)
    for sub in schema.get("properties", {}).values():
        found |= _keywords(sub)
    return found


def test_t4_the_schemas_are_valid_json_schema_with_portable_keywords_only() -> None:
    for tool in SCHEMAS:
        parameters = tool["function"]["parameters"]
        Draft202012Validator.check_schema(parameters)
        assert _keywords(parameters) <= PORTABLE_KEYWORDS
        assert parameters["additionalProperties"] is False
        assert set(parameters.get("required", [])) <= set(parameters["properties"])


def test_t4_the_schemas_hold_the_limits_the_checks_enforce() -> None:
    store = SCHEMAS[0]["function"]["parameters"]["properties"]
    recall = SCHEMAS[1]["function"]["parameters"]["properties"]
    assert store["key"]["maxLength"] == tool_calls.MAX_KEY_CHARS
    assert store["value"]["maxLength"] == tool_calls.MAX_VALUE_CHARS
    assert recall["query"]["maxLength"] == tool_calls.MAX_QUERY_CHARS
    assert recall["key"]["maxLength"] == tool_calls.MAX_KEY_CHARS
    assert (recall["limit"]["minimum"], recall["limit"]["maximum"]) == (1, tool_calls.MAX_LIMIT)
    assert recall["scope"]["enum"] == list(categories.RECALL_SCOPES)


def test_t4_schemas_returns_a_copy_the_host_may_change() -> None:
    given_out = MemoryTools.schemas()
    given_out[0]["function"]["name"] = "changed"
    assert MemoryTools.schemas()[0]["function"]["name"] == "memory_store"


def test_t1_memory_store_writes_at_conversation_scope_and_never_renders(setup: Setup) -> None:
    conv = setup.conversation("agent", "1")
    stored = _run(setup, conv, "memory_store", key="flight", value="LIS to OPO on May 3")
    row = setup.row(stored["stored"]["id"])
    assert row is not None
    assert (row.scope_type, row.scope_id) == ("conversation", conv.key.scope_id)
    assert (row.category, row.promote_target) == ("context", None)
    assert (row.source_type, row.session_id) == ("tool", conv.key.scope_id)
    setup.writer.files.rebuild("agent", "")
    user_md, memory_md = setup.writer.files.texts("agent", "")
    assert "LIS to OPO" not in user_md + memory_md


def test_t1_storing_a_key_again_replaces_its_value_trimmed(setup: Setup) -> None:
    conv = setup.conversation("agent", "1")
    first = _run(setup, conv, "memory_store", key="flight", value="May 3")
    second = _run(setup, conv, "memory_store", key=" flight ", value="  May 4 ")
    assert second["stored"] == {"id": first["stored"]["id"], "key": "flight", "value": "May 4"}
    assert [r.value for r in setup.rows()] == ["May 4"]


def test_t2_recall_defaults_to_this_conversations_memories(setup: Setup) -> None:
    one = setup.conversation("agent", "1")
    two = setup.conversation("agent", "2")
    _run(setup, one, "memory_store", key="color", value="likes teal")
    _run(setup, two, "memory_store", key="color", value="likes mauve")
    found = _run(setup, one, "memory_recall", query="likes")
    assert [m["value"] for m in found["memories"]] == ["likes teal"]
    by_key = _run(setup, two, "memory_recall", key="color")
    assert [m["value"] for m in by_key["memories"]] == ["likes mauve"]
    assert "history" not in found
    owner_wide = _run(setup, one, "memory_recall", query="likes", scope="owner")
    assert sorted(m["value"] for m in owner_wide["memories"]) == ["likes mauve", "likes teal"]
    limited = _run(setup, one, "memory_recall", query="likes", scope="owner", limit=1)
    assert len(limited["memories"]) == 1


def test_t2_recall_searches_history_of_this_owner_only(setup: Setup) -> None:
    alice = setup.conversation("agent", "1", owner_id="alice")
    bob = setup.conversation("agent", "2", owner_id="bob")
    setup.say(alice, "my cat is called Biscuit")
    setup.say(bob, "my cat is called Pepper")
    mine = _run(setup, alice, "memory_recall", query="cat called", source="history", scope="all")
    assert [h["content"] for h in mine["history"]] == ["my cat is called Biscuit"]
    assert mine["history"][0]["conversation"] == alice.key.scope_id
    current = _run(setup, alice, "memory_recall", query="Pepper", source="all")
    assert current["history"] == [] and current["memories"] == []


def test_t2_a_job_sees_only_its_own_memories_and_no_history(setup: Setup) -> None:
    conv = setup.conversation("agent", "1")
    setup.say(conv, "secret plans for the launch")
    _run(setup, conv, "memory_store", key="plan", value="launch plans in March")
    job_row = setup.job("agent")
    run = setup.db.write(lambda w: w.start_run(job_row.id))
    job = JobCaller("agent", job_row.memory_source_id, run_id=run.id)
    other = JobCaller("agent", job_row.memory_source_id + 1000)  # no such source (M9)
    stored = _run(setup, job, "memory_store", key="last_digest", value="sent the launch digest")
    row = setup.row(stored["stored"]["id"])
    assert row is not None and row.scope == categories.job_scope(job_row.memory_source_id)
    assert (row.source_id, row.source_type, row.run_id) == (job_row.memory_source_id, "job", run.id)
    found = _run(setup, job, "memory_recall", query="launch", scope="all")
    assert [m["key"] for m in found["memories"]] == ["last_digest"]
    assert "error" in _run(setup, job, "memory_recall", query="launch", source="history")
    refused = f"memory source {other.memory_source_id} does not exist"
    assert refused in _run(setup, other, "memory_recall", query="launch", scope="all")["error"]
    sources = _run(setup, job, "memory_sources_list")["sources"]
    assert [s["type"] for s in sources] == ["job"]
    assert refused in _run(setup, other, "memory_sources_list")["error"]


@pytest.mark.parametrize("source_id", [0, -1, True, "7", 1.0, None])
def test_t2_a_job_caller_refuses_a_memory_source_id_that_is_not_a_positive_int(
    source_id: Any,
) -> None:
    with pytest.raises(InvalidInputError, match="memory_source_id"):
        JobCaller("agent", source_id)


def test_t2_a_job_caller_is_exported_from_the_package() -> None:
    import fermix

    assert fermix.JobCaller is JobCaller


def test_t3_sources_list_shows_job_sources(setup: Setup) -> None:
    setup.job("agent")
    conv = setup.conversation("agent", "1")
    sources = _run(setup, conv, "memory_sources_list")["sources"]
    assert {"type": "job", "name": "digest"}.items() <= sources[0].items()
    assert _run(setup, setup.conversation("other", "1"), "memory_sources_list")["sources"] == []


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
def test_t4_bad_tool_calls_come_back_as_errors_and_change_nothing(setup: Setup, call: Any) -> None:
    conv = setup.conversation("agent", "1")
    before = setup.rows()
    out = json.loads(setup.tools.run(call, conv))
    assert set(out) == {"error"} and out["error"]
    assert setup.rows() == before


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("memory_recall", {"query": "x", "sql": 1}, "unknown argument 'sql'"),
        ("memory_recall", {"query": "x", "a": 1, "b": 2}, "unknown arguments 'a', 'b'"),
        ("memory_sources_list", {"all": True}, "memory_sources_list takes no arguments"),
        ("memory_store", {"key": "k"}, "missing argument 'value'"),
        ("memory_store", {}, "missing arguments 'key', 'value'"),
        ("memory_recall", {"query": 5}, "query must be a string, not an integer"),
        ("memory_store", {"key": "k", "value": None}, "value must be a string, not null"),
        ("memory_recall", {"query": "x", "limit": 0}, "limit must be an integer from 1 to 20"),
        ("memory_recall", {"query": "x", "limit": 21}, "limit must be an integer from 1 to 20"),
        ("memory_recall", {"query": "x", "limit": True}, "limit must be an integer, not a bool"),
        ("memory_recall", {"query": "x", "limit": "5"}, "limit must be an integer, not a string"),
        ("memory_recall", {"scope": "everyone", "key": "k"}, "scope must be one of current, owner"),
        ("memory_recall", {"source": "web", "key": "k"}, "source must be one of memories, hist"),
        ("memory_store", {"key": "k" * 201, "value": "v"}, "key must be at most 200 characters"),
        ("memory_store", {"key": "k", "value": "v" * 2001}, "value must be at most 2000 char"),
        ("memory_recall", {"query": "q" * 2001}, "query must be at most 2000 characters"),
        ("memory_store", {"key": "", "value": "v"}, "key must not be empty"),
        ("memory_store", {"key": "k", "value": " \n"}, "value must not be empty"),
        ("memory_store", {"key": "k\x00", "value": "v"}, "key must not contain NUL characters"),
        ("memory_recall", {"query": "a\x00b"}, "query must not contain NUL characters"),
        ("memory_recall", {}, "give a query or a key"),
        ("memory_recall", {"query": "  ", "key": ""}, "give a query or a key"),
    ],
)
def test_t4_each_refused_argument_is_named_in_the_error(
    setup: Setup, name: str, arguments: dict[str, Any], message: str
) -> None:
    assert message in _error(setup, name, json.dumps(arguments))


def test_t4_every_broken_argument_is_named_at_once(setup: Setup) -> None:
    error = _error(
        setup, "memory_recall", json.dumps({"query": 5, "limit": 99, "scope": "x", "y": 1})
    )
    parts = error.split("; ")
    assert parts[0].startswith("unknown argument 'y'")
    assert [p.split()[0] for p in parts[1:]] == ["query", "scope", "limit"]


def test_t4_invalid_unicode_is_refused_by_name(setup: Setup) -> None:
    error = _error(setup, "memory_store", '{"key": "k", "value": "\\udc00"}')
    assert error == "value is not valid Unicode text"
    json.dumps(error).encode("utf-8")


def test_t4_an_unknown_tool_names_the_tools(setup: Setup) -> None:
    error = _error(setup, "rm_rf", "{}")
    assert error.startswith("unknown tool 'rm_rf'") and "memory_recall" in error


def test_t4_a_litellm_style_object_and_a_dict_of_arguments_both_run(setup: Setup) -> None:
    @dataclass
    class Function:
        name: str
        arguments: Any

    @dataclass
    class ToolCall:
        function: Function

    conv = setup.conversation("agent", "1")
    setup.tools.run(ToolCall(Function("memory_store", '{"key":"k","value":"v"}')), conv)
    as_dict = {"function": {"name": "memory_recall", "arguments": {"key": "k", "limit": 5.0}}}
    out = json.loads(setup.tools.run(as_dict, conv))
    assert [m["value"] for m in out["memories"]] == ["v"]
    listed = json.loads(setup.tools.run(ToolCall(Function("memory_sources_list", None)), conv))
    assert listed == {"sources": []}


def test_t4_a_caller_that_is_no_conversation_comes_back_as_an_error(setup: Setup) -> None:
    out = json.loads(setup.tools.run(_call("memory_sources_list"), cast(Any, object())))
    assert set(out) == {"error"}


def test_t4_tools_made_before_their_runtime_starts_refuse_until_it_runs(tmp_path: Path) -> None:
    runtime = Runtime(Home(tmp_path / "home"), Config())
    tools = MemoryTools(runtime)  # made before the runtime has built its services
    conv = Caller(ConversationKey("agent", "cli", "1"))
    early = json.loads(tools.run(_call("memory_store", key="k", value="v"), conv))
    assert "not running" in early["error"]
    runtime.start()
    try:
        out = json.loads(tools.run(_call("memory_store", key="k", value="v"), conv))
        assert out["stored"]["value"] == "v"
    finally:
        runtime.close()
    late = json.loads(tools.run(_call("memory_store", key="k", value="w"), conv))
    assert "not running" in late["error"]


def test_t2_fts_syntax_in_a_query_is_inert(setup: Setup) -> None:
    conv = setup.conversation("agent", "1")
    _run(setup, conv, "memory_store", key="quote", value='she said "NEAR" (twice)')
    for query in ['"', "NEAR(", "a AND", "*", "key:value", "-(", "\x01"]:
        out = _run(setup, conv, "memory_recall", query=query, source="all")
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
    by_key=st.booleans(),
)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_sc3_recall_never_returns_a_row_outside_the_callers_scopes(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, str, str, str, str]],
    who: tuple[str, str, str],
    scope: str,
    query: str,
    by_key: bool,
) -> None:
    setup = open_setup(tmp_path_factory.mktemp("sc3") / "home")

    def seed(writes: Writes) -> None:
        for agent, owner, scope_type, chat, key in rows:
            scope_id = {
                "owner": categories.owner_scope_id(owner),
                "agent": agent,
                "conversation": ConversationKey(agent, "cli", chat).scope_id,
                "job": "7",
            }[scope_type]
            writes.upsert_row(
                agent_id=agent,
                owner_id=owner,
                scope=model.Scope(scope_type, scope_id),
                category="context",
                key=key,
                value=f"fact {key}",
                promote_target=None,
            )

    setup.db.write(seed, label="seed")
    agent, owner, chat = who
    conv = setup.conversation(agent, chat, owner_id=owner)
    asked = {"key": query} if by_key else {"query": query}
    found = _run(setup, conv, "memory_recall", scope=scope, limit=20, **asked)["memories"]
    assert len({shown["id"] for shown in found}) == len(found)
    for shown in found:
        row = setup.row(shown["id"])
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
    setup.files.settle()
    setup.db.close()
