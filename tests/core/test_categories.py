"""Categories, trust and scopes as pure rules (C1, C3, SC1-SC3), and the queries rendering reads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from factories import ROW_DEFAULTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix.core import categories
from fermix.core.categories import (
    DEFAULT_OWNER_SCOPE_ID,
    TARGET_OF,
    render_queries,
    renders,
    reviewer_scope,
)
from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.model import CATEGORIES, ConversationKey, MemoryRow, Scope
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.session import SqliteWrites

USER_CATS = ("identity", "preference", "interest", "goal")


def row(**overrides: Any) -> MemoryRow:
    """A live USER.md row of agent ``bot`` and owner ``alice``, changed by ``overrides``."""
    fields: dict[str, Any] = dict(ROW_DEFAULTS)
    fields.update(overrides)
    return MemoryRow(**fields)


def test_c1_profile_categories_render_into_user_md_and_work_categories_into_memory_md() -> None:
    assert {c: TARGET_OF[c] for c in CATEGORIES} == {
        "identity": "user_md",
        "preference": "user_md",
        "interest": "user_md",
        "goal": "user_md",
        "context": "memory_md",
        "directive": "memory_md",
    }


@pytest.mark.parametrize("category", CATEGORIES)
def test_c1_guests_may_write_every_category_but_directive(category: str) -> None:
    assert categories.may_write(category, "operator")
    assert categories.may_write(category, "guest") is (category != "directive")


def test_c1_may_write_refuses_unknown_categories_and_trust_levels() -> None:
    with pytest.raises(InvalidInputError):
        categories.may_write("secret", "operator")
    with pytest.raises(InvalidInputError):
        categories.may_write("context", "root")


@pytest.mark.parametrize("trust", ["operator", "guest"])
@pytest.mark.parametrize("category", USER_CATS)
def test_sc2_the_reviewer_stores_profile_facts_at_the_owners_scope(
    category: str, trust: str
) -> None:
    scope, owner = reviewer_scope(category, agent_id="bot", owner_id="alice", trust=trust)
    assert (scope, owner) == (Scope("owner", "alice"), "alice")


def test_sc2_operator_context_is_shared_at_agent_scope_and_guest_context_stays_the_guests() -> None:
    shared = reviewer_scope("context", agent_id="bot", owner_id="alice", trust="operator")
    private = reviewer_scope("context", agent_id="bot", owner_id="alice", trust="guest")
    directive = reviewer_scope("directive", agent_id="bot", owner_id="alice", trust="operator")
    assert shared == (Scope("agent", "bot"), "")
    assert private == (Scope("agent", "bot"), "alice")
    assert directive == (Scope("agent", "bot"), "")


def test_c1_the_reviewer_scope_of_a_guest_directive_is_refused() -> None:
    with pytest.raises(AccessDeniedError):
        reviewer_scope("directive", agent_id="bot", owner_id="mallory", trust="guest")


def test_sc1_the_default_owners_profile_lives_at_a_named_owner_scope() -> None:
    scope, owner = reviewer_scope("goal", agent_id="bot", owner_id="", trust="operator")
    assert scope == Scope("owner", DEFAULT_OWNER_SCOPE_ID) and owner == ""


def test_sc1_conversation_scope_is_derived_from_channel_chat_and_thread() -> None:
    a = categories.conversation_scope(ConversationKey("bot", "telegram", "1", "t"))
    b = categories.conversation_scope(ConversationKey("bot", "telegram", "1:t"))
    assert a.type == b.type == "conversation" and a.id != b.id


def test_sc1_job_scope_is_the_memory_source_id() -> None:
    assert categories.job_scope(7) == Scope("job", "7")
    for bad in (0, -1, True, "7"):
        with pytest.raises(InvalidInputError):
            categories.job_scope(bad)  # type: ignore[arg-type]


RENDER_CASES = [
    ("a live profile row of this owner", row(), True),
    ("an archived row", row(archived_at=5, archived_by="op", archive_reason="old"), False),
    ("another agent's row", row(agent_id="other"), False),
    ("another owner's profile", row(owner_id="bob", scope_id="bob"), False),
    ("a profile row filed under another owner's scope", row(scope_id="bob"), False),
    ("a memory_store row without a target (T1)", row(promote_target=None), False),
    ("a target that disagrees with the category", row(promote_target="memory_md"), False),
    (
        "shared agent-scoped context",
        row(scope_type="agent", scope_id="bot", owner_id="", category="context",
            promote_target="memory_md"),
        True,
    ),
    (
        "this owner's agent-scoped context",
        row(scope_type="agent", scope_id="bot", category="context", promote_target="memory_md"),
        True,
    ),
    (
        "another owner's agent-scoped context",
        row(scope_type="agent", scope_id="bot", owner_id="bob", category="context",
            promote_target="memory_md"),
        False,
    ),
    (
        "agent-scoped context of another agent's scope",
        row(scope_type="agent", scope_id="other", owner_id="", category="context",
            promote_target="memory_md"),
        False,
    ),
    (
        "conversation-scoped context (C3)",
        row(scope_type="conversation", scope_id="telegram:1", category="context",
            promote_target="memory_md"),
        True,
    ),
    (
        "conversation-scoped directive (C3)",
        row(scope_type="conversation", scope_id="telegram:1", category="directive",
            promote_target="memory_md"),
        False,
    ),
    (
        "another owner's conversation-scoped context",
        row(scope_type="conversation", scope_id="telegram:2", owner_id="bob",
            category="context", promote_target="memory_md"),
        False,
    ),
    (
        "a job-scoped row (C3)",
        row(scope_type="job", scope_id="3", category="context", promote_target="memory_md"),
        False,
    ),
    ("an owner-scoped context row", row(category="context", promote_target="memory_md"), False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "memory_row", "expected"), RENDER_CASES, ids=lambda c: str(c))
def test_c3_sc3_which_rows_render_for_agent_bot_and_owner_alice(
    case: str, memory_row: MemoryRow, expected: bool
) -> None:
    assert renders(memory_row, agent_id="bot", owner_id="alice") is expected, case


def test_c3_render_target_names_the_file_a_row_shows_in_for_its_own_owner() -> None:
    assert categories.render_target(row()) == "user_md"
    assert categories.render_target(row(promote_target=None)) is None
    shared = row(scope_type="agent", scope_id="bot", owner_id="", category="directive",
                 promote_target="memory_md")  # fmt: skip
    assert categories.render_target(shared) == "memory_md"
    assert categories.shared_across_owners(shared)
    assert not categories.shared_across_owners(replace(shared, owner_id="alice"))


def test_sc3_render_queries_never_name_another_owners_profile_or_a_job() -> None:
    for query in render_queries("bot", "alice"):
        filters = query.filters()
        assert filters["agent_id"] == "bot" and filters["archived"] is False
        assert filters["owner_id"] in ("", "alice")
        scopes = filters["scopes"] or []
        assert all(s.type in ("owner", "agent") for s in scopes)
        if query.target == "user_md":
            assert filters["owner_id"] == "alice" and scopes == [Scope("owner", "alice")]
    assert len(render_queries("bot", "")) < len(render_queries("bot", "alice"))


AGENTS = ("bot", "other")
OWNERS = ("", "alice", "bob")
SCOPES = (
    Scope("owner", "alice"),
    Scope("owner", "bob"),
    Scope("owner", DEFAULT_OWNER_SCOPE_ID),
    Scope("agent", "bot"),
    Scope("agent", "other"),
    Scope("conversation", "telegram:1"),
    Scope("job", "1"),
)
stored_row = st.tuples(
    st.sampled_from(AGENTS),
    st.sampled_from(OWNERS),
    st.sampled_from(SCOPES),
    st.sampled_from(CATEGORIES),
    st.sampled_from(["user_md", "memory_md", None, "category"]),
    st.booleans(),
    st.integers(1, 50),
)


def test_sc3_render_queries_read_every_row_that_renders_and_no_row_of_another_agent_or_owner(
    tmp_path: Path,
) -> None:
    conn = open_database(tmp_path / "memory.db")
    session = SqliteWrites(conn)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(stored_row, max_size=40))
    def check(specs: list[tuple[Any, ...]]) -> None:
        with transaction(conn):
            conn.execute("DELETE FROM memories")
            for i, (agent, owner, scope, category, target, archived, ts) in enumerate(specs):
                stored = session.upsert_row(
                    agent_id=agent,
                    owner_id=owner,
                    scope=scope,
                    category=category,
                    key=f"k{i}",
                    value=f"value {i}",
                    promote_target=TARGET_OF[category] if target == "category" else target,
                    now=ts,
                )
                if archived:
                    session.archive_row(stored.id, by="test", reason="test")
        every = session.rows(archived=None)
        for agent in AGENTS:
            for owner in OWNERS:
                read = {
                    r.id: r
                    for q in render_queries(agent, owner)
                    for r in session.rows(**q.filters())
                }
                assert all(r.agent_id == agent and r.owner_id in ("", owner) for r in read.values())
                assert all(r.archived_at is None for r in read.values())
                wanted = {r.id for r in every if renders(r, agent_id=agent, owner_id=owner)}
                assert wanted <= set(read)

    try:
        check()
    finally:
        conn.close()
