"""Isolation across owners, agents, conversations and jobs (SC3, C3, E5, T2; issue 8).

One property over random rows: for any caller, what rendering, the reviewer's view,
admission and recall reach never crosses a boundary the caller is not entitled to.
"""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix import model
from fermix.actors.reviewer import shown_rows
from fermix.core import categories, render, review
from fermix.core.review import Operation
from fermix.model import ConversationKey, MemoryRow, Scope
from fermix.runtime import prompt_files
from fermix.storage import conversations, memories, open_database, transaction

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


def _seed(
    conn: apsw.Connection, specs: list[tuple[str, str, str, str, str, bool, bool]]
) -> list[MemoryRow]:
    rows = []
    with transaction(conn):
        for i, (agent, owner, kind, chat, category, promoted, archived) in enumerate(specs):
            row = memories.upsert(
                conn,
                agent_id=agent,
                owner_id=owner,
                scope=_scope(kind, agent, owner, chat),
                category=category,
                key=f"k{i}",
                value=f"token{i}x",
                promote_target=model.TARGET_OF[category] if promoted else None,
            )
            if archived:
                row = memories.archive(conn, row.id, by="test", reason="old")
            rows.append(row)
    return rows


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
    conn = open_database(tmp_path_factory.mktemp("iso") / "memory.db")
    rows = _seed(conn, specs)
    for caller in ALL_CALLERS:
        _check_caller(conn, rows, caller, targets)
    conn.close()


def _check_caller(
    conn: apsw.Connection,
    rows: list[MemoryRow],
    caller: tuple[str, str, str, str],
    targets: list[int],
) -> None:
    agent, owner, trust, chat = caller
    by_token = {f"token{i}x": row for i, row in enumerate(rows)}

    # Render: only live promoted rows this agent and owner may see, never a job's.
    files = render.render_files(
        prompt_files.load_rows(conn, agent, owner), agent_id=agent, owner_id=owner
    )
    for token, row in by_token.items():
        if token in files.user_md + files.memory_md:
            assert _may_see(row, agent, owner) and not row.archived
            assert categories.renders(row, agent_id=agent, owner_id=owner)
            assert not (row.scope_type == "conversation" and row.category == "directive")

    # The reviewer's view of this conversation, and what admission lets it touch.
    key = ConversationKey(agent, "cli", chat)
    with transaction(conn):
        conversations.touch(conn, key, owner_id=owner, trust=trust)
    state = conversations.get(conn, key)
    assert state is not None
    shown = shown_rows(conn, state)
    for row in shown:
        assert _may_see(row, agent, owner) and row.scope_type in ("owner", "agent")
        if trust == "guest" and row.scope_type == "agent":
            assert row.owner_id == owner
    operations = [Operation("archive", id=target) for target in targets]
    operations += [Operation("replace", id=target, value="new") for target in targets]
    admitted = review.admit(operations, shown=shown, trust=trust).admitted
    assert {op.id for op in admitted} <= {row.id for row in shown}


def test_sc3_recall_across_two_processes_worth_of_owners_never_leaks(tmp_path: Path) -> None:
    from fermix.api import Memory

    with Memory(tmp_path / "home") as memory:
        alice = memory.conversation("a1", "cli", "1", owner_id="alice")
        bob = memory.conversation("a1", "cli", "2", owner_id="bob")
        for conv, secret in ((alice, "alpha"), (bob, "bravo")):
            conv.append_user(f"my secret word is {secret}")
            memory.tools.run(
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
                memory.tools.run(
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
