"""The storage port's contract for memory rows, their search and change counters, and the
prompt-file resources and revisions, run over both adapters (issue 15, B1, B3).

Every test taking ``storage`` or ``backend`` runs on SQLite and on PostgreSQL; a test taking
``both`` compares the two adapters' results. Ids are each adapter's own (an upsert that
updates spends one on PostgreSQL), so rows are compared without them; times are given, so
everything else must be equal.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_fixtures import Backend, Store

from fermix.errors import InvalidInputError, NotFoundError, WriteFailedError
from fermix.model import MemoryRow, Provenance, Revision, Scope
from fermix.storage import Reads

ALICE = Scope("owner", "alice")
BOB = Scope("owner", "bob")
SHARED = Scope("agent", "agent")
T0 = 1_700_000_000_000
WAIT = 30.0


def upsert(
    db: Store,
    key: str,
    value: str,
    *,
    agent: str = "agent",
    owner: str = "alice",
    scope: Scope = ALICE,
    category: str = "preference",
    now: int = T0,
    **extra: Any,
) -> MemoryRow:
    row: MemoryRow = db.write(
        lambda w: w.upsert_row(
            agent_id=agent,
            owner_id=owner,
            scope=scope,
            category=category,
            key=key,
            value=value,
            promote_target=extra.pop("promote_target", "user_md"),
            now=now,
            **extra,
        )
    )
    return row


def plain(rows: list[MemoryRow]) -> list[MemoryRow]:
    """Rows as both adapters must agree on them: without their ids."""
    return [dataclasses.replace(row, id=0) for row in rows]


def read(db: Store, op: Callable[[Reads], Any]) -> Any:
    with db.read() as r:
        return op(r)


def same(both: tuple[Store, Store], name: str, *args: Any, **kwargs: Any) -> list[MemoryRow]:
    """The rows read operation ``name`` gives on SQLite, having checked that PostgreSQL
    gives the same (without ids)."""
    sqlite, pg = (plain(read(db, lambda r: getattr(r, name)(*args, **kwargs))) for db in both)
    assert pg == sqlite, (name, args, kwargs)
    return sqlite


# -- rows --------------------------------------------------------------------------------


def test_s5_an_upsert_stores_one_row_per_key_and_brings_back_an_archived_one(
    storage: Store,
) -> None:
    first = upsert(storage, "drink", "tea", now=T0)
    again = upsert(storage, "drink", "green tea", category="identity", now=T0 + 5)
    assert again.id == first.id
    assert (again.value, again.category, again.created_at, again.updated_at) == (
        "green tea",
        "identity",
        T0,
        T0 + 5,
    )
    other = upsert(storage, "drink", "coffee", owner="bob", scope=BOB)
    shared = upsert(storage, "drink", "water", owner="", scope=SHARED)
    assert len({first.id, other.id, shared.id}) == 3
    storage.write(lambda w: w.archive_row(first.id, by="reviewer", reason="stale", now=T0 + 6))
    back = upsert(storage, "drink", "mint tea", now=T0 + 7)
    assert (back.id, back.archived_at, back.archived_by, back.archive_reason) == (
        first.id,
        None,
        None,
        None,
    )
    with storage.read() as r:
        assert r.row(first.id) == back == r.require_row(first.id)
        assert r.row_by_key(agent_id="agent", owner_id="alice", scope=ALICE, key="drink") == back
        assert r.row_by_key(agent_id="agent", owner_id="alice", scope=BOB, key="drink") is None
        assert r.row(10**9) is None
        with pytest.raises(NotFoundError):
            r.require_row(10**9)
        assert len(r.rows(agent_id="agent")) == 3


def test_s5_a_bad_row_is_refused_before_anything_is_written(storage: Store) -> None:
    bad: list[dict[str, Any]] = [
        {"category": "mood"},
        {"key": " "},
        {"value": ""},
        {"value": "x" * 10_001},
        {"key": "k" * 201},
        {"promote_target": "soul_md"},
        {"confidence": 1.5},
        {"agent": ""},
        {"owner": "a\x01b"},
    ]
    for change in bad:
        args: dict[str, Any] = {"key": "k", "value": "v", **change}
        with pytest.raises(InvalidInputError):
            upsert(storage, args.pop("key"), args.pop("value"), **args)
    with storage.read() as r:
        assert r.rows(archived=None) == []
        assert r.memory_agents() == []


def test_replace_changes_value_key_and_category_and_keeps_or_sets_provenance(
    storage: Store,
) -> None:
    source = Provenance(None, "conversation", "chat", "a chat", "s-1", 7, 42)
    row = upsert(storage, "pet", "a dog named Rex", provenance=source)
    upsert(storage, "hobby", "hiking")
    replaced = storage.write(lambda w: w.replace_row(row.id, value="a cat named Tom", now=T0 + 1))
    assert (replaced.value, replaced.key, replaced.updated_at) == ("a cat named Tom", "pet", T0 + 1)
    assert (replaced.session_id, replaced.run_id, replaced.source_message_id) == ("s-1", 7, 42)
    moved = storage.write(
        lambda w: w.replace_row(
            row.id,
            value="two cats",
            key="pets",
            category="context",
            provenance=Provenance(source_type="operator"),
            now=T0 + 2,
        )
    )
    assert (moved.key, moved.category, moved.source_type, moved.session_id) == (
        "pets",
        "context",
        "operator",
        None,
    )
    with pytest.raises(InvalidInputError, match="already has key 'hobby'"):
        storage.write(lambda w: w.replace_row(row.id, value="x", key="hobby"))
    with pytest.raises(NotFoundError):
        storage.write(lambda w: w.replace_row(10**9, value="x"))
    with pytest.raises(InvalidInputError):
        storage.write(lambda w: w.replace_row(row.id, value="x", category="mood"))
    # A key taken leaves the unit's transaction usable, as on SQLite.

    def taken_then_other(w: Any) -> MemoryRow:
        with pytest.raises(InvalidInputError):
            w.replace_row(row.id, value="x", key="hobby")
        result: MemoryRow = w.replace_row(row.id, value="three cats", now=T0 + 3)
        return result

    assert storage.write(taken_then_other).value == "three cats"
    storage.write(lambda w: w.archive_row(row.id, by="op", reason="gone"))
    restored = storage.write(lambda w: w.replace_row(row.id, value="a parrot", now=T0 + 4))
    assert restored.archived_at is None
    with storage.read() as r:
        assert r.require_row(row.id) == restored
        # The search follows the new key and value, not the old ones.
        assert [m.id for m in r.search_rows("parrot pets")] == [row.id]
        assert r.search_rows("cats") == r.search_rows("Rex") == []


def test_a_row_naming_a_source_that_does_not_exist_is_refused_on_both(storage: Store) -> None:
    """A missing source is a failed write on both adapters, for an upsert and a replace
    alike (not a key taken: a replace looks for the key before it writes), and changes
    nothing."""
    row = upsert(storage, "pet", "a cat")
    nowhere = Provenance(source_id=404_404)
    with pytest.raises(WriteFailedError):
        upsert(storage, "pet", "a dog", provenance=nowhere)
    with pytest.raises(WriteFailedError):
        storage.write(lambda w: w.replace_row(row.id, value="a dog", provenance=nowhere))
    assert plain([read(storage, lambda r: r.require_row(row.id))]) == plain([row])


def test_s7_archive_keeps_its_first_record_and_restore_clears_it(storage: Store) -> None:
    row = upsert(storage, "city", "Paris")
    archived = storage.write(
        lambda w: w.archive_row(row.id, by="reviewer", reason="moved", now=T0 + 1)
    )
    assert (archived.archived_at, archived.archived_by, archived.archive_reason) == (
        T0 + 1,
        "reviewer",
        "moved",
    )
    assert archived.updated_at == T0  # archiving is not an update of the fact
    again = storage.write(lambda w: w.archive_row(row.id, by="op", reason="other", now=T0 + 2))
    assert again == archived
    with storage.read() as r:
        assert r.rows() == [] and r.rows(archived=True) == [archived]
        assert r.search_rows("Paris") == [] and r.search_rows("Paris", archived=True) == [archived]
    restored = storage.write(lambda w: w.restore_row(row.id, now=T0 + 3))
    assert (restored.archived_at, restored.archived_by, restored.updated_at) == (None, None, T0 + 3)
    with pytest.raises(NotFoundError):
        storage.write(lambda w: w.archive_row(10**9, by="op", reason="x"))
    with pytest.raises(NotFoundError):
        storage.write(lambda w: w.restore_row(10**9))
    with pytest.raises(InvalidInputError):
        storage.write(lambda w: w.archive_row(row.id, by="", reason="x"))


def test_s7_two_services_archiving_one_row_keep_one_record(backend: Backend) -> None:
    row = upsert(backend.db, "city", "Paris")
    dbs = [backend.db, backend.open()] * 3
    barrier = threading.Barrier(len(dbs))

    def archive(i: int) -> MemoryRow:
        barrier.wait(WAIT)
        result: MemoryRow = dbs[i].write(
            lambda w: w.archive_row(row.id, by=f"svc{i}", reason=f"r{i}", now=T0 + i)
        )
        return result

    with ThreadPoolExecutor(len(dbs)) as pool:
        results = list(pool.map(archive, range(len(dbs))))
    stored = read(backend.db, lambda r: r.require_row(row.id))
    assert results == [stored] * len(dbs)
    assert stored.archive_reason == f"r{stored.archived_by.removeprefix('svc')}"


def test_sc3_rows_are_listed_by_every_filter_newest_first(storage: Store) -> None:
    a = upsert(storage, "a", "one", now=T0 + 1)
    b = upsert(storage, "b", "two", category="goal", now=T0 + 2)
    c = upsert(storage, "c", "three", owner="bob", scope=BOB, now=T0 + 2)
    d = upsert(storage, "d", "four", owner="", scope=SHARED, now=T0 + 3)
    e = upsert(storage, "e", "five", agent="other", now=T0 + 4)
    storage.write(lambda w: w.archive_row(a.id, by="op", reason="x", now=T0 + 5))
    a = read(storage, lambda r: r.require_row(a.id))
    with storage.read() as r:
        assert r.rows() == [e, d, c, b]
        assert r.rows(archived=None) == [e, d, c, b, a]
        assert r.rows(archived=True) == [a]
        assert r.rows(agent_id="agent") == [d, c, b]
        assert r.rows(agent_id="agent", owner_id="alice", archived=None) == [b, a]
        assert r.rows(scopes=[ALICE, SHARED]) == [e, d, b]
        assert r.rows(scopes=[]) == []
        assert r.rows(scope_type="agent") == [d]
        assert r.rows(category="goal") == [b]
        assert r.rows(key="c") == [c]
        assert r.rows(limit=2) == [e, d]
        assert r.rows(limit=0) == []
        assert r.rows(limit=-1) == [e, d, c, b]  # SQLite's LIMIT -1: no limit


def test_agents_and_owners_of_rows_and_resources_are_sorted_by_code_point(
    storage: Store,
) -> None:
    for agent in ("zed", "Zed", "émile", "agent"):
        upsert(storage, "k", "v", agent=agent)
    upsert(storage, "k", "v", owner="Bob", scope=Scope("owner", "Bob"))
    upsert(storage, "k", "v", owner="", scope=SHARED)
    storage.write(lambda w: w.record_revision("files-only", "user_md", "x", reason="t"))
    storage.write(lambda w: w.record_revision("agent", "user_md", "x", reason="t", owner_id="al"))
    with storage.read() as r:
        assert r.memory_agents() == ["Zed", "agent", "files-only", "zed", "émile"]
        assert r.memory_owners("agent") == ["", "Bob", "al", "alice"]
        assert r.memory_owners("files-only") == [""]
        assert r.memory_owners("nobody") == [""]


# -- change counters ---------------------------------------------------------------------


def test_a3_the_memory_version_moves_on_every_write_of_any_service(backend: Backend) -> None:
    """A3 over services: a write through another instance moves the counter this one
    reads; with (agent, owner), every write of a row shown in that owner's files moves it.
    On SQLite one counter serves all (it only over-invalidates); on PostgreSQL another
    owner's or agent's row leaves it alone."""
    db, other = backend.db, backend.open()

    def versions() -> tuple[int, int, int]:
        with db.read() as r:
            return (
                r.memory_version(),
                r.memory_version("agent", "alice"),
                r.memory_version("agent"),
            )

    seen = [versions()]
    row = upsert(other, "k", "v")
    writes: list[Callable[[Any], Any]] = [
        lambda w: w.upsert_row(
            agent_id="agent", owner_id="alice", scope=ALICE, category="goal", key="k",
            value="v2", promote_target=None,
        ),
        lambda w: w.replace_row(row.id, value="v3"),
        lambda w: w.archive_row(row.id, by="op", reason="r"),
        lambda w: w.restore_row(row.id),
        lambda w: w.upsert_row(
            agent_id="agent", owner_id="", scope=SHARED, category="goal", key="shared",
            value="v", promote_target="memory_md",
        ),
    ]  # fmt: skip
    seen.append(versions())
    for unit in writes:
        other.write(unit)
        seen.append(versions())
    for before, after in itertools.pairwise(seen):
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    upsert(other, "k", "v", owner="bob", scope=BOB)
    upsert(other, "k", "v", agent="elsewhere")
    now = versions()
    assert now[0] > seen[-1][0]
    if backend.name == "postgres":
        assert now[1] == seen[-1][1]
        # bob's counter is his own (and, drawn from one sequence, above any seen before)
        assert read(db, lambda r: r.memory_version("agent", "bob")) > seen[-1][1]
    with pytest.raises(InvalidInputError):
        read(db, lambda r: r.memory_version(owner_id="alice"))


# -- search ------------------------------------------------------------------------------


def test_search_rows_finds_key_or_value_words_within_the_filters(storage: Store) -> None:
    tea = upsert(storage, "drink", "green tea in the morning", now=T0 + 1)
    coffee = upsert(storage, "morning drink", "coffee", now=T0 + 2)
    bob = upsert(storage, "drink", "tea", owner="bob", scope=BOB, now=T0 + 3)
    goal = upsert(storage, "marathon", "running a marathon", category="goal", now=T0 + 4)
    with storage.read() as r:
        assert {m.id for m in r.search_rows("drink")} == {tea.id, coffee.id, bob.id}
        assert [m.id for m in r.search_rows("tea", owner_id="alice")] == [tea.id]
        assert [m.id for m in r.search_rows("tea", scopes=[BOB])] == [bob.id]
        assert r.search_rows("tea", scopes=[]) == []
        assert [m.id for m in r.search_rows("runs", category="goal")] == [goal.id]
        assert r.search_rows("runs", category="identity") == []
        assert r.search_rows("drink", limit=0) == []
        assert r.search_rows("the and of") == [tea]  # only stopwords: then they count
        assert r.search_rows("🙂 ...") == []
        # The rarer word weighs more (bm25): the row holding "coffee" comes first.
        assert r.search_rows("coffee drink")[0] == coffee
        # A phrase never spans a row's key and its value (FTS5's columns).
        assert r.search_rows("drink™green") == []
        assert [m.id for m in r.search_rows("green™tea")] == [tea.id]


def test_relevant_rows_come_only_from_the_places_given(storage: Store) -> None:
    """M6, SC3: another owner's, another agent's and archived rows are never shown."""
    mine = upsert(storage, "pet", "a dog named Rex", now=T0 + 1)
    shared = upsert(storage, "office dog", "Rex visits the office", owner="", scope=SHARED)
    upsert(storage, "pet", "a dog named Rex", owner="bob", scope=BOB)
    upsert(storage, "pet", "a dog named Rex", agent="other")
    gone = upsert(storage, "old dog", "Rex senior", now=T0 + 2)
    storage.write(lambda w: w.archive_row(gone.id, by="op", reason="x"))
    places = [("alice", ALICE), ("", SHARED)]
    with storage.read() as r:
        found = r.relevant_rows(
            ["Tell me about Rex", "the dog"], agent_id="agent", places=places, limit=5
        )
        assert {m.id for m in found} == {mine.id, shared.id}
        assert r.relevant_rows(["Rex"], agent_id="agent", places=places, limit=1) == found[:1]
        assert r.relevant_rows(["Rex"], agent_id="agent", places=[], limit=5) == []
        assert r.relevant_rows(["Rex"], agent_id="agent", places=places, limit=0) == []
        assert r.relevant_rows(["?!"], agent_id="agent", places=places, limit=5) == []


_WORDS = [
    "tea", "coffee", "green", "running", "runs", "runner", "ran", "generously", "dying",
    "die", "café", "naïve", "résumé", "e-mail", "x@y.com", "3.14", "v2.0", "foo_bar", "don't",
    "Zürich", "straße", "hiking", "hikes", "hiked", "mountain", "photo", "photography",
    "sunset", "beach", "dog", "dogs", "puppy", "cat", "adopt", "adopted", "birthday", "party",
    "gift", "東京", "日本語", "हिन्दी", "русский", "язык", "guitar", "concert", "marathon",
    "trained", "training", "the", "of", "and", "drink™green", "green™tea", "tea™tea",
]  # fmt: skip
_QUERIES = (
    "What does she like to drink, tea or coffee?",
    "running marathon training",
    "When did they adopt the puppy?",
    "café naïve résumé",
    "foo_bar e-mail x@y.com 3.14",
    "東京 hiking",
    "dying generously dog",
    "to be or not to be",
    '"quoted" AND OR NOT NEAR(x y) * ^ : -',
    "the of and",
    "",
    "гитара русский язык",
    "tea tea tea",
    "photography photo photos",
    "green™tea tea™tea drink™green",
)
_SCOPES = (ALICE, BOB, SHARED, Scope("conversation", "c1"))


def _corpus(seed: int, size: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(size):
        scope = rng.choice(_SCOPES)
        owner = {"owner": scope.id, "agent": ""}.get(scope.type, rng.choice(("alice", "bob")))
        rows.append(
            {
                "agent_id": rng.choice(("agent", "agent", "other")),
                "owner_id": owner,
                "scope": scope,
                "category": rng.choice(("preference", "goal", "context")),
                "key": " ".join(rng.choices(_WORDS, k=rng.randint(1, 3))),
                "value": " ".join(rng.choices(_WORDS, k=rng.randint(1, 25))),
                "promote_target": None,
                "now": T0 + i // 3,  # ties in updated_at too
            }
        )
    return rows


def _load(db: Store, rows: list[dict[str, Any]]) -> None:
    db.write_each([(lambda w, row=row: w.upsert_row(**row), "load") for row in rows])


_FILTERS: tuple[dict[str, Any], ...] = (
    {},
    {"agent_id": "agent"},
    {"agent_id": "agent", "owner_id": "alice"},
    {"scopes": [ALICE, SHARED]},
    {"category": "goal", "archived": None},
    {"archived": True},
    {"scope_type": "conversation"},
)


def test_search_and_relevance_are_equal_on_both_adapters(both: tuple[Store, Store]) -> None:
    """The same rows in the same order, ties included: PostgreSQL computes FTS5's bm25
    with the table's statistics (pg/memory_relevance.py)."""
    rows = _corpus(seed=15, size=300)
    for db in both:
        _load(db, rows)
        db.write_each([(_archive_by_key(row), "archive") for row in rows[::7]])
    compared = 0
    for query, filters in itertools.product(_QUERIES, _FILTERS):
        for limit in (3, 10, 400):
            compared += bool(same(both, "search_rows", query, **filters, limit=limit))
    assert compared > 100
    places = [("alice", ALICE), ("", SHARED), ("bob", Scope("conversation", "c1"))]
    for texts in itertools.combinations(_QUERIES[:8], 2):
        for limit in (1, 5, 50):
            same(both, "relevant_rows", texts, agent_id="agent", places=places, limit=limit)


def _archive_by_key(row: dict[str, Any]) -> Callable[[Any], MemoryRow]:
    def unit(w: Any) -> MemoryRow:
        found = w.row_by_key(
            agent_id=row["agent_id"], owner_id=row["owner_id"], scope=row["scope"], key=row["key"]
        )
        result: MemoryRow = w.archive_row(found.id, by="op", reason="x", now=T0)
        return result

    return unit


_TEXT = (
    st.lists(
        st.one_of(
            st.sampled_from(_WORDS),
            st.text(
                alphabet=st.one_of(
                    st.sampled_from(list("abcdeéü_'-.@ 0123456789\n,!?東京ñß™")),
                    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                ),
                max_size=12,
            ),
        ),
        min_size=1,
        max_size=8,
    )
    .map(" ".join)
    .filter(str.strip)
)

_OP = st.one_of(
    st.tuples(
        st.just("upsert"), st.sampled_from(("k1", "k2", "k3 tea")), _TEXT, st.sampled_from(_SCOPES)
    ),
    st.tuples(st.just("replace"), st.integers(0, 9), _TEXT, st.sampled_from((None, "k1", "k2"))),
    st.tuples(st.just("archive"), st.integers(0, 9), st.just(""), st.just(None)),
    st.tuples(st.just("restore"), st.integers(0, 9), st.just(""), st.just(None)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_OP, min_size=1, max_size=12), query=_TEXT)
def test_random_row_writes_leave_the_same_visible_state_on_both(
    both: tuple[Store, Store], ops: list[tuple[Any, ...]], query: str
) -> None:
    """S5, S7, B3: a random sequence of upserts, replaces, archives and restores, each
    applied to both adapters (the stores grow over the examples), gives the same results,
    the same errors and the same rows, lists and searches."""
    ids: dict[str, list[int]] = {"sqlite": [], "postgres": []}
    for step, (kind, target, text, extra) in enumerate(ops):
        outcomes = []
        for name, db in zip(ids, both, strict=True):
            known = ids[name]
            unit = _unit(kind, target, text, extra, known, now=T0 + step)
            if unit is None:
                continue
            try:
                row = db.write(unit)
            except (InvalidInputError, NotFoundError, WriteFailedError) as exc:
                outcomes.append(type(exc))
                continue
            if kind == "upsert" and row.id not in known:
                known.append(row.id)
            outcomes.append(dataclasses.replace(row, id=known.index(row.id)))
        assert len(set(map(repr, outcomes))) <= 1, (kind, outcomes)
    for filters in _FILTERS:
        same(both, "rows", **filters)
    for q in (query, text):
        same(both, "search_rows", q, archived=None, limit=50)


def _unit(
    kind: str, target: Any, text: str, extra: Any, known: list[int], *, now: int
) -> Callable[[Any], MemoryRow] | None:
    if kind == "upsert":
        scope: Scope = extra
        owner = {"owner": scope.id, "agent": ""}.get(scope.type, "alice")
        return lambda w: w.upsert_row(
            agent_id="agent", owner_id=owner, scope=scope, category="context", key=target,
            value=text, promote_target=None, now=now,
        )  # fmt: skip
    if not known:
        return None
    memory_id = known[target % len(known)]
    if kind == "replace":
        return lambda w: w.replace_row(memory_id, value=text, key=extra, now=now)
    if kind == "archive":
        return lambda w: w.archive_row(memory_id, by="op", reason=f"r{now}", now=now)
    return lambda w: w.restore_row(memory_id, now=now)


def test_a_nul_character_in_a_row_or_a_file_is_invalid_input_on_postgres(
    backend: Backend,
) -> None:
    """PostgreSQL text cannot hold NUL: refused as invalid input, the store unchanged
    (SQLite stores it)."""
    db = backend.db
    if backend.name == "sqlite":
        assert upsert(db, "k", "a\x00b").value == "a\x00b"
        assert db.write(lambda w: w.record_revision("agent", "user_md", "\x00", reason="r"))
        return
    with pytest.raises(InvalidInputError):
        upsert(db, "k", "a\x00b")
    with pytest.raises(InvalidInputError):
        db.write(lambda w: w.record_revision("agent", "user_md", "\x00", reason="r"))
    with db.read() as r:
        assert r.rows(archived=None) == [] and r.resources() == []


# -- prompt-file resources and revisions -------------------------------------------------


def _rollback(db: Store, number: int, owner: str = "") -> tuple[str, Revision | None]:
    """The rollback unit of fermix/runtime/prompt_files/rebuilding.py: an old revision's content
    recorded again as the next revision (``rollback:N``)."""

    def unit(w: Any) -> tuple[str, Revision | None]:
        old = w.revision("agent", "user_md", number, owner_id=owner)
        return old.content, w.record_revision(
            "agent", "user_md", old.content, reason=f"rollback:{number}", owner_id=owner
        )

    result: tuple[str, Revision | None] = db.write(unit)
    return result


def test_p2_revisions_are_recorded_only_when_content_changes_and_roll_back(
    storage: Store,
) -> None:
    def record(content: str, *, now: int, name: str = "user_md", owner: str = "") -> Any:
        return storage.write(
            lambda w: w.record_revision(
                "agent", name, content, reason="rebuild", owner_id=owner, now=now
            )
        )

    first = record("# User\n- tea\n", now=T0)
    assert isinstance(first, Revision)
    assert (first.revision, first.reason, first.created_at) == (1, "rebuild", T0)
    assert record("# User\n- tea\n", now=T0 + 1) is None
    second = record("# User\n- coffee\n", now=T0 + 2)
    assert second.revision == 2 and second.resource_id == first.resource_id
    content, rolled = _rollback(storage, 1)
    assert content == first.content and rolled is not None
    assert (rolled.revision, rolled.reason, rolled.content) == (3, "rollback:1", first.content)
    assert _rollback(storage, 3) == (first.content, None)  # already current
    other_owner = record("# User\n- tea\n", now=T0 + 3, owner="alice")
    memory = record("# Memory\n", now=T0 + 4, name="memory_md")
    assert other_owner.revision == memory.revision == 1
    with storage.read() as r:
        resource = r.resource("agent", "user_md")
        assert resource is not None
        assert (resource.current_revision, resource.owner_id) == (3, "")
        assert r.current_revision("agent", "user_md") == r.revision("agent", "user_md", 3)
        assert [v.revision for v in r.revisions("agent", "user_md")] == [3, 2, 1]
        assert r.revisions("agent", "user_md", limit=1) == [r.revision("agent", "user_md", 3)]
        assert r.revisions("agent", "user_md", owner_id="nobody") == []
        assert r.current_revision("agent", "memory_md", owner_id="alice") is None
        assert r.resource("nobody", "user_md") is None
        assert [(s.owner_id, s.name) for s in r.resources()] == [
            ("", "memory_md"),
            ("", "user_md"),
            ("alice", "user_md"),
        ]
        assert r.resources("nobody") == []
        with pytest.raises(NotFoundError):
            r.revision("agent", "user_md", 4)
        with pytest.raises(InvalidInputError):
            r.revision("agent", "soul_md", 1)
        with pytest.raises(InvalidInputError):
            r.revisions("agent", "user_md", limit=0)
    with pytest.raises(InvalidInputError):
        storage.write(lambda w: w.record_revision("", "user_md", "x", reason="r"))
    with pytest.raises(NotFoundError):
        _rollback(storage, 9)


def test_p2_two_services_recording_one_file_number_its_revisions_1_to_n(
    backend: Backend,
) -> None:
    """B2: four writers on two instances (two services) record revisions of one file at
    once: numbers 1..N without gap or duplicate, each content once; content equal to the
    current revision records nothing, even when two services record it together."""
    dbs = [backend.db, backend.open()] * 2
    per_writer = 15
    barrier = threading.Barrier(len(dbs))

    def writer(i: int) -> list[Revision | None]:
        barrier.wait(WAIT)
        return [
            dbs[i].write(
                lambda w, n=n: w.record_revision("agent", "memory_md", f"w{i} n{n}", reason="r")
            )
            for n in range(per_writer)
        ]

    with ThreadPoolExecutor(len(dbs)) as pool:
        recorded = [r for batch in pool.map(writer, range(len(dbs))) for r in batch]
    assert all(r is not None for r in recorded)
    total = len(dbs) * per_writer
    history = read(backend.db, lambda r: r.revisions("agent", "memory_md"))
    assert [h.revision for h in history] == list(range(total, 0, -1))
    assert len({h.content for h in history}) == total
    assert sorted(r.revision for r in recorded if r) == list(range(1, total + 1))
    # The same new content from every writer at once: one revision, the others None.
    barrier = threading.Barrier(len(dbs))

    def same(i: int) -> Revision | None:
        barrier.wait(WAIT)
        result: Revision | None = dbs[i].write(
            lambda w: w.record_revision("agent", "memory_md", "# Same\n", reason="r")
        )
        return result

    with ThreadPoolExecutor(len(dbs)) as pool:
        outcomes = list(pool.map(same, range(len(dbs))))
    made = [r for r in outcomes if r is not None]
    assert len(made) == 1 and made[0].revision == total + 1
    resource = read(backend.db, lambda r: r.resource("agent", "memory_md"))
    assert resource is not None and resource.current_revision == total + 1


def test_b2_a_second_service_holding_the_owner_lock_waits_for_the_first_commit(
    backend: Backend,
) -> None:
    """B2: ``lock_owner`` serialises the units of two services for one (agent, owner): the
    second waits until the first commits, then sees what it wrote; another owner's lock is
    free meanwhile. On SQLite a no-op (the single writer serialises), checking its ids."""
    if backend.name == "sqlite":
        backend.db.write(lambda w: w.lock_owner("agent", ""))
        with pytest.raises(InvalidInputError):
            backend.db.write(lambda w: w.lock_owner("", "alice"))
        return
    import psycopg

    first, second, third = backend.db, backend.open(), backend.open()
    holding, release, second_locked = threading.Event(), threading.Event(), threading.Event()

    def hold(w: Any) -> str:
        w.lock_owner("agent", "alice")
        holding.set()
        assert release.wait(WAIT)
        w.upsert_row(
            agent_id="agent", owner_id="alice", scope=ALICE, category="goal",
            key="under the lock", value="v", promote_target=None,
        )  # fmt: skip
        return "first"

    def wait_then_read(w: Any) -> MemoryRow | None:
        w.lock_owner("agent", "alice")
        second_locked.set()
        found: MemoryRow | None = w.row_by_key(
            agent_id="agent", owner_id="alice", scope=ALICE, key="under the lock"
        )
        return found

    with ThreadPoolExecutor(2) as pool, psycopg.connect(first.url, autocommit=True) as watch:
        held = pool.submit(first.write, hold)
        assert holding.wait(WAIT)
        third.write(lambda w: w.lock_owner("agent", "bob"))  # another pair: not blocked
        waiting = pool.submit(second.write, wait_then_read)
        _until_an_advisory_lock_is_awaited(watch)
        assert not second_locked.is_set()
        release.set()
        assert held.result(WAIT) == "first"
        seen = waiting.result(WAIT)
    assert seen is not None and seen.key == "under the lock"


def _until_an_advisory_lock_is_awaited(conn: Any) -> None:
    """Return once some session waits for an advisory lock (the server's own view), or
    fail after :data:`WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    while conn.execute(sql).fetchone()[0] == 0:
        assert time.monotonic() < deadline, "no session ever waited for the owner lock"


def test_over_the_match_cap_postgres_takes_the_best_by_ts_rank(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``MAX_MATCHES`` filtered matches PostgreSQL ranks with ``ts_rank`` (the one
    documented difference from SQLite): still only matching rows within the filters, the
    best first, at most ``limit``."""
    if backend.name == "sqlite":
        pytest.skip("the match cap is PostgreSQL's")
    from fermix.storage.postgres import memory_relevance

    monkeypatch.setattr(memory_relevance, "MAX_MATCHES", 4)
    for i in range(8):
        upsert(backend.db, f"k{i}", "tea " * (i % 3 + 1) + "and cake", now=T0 + i)
    upsert(backend.db, "other", "tea", owner="bob", scope=BOB)
    upsert(backend.db, "none", "coffee")
    found = read(backend.db, lambda r: r.search_rows("tea", owner_id="alice", limit=5))
    assert len(found) == 5
    assert all("tea" in row.value and row.owner_id == "alice" for row in found)
    assert found[0].value.count("tea") == 3


def test_postgres_row_and_token_counts_follow_every_write_even_from_outside(
    backend: Backend,
) -> None:
    """The per-(agent, owner) counters behind memory_version and the search ranking
    (``memory_versions``) stay equal to the table's rows and tokens whoever writes: fermix,
    or SQL from outside that moves, deletes or truncates rows (A3)."""
    if backend.name == "sqlite":
        pytest.skip("memory_versions is PostgreSQL's")
    import psycopg

    db = backend.db
    rows = [upsert(db, f"k{i}", "tea and " * i + "cake", now=T0 + i) for i in range(1, 6)]
    upsert(db, "k1", "now much shorter")
    db.write(lambda w: w.replace_row(rows[1].id, value="a brand new longer value here", key="n"))
    totals = (
        "SELECT (SELECT count(*) FROM memories), (SELECT coalesce(sum(stem_count), 0)"
        " FROM memories), (SELECT sum(row_count) FROM memory_versions),"
        " (SELECT sum(token_count) FROM memory_versions)"
    )
    with psycopg.connect(db.url, autocommit=True) as conn:

        def check() -> int:
            count, tokens, counted, token_total = conn.execute(totals).fetchone()
            assert (counted, token_total) == (count, tokens)
            return int(count)

        assert check() == 5
        before = read(db, lambda r: r.memory_version("agent", "bob"))
        conn.execute("UPDATE memories SET owner_id = 'bob' WHERE id = %s", (rows[2].id,))
        assert read(db, lambda r: r.memory_version("agent", "bob")) > before
        assert check() == 5
        conn.execute("DELETE FROM memories WHERE id = %s", (rows[3].id,))
        assert check() == 4
        version = read(db, lambda r: r.memory_version())
        conn.execute("TRUNCATE memories CASCADE")
        assert check() == 0
        assert read(db, lambda r: r.memory_version()) > version
