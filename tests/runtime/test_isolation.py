"""Isolation across owners, agents, conversations and jobs (SC3, C3, E5, T2; issue 8).

One property over random rows: for any caller, what rendering, the reviewer's view,
admission and recall reach never crosses a boundary the caller is not entitled to.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix import model
from fermix.core import categories, render, review_admission, tool_calls
from fermix.core.review_answer import Operation
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow, NewMessage, Scope
from fermix.runtime import prompt_files, recall
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.review_inputs import shown_rows
from fermix.runtime.writer import Writer
from fermix.storage import Writes
from fermix.storage.sqlite.database import Database
from fermix.tools import MemoryTools

AGENTS = ["a1", "a2"]
OWNERS = ["", "alice", "bob"]
CHATS = ["1", "2"]

row_specs = st.lists(
    st.tuples(
        st.sampled_from(AGENTS),
        st.sampled_from(OWNERS),
        st.sampled_from(["owner", "agent", "conversation", "job"]),
        st.sampled_from(CHATS),
        st.sampled_from(list(model.TARGET_OF)),
        st.booleans(),  # promoted
        st.booleans(),  # archived
    ),
    max_size=25,
)


def _scope(kind: str, agent: str, owner: str, chat: str) -> Scope:
    if kind == "owner":
        return categories.owner_scope(owner)
    if kind == "agent":
        return categories.agent_scope(agent)
    if kind == "conversation":
        return categories.conversation_scope(ConversationKey(agent, "cli", chat))
    return categories.job_scope(7)


def _seed(db: Database, specs: list[tuple[str, str, str, str, str, bool, bool]]) -> list[MemoryRow]:
    def unit(writes: Writes) -> list[MemoryRow]:
        rows = []
        for i, (agent, owner, kind, chat, category, promoted, archived) in enumerate(specs):
            row = writes.upsert_row(
                agent_id=agent,
                owner_id=owner,
                scope=_scope(kind, agent, owner, chat),
                category=category,
                key=f"k{i}",
                value=f"token{i}x",
                promote_target=model.TARGET_OF[category] if promoted else None,
            )
            if archived:
                row = writes.archive_row(row.id, by="test", reason="old")
            rows.append(row)
        return rows

    return db.write(unit, label="seed")


def _may_see(row: MemoryRow, agent: str, owner: str) -> bool:
    """The widest reach any reader of (agent, owner) has: never another agent, owner or job."""
    if row.agent_id != agent or row.scope_type == "job":
        return False
    if row.scope_type == "agent":
        return row.owner_id in ("", owner)
    return row.owner_id == owner


ALL_CALLERS = [
    (agent, owner, trust, chat)
    for agent in AGENTS
    for owner in OWNERS
    for trust in ("operator", "guest")
    for chat in CHATS
]


@given(specs=row_specs, targets=st.lists(st.integers(1, 30), max_size=8))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_sc3_no_render_view_admission_or_recall_crosses_a_boundary(
    tmp_path_factory: pytest.TempPathFactory,
    specs: list[tuple[str, str, str, str, str, bool, bool]],
    targets: list[int],
) -> None:
    db = Database(tmp_path_factory.mktemp("iso") / "memory.db")
    try:
        rows = _seed(db, specs)
        for caller in ALL_CALLERS:
            _check_caller(db, rows, caller, targets)
    finally:
        db.close()


def _check_caller(
    db: Database,
    rows: list[MemoryRow],
    caller: tuple[str, str, str, str],
    targets: list[int],
) -> None:
    agent, owner, trust, chat = caller
    by_token = {f"token{i}x": row for i, row in enumerate(rows)}

    # Render: only live promoted rows this agent and owner may see, never a job's.
    with db.read() as reads:
        loaded = prompt_files.load_rows(reads, agent, owner)
    files = render.render_files(loaded, agent_id=agent, owner_id=owner)
    for token, row in by_token.items():
        if token in files.user_md + files.memory_md:
            assert _may_see(row, agent, owner) and not row.archived
            assert categories.renders(row, agent_id=agent, owner_id=owner)
            assert not (row.scope_type == "conversation" and row.category == "directive")

    # The reviewer's view of this conversation, and what admission lets it touch.
    key = ConversationKey(agent, "cli", chat)
    db.write(lambda w: w.touch_conversation(key, owner_id=owner, trust=trust))
    with db.read() as reads:
        state = reads.conversation(key)
        assert state is not None
        shown = shown_rows(reads, state)
    for row in shown:
        assert _may_see(row, agent, owner) and row.scope_type in ("owner", "agent")
        if trust == "guest" and row.scope_type == "agent":
            assert row.owner_id == owner
    operations = [Operation("archive", id=target) for target in targets]
    operations += [Operation("replace", id=target, value="new") for target in targets]
    admitted = review_admission.admit(operations, shown=shown, trust=trust).admitted
    assert {op.id for op in admitted} <= {row.id for row in shown}

    # Recall at its widest reach ("all" holds the groups of "current" and "owner"): by
    # every word and by every key, never a row of another agent, owner or job. Trust does
    # not change what recall reaches.
    if trust != "operator":
        return
    me = recall.ConversationCaller(key, owner)
    words = " ".join(by_token)
    asks = [tool_calls.Recall(query=words, key=None, scope="all", limit=tool_calls.MAX_LIMIT)]
    asks += [
        tool_calls.Recall(query=None, key=f"k{i}", scope="all", limit=tool_calls.MAX_LIMIT)
        for i in range(len(rows))
    ]
    with db.read() as reads:
        for ask in asks:
            for row in recall.recall_rows(reads, me, ask):
                assert _may_see(row, agent, owner) and not row.archived


def test_sc3_recall_across_owners_never_leaks(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.root.mkdir(parents=True)
    db = Database(home.db_path)
    writer = Writer(db, PromptFiles(home, db))
    tools = MemoryTools(db, writer)
    alice = recall.ConversationCaller(ConversationKey("a1", "cli", "1"), "alice")
    bob = recall.ConversationCaller(ConversationKey("a1", "cli", "2"), "bob")
    try:
        for conv, secret in ((alice, "alpha"), (bob, "bravo")):
            new = NewMessage(
                conv.key, "user", f"my secret word is {secret}", owner_id=conv.owner_id
            )
            writer.append(new, trust="operator")
            tools.run(
                {
                    "function": {
                        "name": "memory_store",
                        "arguments": json.dumps({"key": "secret", "value": f"secret {secret}"}),
                    }
                },
                conv,
            )
        for scope in ("current", "owner", "all"):
            out = json.loads(
                tools.run(
                    {
                        "function": {
                            "name": "memory_recall",
                            "arguments": json.dumps(
                                {"query": "secret word", "scope": scope, "source": "all"}
                            ),
                        }
                    },
                    alice,
                )
            )
            text = json.dumps(out)
            assert "bravo" not in text and "alpha" in text
            assert out["memories"] and out["history"]
    finally:
        db.close()
