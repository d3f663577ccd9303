"""LangGraph's store over fermix's rows (I3): FermixStore, and the surface it needs
(``put_row``, ``archive_row``, ``recall_rows`` on Memory, Client and the HTTP API).

The store is driven through LangGraph's own loop: a ``StateGraph`` compiled with
``store=FermixStore(...)`` whose nodes read and write it through ``runtime.store`` and
``get_store()``, one of them calling the loopback model server with the openai client.
langgraph ships no reusable store conformance suite; the tests of its in-memory store
(``libs/checkpoint/tests/test_store.py``: list_namespaces with prefix, suffix, wildcards,
max_depth and pages; namespace validation; non-ASCII values; search pages and filters)
are ported below onto fermix's namespaces. Its vector tests (``index`` configs with fake
embeddings) do not apply: fermix embeds with its own model (Q1), not LangGraph's.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import openai
import pytest
from docs_page import section
from fastapi.testclient import TestClient
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, PutOp, SearchOp
from model_server import ModelServer, text_reply
from server_fixtures import ServerProcess

from fermix.api import Memory
from fermix.errors import AccessDeniedError, InvalidInputError, NotFoundError
from fermix.home import Home
from fermix.integrations.langgraph import (
    FermixStore,
    UnmappedNamespaceError,
    label,
    namespace_of,
    place_of,
)
from fermix.model import ConversationKey, Provenance, Scope
from fermix.server.http.app import create_app

AGENT = "assistant"


def store_of(memory: Any, **keywords: Any) -> FermixStore:
    return FermixStore(memory, AGENT, **keywords)


# -- the store through LangGraph's own loop ----------------------------------------------


@dataclass
class Context:
    user_id: str


class State(TypedDict, total=False):
    question: str
    answer: str


def graph_for(store: FermixStore, model_url: str) -> Any:
    """A two-node graph: ``respond`` recalls the user's items and asks the model with them,
    ``remember`` stores the question."""

    def respond(state: State, runtime: Runtime[Context]) -> State:
        assert runtime.store is not None
        namespace = ("owner", label(runtime.context.user_id))
        found = runtime.store.search(namespace, query=state["question"], limit=3)
        facts = "; ".join(str(item.value.get("fact")) for item in found)
        model = openai.OpenAI(base_url=model_url, api_key="sk-test")
        reply = model.chat.completions.create(
            model="host",
            messages=[
                {"role": "system", "content": f"Known facts: {facts}"},
                {"role": "user", "content": state["question"]},
            ],
        )
        return {"answer": reply.choices[0].message.content or ""}

    def remember(state: State, runtime: Runtime[Context]) -> State:
        namespace = ("owner", label(runtime.context.user_id))
        get_store().put(namespace, "last_question", {"fact": state["question"]})
        return {}

    builder = StateGraph(State, context_schema=Context)
    builder.add_node("respond", respond)
    builder.add_node("remember", remember)
    builder.add_edge(START, "respond")
    builder.add_edge("respond", "remember")
    builder.add_edge("remember", END)
    return builder.compile(store=store)


def test_i3_a_graph_turn_recalls_and_writes_through_the_store(
    memory: Memory, model_server: ModelServer
) -> None:
    store = store_of(memory)
    store.put(("owner", "alice"), "home", {"fact": "Alice lives in Porto"})
    store.put(("owner", "bob"), "home", {"fact": "Bob lives in Lisbon"})
    model_server.reply("You live in Porto.")
    graph = graph_for(store, model_server.url)
    out = graph.invoke({"question": "Where do I live?"}, context=Context("alice"))
    assert out["answer"] == "You live in Porto."
    prompt = str(model_server.requests[0]["messages"])
    assert "Alice lives in Porto" in prompt and "Lisbon" not in prompt  # SC3
    item = store.get(("owner", "alice"), "last_question")
    assert item is not None and item.value == {"fact": "Where do I live?"}
    (row,) = memory.list_rows(agent_id=AGENT, owner_id="alice", key="last_question")
    assert (row.scope_type, row.scope_id, row.category, row.promote_target) == (
        "owner",
        "alice",
        "context",
        None,
    )
    assert (row.source_type, row.source_name) == ("host", "langgraph")
    assert memory.conversation(AGENT, "web", "x", owner_id="alice").memory_files()[0] == ""


def test_i3_an_async_graph_turn_uses_the_async_forms(
    memory: Memory, model_server: ModelServer
) -> None:
    store = store_of(memory)
    model_server.reply("Noted.")
    graph = graph_for(store, model_server.url)
    out = asyncio.run(graph.ainvoke({"question": "Remember tea"}, context=Context("carol")))
    assert out["answer"] == "Noted."
    found = asyncio.run(store.asearch(("owner", "carol"), query="tea"))
    assert [i.value for i in found] == [{"fact": "Remember tea"}]


# -- put, get, search, delete, list_namespaces ------------------------------------------


def test_i3_put_get_search_delete_and_list(memory: Memory) -> None:
    store = store_of(memory)
    store.put(("owner", "alice"), "diet", {"fact": "vegetarian", "since": 2019})
    store.put(("agent", "alice"), "project", {"fact": "writing a novel about whales"})
    key = ConversationKey(AGENT, "telegram", "42")
    store.put(("conversation", "alice", "telegram", "42"), "flight", {"fact": "TAP 123"})
    item = store.get(("owner", "alice"), "diet")
    assert item is not None and item.value == {"fact": "vegetarian", "since": 2019}
    assert item.namespace == ("owner", "alice") and item.created_at.tzinfo is not None
    hits = store.search(("owner", "alice"), query="vegetarian")
    assert [(h.key, h.score) for h in hits] == [("diet", 1.0)]
    whole = store.search((), query="whales novel")
    assert [(h.namespace, h.key) for h in whole] == [(("agent", "alice"), "project")]
    assert store.list_namespaces() == [
        ("agent", "alice"),
        ("conversation", "alice", "telegram", "42"),
        ("owner", "alice"),
    ]
    (row,) = memory.list_rows(agent_id=AGENT, key="flight")
    assert row.scope_id == key.scope_id  # the conversation's own scope (SC1)
    store.delete(("owner", "alice"), "diet")
    assert store.get(("owner", "alice"), "diet") is None
    assert store.search(("owner", "alice")) == []
    (archived,) = memory.list_rows(agent_id=AGENT, key="diet", archived=True)
    assert archived.archived_by == "langgraph"  # S7: archived, restorable
    memory.restore_row(archived.id)
    assert store.get(("owner", "alice"), "diet") is not None
    store.put(("owner", "alice"), "diet", {"fact": "vegan"})
    assert store.get(("owner", "alice"), "diet").value == {"fact": "vegan"}  # type: ignore[union-attr]


def test_i3_the_async_forms(memory: Memory) -> None:
    store = store_of(memory)

    async def run() -> tuple[Any, ...]:
        await store.aput(("owner", "dana"), "pet", {"fact": "a cat called Miso"})
        got = await store.aget(("owner", "dana"), "pet")
        found = await store.asearch(("owner",), query="cat")
        names = await store.alist_namespaces(prefix=("owner",))
        await store.adelete(("owner", "dana"), "pet")
        gone = await store.aget(("owner", "dana"), "pet")
        return got, found, names, gone

    got, found, names, gone = asyncio.run(run())
    assert got.value == {"fact": "a cat called Miso"}
    assert [i.key for i in found] == ["pet"]
    assert names == [("owner", "dana")]
    assert gone is None


def test_i3_batch_runs_its_operations_in_order(memory: Memory) -> None:
    store = store_of(memory)
    ns = ("owner", "erin")
    results = store.batch(
        [
            PutOp(ns, "a", {"n": 1}),
            GetOp(ns, "a"),
            PutOp(ns, "a", {"n": 2}),
            SearchOp(ns),
            PutOp(ns, "a", None),
            GetOp(ns, "a"),
            ListNamespacesOp(),
        ]
    )
    assert results[0] is None and results[1].value == {"n": 1}  # type: ignore[union-attr]
    assert [i.value for i in results[3]] == [{"n": 2}]  # type: ignore[union-attr]
    assert results[5] is None and results[6] == []


def test_i3_sc3_two_owners_never_see_each_others_items(memory: Memory) -> None:
    store = store_of(memory)
    for owner in ("alice", "bob"):
        store.put(("owner", owner), "color", {"fact": f"{owner} likes green"})
        store.put(("agent", owner), "work", {"fact": f"{owner} works on green energy"})
    for owner, other in (("alice", "bob"), ("bob", "alice")):
        for prefix in (("owner", owner), ("agent", owner)):
            found = store.search(prefix, query="green")
            assert found and all(other not in str(i.value) for i in found), prefix
            assert all(i.namespace[1] == owner for i in store.search(prefix))
        assert store.get(("owner", owner), "work") is None
    # Another agent's store sees neither.
    assert FermixStore(memory, "other").search((), query="green") == []


def test_i3_reviewer_rows_in_a_scope_read_back_as_text(memory: Memory) -> None:
    """Rows other writers made (here one like the reviewer's) are items of their scope."""
    # As the reviewer writes: through the one write path.
    memory._runtime.write_rows(
        lambda w: [
            w.upsert_row(
                agent_id=AGENT,
                owner_id="fay",
                scope=Scope("owner", "fay"),
                category="identity",
                key="name",
                value="Fay Wray",
                promote_target="user_md",
                provenance=Provenance(source_type="conversation"),
            )
        ],
        label="seed",
        reason="seed",
    )
    item = store_of(memory).get(("owner", "fay"), "name")
    assert item is not None and item.value == {"text": "Fay Wray"}


def test_i3_labels_encode_periods_percent_and_the_default_owner(memory: Memory) -> None:
    store = store_of(memory)
    owner = "ana.silva@example.com"
    assert label(owner) == "ana%2Esilva@example%2Ecom" and label("") == "%00"
    store.put(("owner", label(owner)), "k", {"v": 1})
    store.put(("owner", label("")), "k", {"v": 2})
    store.put(("owner", label("50%")), "k", {"v": 3})
    (row,) = memory.list_rows(agent_id=AGENT, owner_id=owner)
    assert row.scope_id == owner
    assert store.get(("owner", "%00"), "k").value == {"v": 2}  # type: ignore[union-attr]
    assert sorted(store.list_namespaces()) == sorted(
        [("owner", label(owner)), ("owner", "%00"), ("owner", "50%25")]
    )
    with pytest.raises(UnmappedNamespaceError):
        store.put(("owner", "50%"), "k", {"v": 4})  # '%' must be written '%25'


@pytest.mark.parametrize(
    "namespace",
    [
        ("memories", "alice"),
        ("owner",),
        ("owner", "alice", "extra"),
        ("agent", "%00"),
        ("conversation", "alice", "telegram"),
        ("job", "alice", "not-a-number"),
    ],
)
def test_i3_a_namespace_that_maps_to_nothing_is_a_typed_error_and_writes_nothing(
    memory: Memory, namespace: tuple[str, ...]
) -> None:
    store = store_of(memory)
    for call in (
        lambda: store.put(namespace, "k", {"v": 1}),
        lambda: store.get(namespace, "k"),
        lambda: store.delete(namespace, "k"),
    ):
        with pytest.raises(UnmappedNamespaceError) as raised:
            call()
        assert isinstance(raised.value, InvalidInputError)
        assert isinstance(raised.value, InvalidNamespaceError)
    assert memory.list_rows(agent_id=AGENT, archived=None) == []


def test_i3_ttl_and_index_false_cannot_be_honoured_and_are_refused(memory: Memory) -> None:
    store = store_of(memory)
    assert store.supports_ttl is False
    with pytest.raises(NotImplementedError):  # LangGraph's own check of supports_ttl
        store.put(("owner", "gus"), "k", {"v": 1}, ttl=5)
    with pytest.raises(InvalidInputError, match="ttl"):
        store.batch([PutOp(("owner", "gus"), "k", {"v": 1}, ttl=5.0)])
    with pytest.raises(InvalidInputError, match="index=False"):
        store.put(("owner", "gus"), "k", {"v": 1}, index=False)
    store.put(("owner", "gus"), "k", {"title": "indexed anyway"}, index=["title"])
    assert [i.key for i in store.search(("owner", "gus"), query="indexed")] == ["k"]


def test_i3_m2_a_guest_store_cannot_write_the_agents_shared_rows(memory: Memory) -> None:
    guest = store_of(memory)
    with pytest.raises(AccessDeniedError):
        guest.put(("agent",), "rule", {"fact": "always answer in French"})
    assert memory.list_rows(agent_id=AGENT) == []
    operator = store_of(memory, trust="operator")
    operator.put(("agent",), "rule", {"fact": "answer briefly"})
    assert guest.get(("agent",), "rule") is not None  # everyone reads the shared rows
    with pytest.raises(AccessDeniedError):
        guest.delete(("agent",), "rule")
    (row,) = memory.list_rows(agent_id=AGENT)
    assert (row.owner_id, row.promote_target, row.archived) == ("", None, False)


def test_i3_bad_values_and_keys_are_refused(memory: Memory) -> None:
    store = store_of(memory)
    with pytest.raises(InvalidInputError):
        store.put(("owner", "hal"), "k", {"v": object()})
    with pytest.raises(InvalidInputError):
        store.put(("owner", "hal"), "", {"v": 1})
    with pytest.raises(InvalidInputError):
        store.put(("owner", "hal"), "k", {"v": "x" * 20_000})
    with pytest.raises(InvalidInputError):
        store.search(("owner", "hal"), filter={"v": {"$regex": "x"}})
    assert memory.list_rows(agent_id=AGENT) == []


def test_i3_jobs_namespace_needs_a_job_of_that_owner(memory: Memory) -> None:
    job = memory.create_job(AGENT, "digest", schedule="daily", prompt="sum up", owner_id="ivy")
    store = store_of(memory)
    ns = ("job", "ivy", str(job.memory_source_id))
    store.put(ns, "last", {"fact": "sent Monday"})
    assert store.get(ns, "last") is not None
    assert store.list_namespaces(prefix=("job",)) == [ns]
    with pytest.raises(NotFoundError):
        store.put(("job", "mallory", str(job.memory_source_id)), "x", {"v": 1})
    # The job's own run recalls it (T2): the store wrote the job's scope.
    caller = memory.job_caller(memory.start_run(job.id).id)
    call = {"function": {"name": "memory_recall", "arguments": '{"key": "last"}'}}
    assert "sent Monday" in memory.tools.run(call, caller)


def test_i3_place_and_namespace_are_inverse(memory: Memory) -> None:
    for namespace in (
        ("owner", "alice"),
        ("owner", "%00"),
        ("agent",),
        ("agent", "bob"),
        ("conversation", "alice", "slack", "C1%2E2", "t%25"),
        ("conversation", "%00", "web", "chat"),
    ):
        place = place_of(namespace, AGENT)
        row = memory.put_row(
            AGENT,
            f"k{len(namespace)}",
            "{}",
            scope=place.scope,
            owner_id=place.owner_id,
            trust="operator",
        )
        assert namespace_of(row) == namespace


# -- ported from langgraph's libs/checkpoint/tests/test_store.py ---------------------------

PORTED_NAMESPACES = [
    ("owner", "a"),
    ("owner", "b"),
    ("agent",),
    ("agent", "a"),
    ("conversation", "a", "web", "1"),
    ("conversation", "a", "web", "1", "t"),
    ("conversation", "a", "web", "2"),
    ("conversation", "b", "sms", "1"),
]


@pytest.fixture
def filled(memory: Memory) -> FermixStore:
    store = store_of(memory, trust="operator")
    for i, namespace in enumerate(PORTED_NAMESPACES):
        store.put(namespace, f"id_{i}", {"data": f"value_{i:02d}", "n": i})
    return store


def test_i3_list_namespaces_basic_prefix_suffix_and_pages(filled: FermixStore) -> None:
    assert filled.list_namespaces() == sorted(PORTED_NAMESPACES)
    assert filled.list_namespaces(prefix=("conversation", "a")) == [
        ("conversation", "a", "web", "1"),
        ("conversation", "a", "web", "1", "t"),
        ("conversation", "a", "web", "2"),
    ]
    assert filled.list_namespaces(suffix=("1",)) == [
        ("conversation", "a", "web", "1"),
        ("conversation", "b", "sms", "1"),
    ]
    assert filled.list_namespaces(prefix=("conversation",), suffix=("web", "2")) == [
        ("conversation", "a", "web", "2")
    ]
    assert filled.list_namespaces(prefix=("conversation", "a"), limit=2) == [
        ("conversation", "a", "web", "1"),
        ("conversation", "a", "web", "1", "t"),
    ]
    assert filled.list_namespaces(prefix=("conversation", "a"), offset=2) == [
        ("conversation", "a", "web", "2")
    ]
    assert filled.list_namespaces(prefix=("nonexistent",)) == []
    assert filled.list_namespaces(prefix=("owner", "a")) == [("owner", "a")]


def test_i3_list_namespaces_with_wildcards_and_max_depth(filled: FermixStore) -> None:
    assert filled.list_namespaces(prefix=("conversation", "*", "*", "1")) == [
        ("conversation", "a", "web", "1"),
        ("conversation", "a", "web", "1", "t"),
        ("conversation", "b", "sms", "1"),
    ]
    assert filled.list_namespaces(suffix=("*", "a")) == [("agent", "a"), ("owner", "a")]
    assert filled.list_namespaces(prefix=("*", "a"), suffix=("*", "t")) == [
        ("conversation", "a", "web", "1", "t")
    ]
    assert filled.list_namespaces(max_depth=2) == [
        ("agent",),
        ("agent", "a"),
        ("conversation", "a"),
        ("conversation", "b"),
        ("owner", "a"),
        ("owner", "b"),
    ]
    assert filled.list_namespaces(prefix=("conversation",), max_depth=4) == [
        ("conversation", "a", "web", "1"),
        ("conversation", "a", "web", "2"),
        ("conversation", "b", "sms", "1"),
    ]


def test_i3_list_namespaces_of_an_empty_store(memory: Memory) -> None:
    assert store_of(memory).list_namespaces() == []


def test_i3_cannot_put_an_empty_or_invalid_namespace(memory: Memory) -> None:
    store = store_of(memory)
    for namespace in ((), ("owner", "thing.about"), ("owner", ""), ("langgraph", "foo")):
        with pytest.raises(InvalidNamespaceError):
            store.put(namespace, "foo", {"foo": "bar"})
        with pytest.raises(InvalidNamespaceError):
            asyncio.run(store.aput(namespace, "foo", {"foo": "bar"}))
    with pytest.raises(InvalidNamespaceError):  # past the public put, as the port does
        store.batch([PutOp(("owner", "a.b"), "foo", {"foo": "bar"})])
    assert memory.list_rows(agent_id=AGENT, archived=None) == []


def test_i3_search_prefixes_filters_and_pages(filled: FermixStore) -> None:
    assert [i.key for i in filled.search(("conversation", "a", "web", "1"))] == ["id_5", "id_4"]
    assert [i.key for i in filled.search(("conversation", "a", "web"))] == [
        "id_6",
        "id_5",
        "id_4",
    ]
    assert [i.key for i in filled.search(("agent",))] == ["id_3", "id_2"]
    assert [i.key for i in filled.search((), filter={"n": {"$gte": 6}})] == ["id_7", "id_6"]
    assert [i.key for i in filled.search((), filter={"data": "value_01"})] == ["id_1"]
    assert [i.key for i in filled.search((), filter={"n": {"$ne": 0}}, limit=2, offset=1)] == [
        "id_6",
        "id_5",
    ]
    found = filled.search(("conversation",), query="value_06", filter={"n": 6})
    assert [i.key for i in found] == ["id_6"] and found[0].score is not None
    with pytest.raises(UnmappedNamespaceError):
        filled.search(("memories",))


def test_i3_non_ascii_values_round_trip(memory: Memory) -> None:
    store = store_of(memory)
    store.put(("owner", "zoë"), "user1", {"name": "张三", "city": "Lisboa, Portugal"})
    store.put(("owner", "zoë"), "user2", {"name": "Юрий", "emoji": "🍵"})
    assert store.get(("owner", "zoë"), "user1").value["name"] == "张三"  # type: ignore[union-attr]
    assert store.get(("owner", "zoë"), "user2").value["emoji"] == "🍵"  # type: ignore[union-attr]
    assert [i.key for i in store.search(("owner", "zoë"), query="Юрий")] == ["user2"]


# -- the surface operation: Memory.put_row / archive_row / recall_rows --------------------


def test_i3_sc3_put_row_checks_the_scope_for_its_owner(memory: Memory) -> None:
    with pytest.raises(InvalidInputError, match="owner-scoped"):
        memory.put_row(AGENT, "k", "v", scope=Scope("owner", "bob"), owner_id="alice")
    with pytest.raises(InvalidInputError):
        memory.put_row(AGENT, "k", "v", scope=Scope("agent", "other"), owner_id="alice")
    with pytest.raises(InvalidInputError, match="conversation"):
        memory.put_row(AGENT, "k", "v", scope=Scope("conversation", "nocolon"), owner_id="a")
    with pytest.raises(NotFoundError):
        memory.put_row(AGENT, "k", "v", scope=Scope("job", "999"), owner_id="a")
    with pytest.raises(AccessDeniedError):
        memory.put_row(AGENT, "k", "v", scope=Scope("agent", AGENT))
    assert memory.list_rows(agent_id=AGENT, archived=None) == []


def test_i3_q3_recall_rows_finds_rows_within_its_filters(memory: Memory) -> None:
    for owner in ("alice", "bob"):
        memory.put_row(
            AGENT, "food", f"{owner} loves pizza", scope=Scope("owner", owner), owner_id=owner
        )
    found = memory.recall_rows("pizza", agent_id=AGENT, owner_id="alice")
    assert [r.owner_id for r in found] == ["alice"]
    assert len(memory.recall_rows("pizza", agent_id=AGENT, scope_type="owner")) == 2
    assert memory.recall_rows("pizza", agent_id=AGENT, scope_type="agent") == []
    with pytest.raises(InvalidInputError):
        memory.recall_rows("pizza", agent_id=AGENT, scope=Scope("owner", "a"), scope_type="owner")


@pytest.fixture
def site(memory: Memory) -> Any:
    tokens = memory.tokens
    _, host = tokens.create([AGENT], name="host")
    _, operator = tokens.create([AGENT], operator=True, name="operator")
    _, stranger = tokens.create(["other"], name="other")
    with TestClient(create_app(memory)) as http:
        yield http, *({"Authorization": f"Bearer {s}"} for s in (host, operator, stranger))


def _error(response: Any, status: int, field: str | None) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"].get("field") == field, response.text


def test_i3_n2_the_put_and_archive_routes_follow_the_token(memory: Memory, site: Any) -> None:
    http, host, operator, stranger = site
    base = f"/v1/agents/{AGENT}/memories"
    body = {
        "owner_id": "alice",
        "scope_type": "owner",
        "scope_id": "alice",
        "key": "k",
        "value": '{"v": 1}',
    }
    put = http.post(f"{base}/put", json=body, headers=host)
    assert put.status_code == 200 and put.json()["source_type"] == "host"
    shared = body | {"owner_id": "", "scope_type": "agent", "scope_id": AGENT}
    _error(http.post(f"{base}/put", json=shared, headers=host), 403, "body.owner_id")
    _error(
        http.post(f"{base}/put", json=shared | {"trust": "operator"}, headers=host),
        403,
        "body.trust",
    )
    assert (
        http.post(f"{base}/put", json=shared | {"trust": "operator"}, headers=operator).status_code
        == 200
    )
    _error(http.post(f"{base}/put", json=body, headers=stranger), 403, "path.agent_id")
    _error(
        http.post(f"{base}/put", json=body | {"scope_id": "bob"}, headers=host),
        422,
        "body.scope_id",
    )
    _error(http.post(f"{base}/put", json=body | {"value": ""}, headers=host), 422, "body.value")
    _error(http.post(f"{base}/put", json=body | {"key": "x" * 201}, headers=host), 422, "body.key")
    _error(
        http.post(f"{base}/put", json=body | {"scope_type": "team"}, headers=host),
        422,
        "body.scope_type",
    )
    _error(
        http.post(f"{base}/put", json=body | {"scope_type": "job", "scope_id": "77"}, headers=host),
        404,
        "body.scope_id",
    )
    _error(http.post(f"{base}/put", json=body | {"colour": 1}, headers=host), 422, "body.colour")
    recalled = http.get(f"{base}/recall", params={"q": "v", "scope": "owner:alice"}, headers=host)
    assert [r["key"] for r in recalled.json()["memories"]] == ["k"]
    _error(
        http.get(f"{base}/recall", params={"q": "v", "scope": "team"}, headers=host),
        422,
        "query.scope",
    )
    archive = {k: v for k, v in body.items() if k != "value"}
    gone = http.post(f"{base}/archive", json=archive, headers=host).json()["memory"]
    assert gone["archived_by"] == "host"
    assert http.post(f"{base}/archive", json=archive, headers=host).json() == {"memory": None}
    rows = memory.list_rows(agent_id=AGENT, archived=None)
    assert sorted((r.owner_id, r.archived) for r in rows) == [("", False), ("alice", True)]
    paths = http.get("/openapi.json").json()["paths"]
    for route, method in (("put", "post"), ("archive", "post"), ("recall", "get")):
        assert paths[f"/v1/agents/{{agent_id}}/memories/{route}"][method]["description"]


# -- the Client variant, against a real server process ----------------------------------


@pytest.mark.slow
def test_i3_n4_the_store_over_a_client_with_host_and_operator_tokens(
    server: ServerProcess, model_server: ModelServer
) -> None:
    host = store_of(server.client())
    operator = store_of(server.client(server.operator_token), trust="operator")
    host.put(("owner", "alice"), "diet", {"fact": "vegetarian"})
    host.put(("owner", "bob"), "diet", {"fact": "eats fish"})
    assert host.get(("owner", "alice"), "diet").value == {"fact": "vegetarian"}  # type: ignore[union-attr]
    assert [i.value["fact"] for i in host.search(("owner", "bob"), query="fish")] == ["eats fish"]
    assert host.search(("owner", "alice"), query="fish") == []  # SC3
    with pytest.raises(AccessDeniedError):
        host.put(("agent",), "rule", {"fact": "be brief"})
    operator.put(("agent",), "rule", {"fact": "be brief"})
    assert host.list_namespaces() == [("agent",), ("owner", "alice"), ("owner", "bob")]
    asyncio.run(host.adelete(("owner", "bob"), "diet"))
    assert asyncio.run(host.aget(("owner", "bob"), "diet")) is None
    model_server.reply("Vegetarian, you said.")
    out = graph_for(host, model_server.url).invoke(
        {"question": "Am I vegetarian?"}, context=Context("alice")
    )
    assert out["answer"] == "Vegetarian, you said."
    assert "vegetarian" in str(model_server.requests[0]["messages"])
    assert host.get(("owner", "alice"), "last_question") is not None


# -- the docs' host runs as written ------------------------------------------------------


def _docs_host() -> str:
    match = re.search(r"```python\n(.*?)```", section("LangGraph and LangChain (I3)"), re.DOTALL)
    assert match is not None
    return match.group(1)


@pytest.mark.slow  # a fresh python importing langgraph and litellm
def test_i3_i6_the_docs_host_runs_as_written(model_server: ModelServer, home: Path) -> None:
    model_server.reply("Hello Ana! Noted: you live in Porto.", for_model="gpt-4o")
    model_server.reply("You live in Porto.", for_model="gpt-4o")
    model_server.default = text_reply("Nothing to save.")  # the reviewer's (gpt-4o-mini)
    env = {
        "PATH": "/usr/bin:/bin",
        "FERMIX_HOME": str(home),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": model_server.url,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    run = subprocess.run(
        [sys.executable, "-c", _docs_host()], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "You live in Porto." in run.stdout
    with Memory(Home(home)) as memory:
        conv = memory.conversation("assistant", "web", "ana-1", owner_id="ana")
        assert [m.role for m in conv.history()] == ["user", "assistant", "user", "assistant"]
        assert memory.list_rows(agent_id="assistant", owner_id="ana", key="home")
    host_calls = [r for r in model_server.requests if r["model"] == "gpt-4o"]
    second = str(host_calls[1]["messages"])
    assert "Known about the user: Hi, I'm Ana. I live in Porto." in second  # the store's item
    assert second.count("I live in Porto") >= 2  # ... and the first turn, from fermix
