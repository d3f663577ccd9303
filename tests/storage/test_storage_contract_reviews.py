"""The storage port's contract for the due-review sweep, over both adapters (issue 15, M5,
M7, E2, B2).

A conversation is due from its first unreviewed user message (``review_due_at``, set in the
insert's trigger) until a review catches up; the sweep reads the due ones off an index
(``due_reviews``) and claims them in one write (``claim_due_reviews``), and each review
takes its claim again with the sweep's token (``claim_review``): one claim protocol. The
random histories check the index against the rule it replaces: the join of every
conversation with its messages (``with_new_user_messages``) and the review gate.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_fixtures import Backend, Store

from fermix.clock import now_ms
from fermix.core import review
from fermix.errors import InvalidInputError
from fermix.model import REASON_MAX_CHARS, ConversationKey, Message, NewMessage
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.migrations import latest_version, migrations

KEY = ConversationKey("agent", "telegram", "123")
OTHER = ConversationKey("agent", "telegram", "456", "thread-1")
TTL = 60_000


def say(
    db: Store,
    content: str,
    *,
    key: ConversationKey = KEY,
    role: str = "user",
    at: int | None = None,
) -> Message:
    """An append as the writer makes it: the conversation touched, the message inserted
    (stored ``at`` that time when given)."""

    def unit(writes: Any) -> Message:
        writes.touch_known(key, "alice", "operator")
        new = NewMessage(key, role, content, owner_id="alice")
        stored: Message = writes.insert_message(new, created_at=at)
        return stored

    result: Message = db.append(unit, label="append")
    return result


def due(db: Store, now: int, **gates: int) -> list[ConversationKey]:
    with db.read() as r:
        found: list[ConversationKey] = r.due_reviews(now=now, **gates)
    return found


def claim_due(db: Store, token: str, now: int, limit: int = 50, **gates: int) -> list[Any]:
    return list(
        db.write(
            lambda w: w.claim_due_reviews(token=token, now=now, ttl_ms=TTL, limit=limit, **gates)
        )
    )


def test_m7_a_user_message_makes_its_conversation_due_and_an_assistant_one_does_not(
    storage: Store,
) -> None:
    now = now_ms()
    say(storage, "hi there", role="assistant")
    assert due(storage, now) == []
    say(storage, "first", key=OTHER, at=now)
    say(storage, "then this one", at=now + 1)
    assert due(storage, now) == [OTHER, KEY]  # oldest waiting first
    assert due(storage, now, limit=1) == [OTHER]
    assert claim_due(storage, "t", now) == sorted([KEY, OTHER])
    assert due(storage, now) == []  # claimed, so no other sweep sees them


def test_m5_a_review_that_leaves_a_backlog_stays_due_and_one_that_catches_up_does_not(
    storage: Store,
) -> None:
    said = [say(storage, f"m{i}") for i in range(3)]
    say(storage, "an answer", role="assistant")
    now = now_ms()
    assert claim_due(storage, "sweep", now) == [KEY]
    assert storage.write(lambda w: w.claim_review(KEY, token="sweep", now=now, ttl_ms=TTL))
    assert storage.write(
        lambda w: w.finish_review(KEY, token="sweep", now=now, last_message_id=said[1].id)
    )
    assert due(storage, now) == [KEY]  # due again at once (M5)
    assert claim_due(storage, "next", now) == [KEY]
    assert storage.write(
        lambda w: w.finish_review(KEY, token="next", now=now, last_message_id=said[2].id)
    )
    assert due(storage, now) == []
    say(storage, "news")
    assert due(storage, now) == [KEY]


def test_m7_e2_the_interval_the_backoff_and_a_live_claim_hold_a_due_conversation_back(
    storage: Store,
) -> None:
    first = say(storage, "one")
    say(storage, "two")
    t = now_ms()
    assert claim_due(storage, "a", t) == [KEY]
    assert due(storage, t + TTL - 1) == []  # its claim holds it
    assert due(storage, t + TTL) == [KEY]  # expired: another sweep may take it over
    storage.write(lambda w: w.finish_review(KEY, token="a", now=t, last_message_id=first.id))
    gates = {"interval_ms": 1_000, "backoff_ms": 500}
    assert due(storage, t + 999, **gates) == []
    assert due(storage, t + 1_000, **gates) == [KEY]
    assert claim_due(storage, "b", t + 999, **gates) == []
    assert claim_due(storage, "b", t + 1_000, **gates) == [KEY]
    storage.write(lambda w: w.fail_review(KEY, token="b", now=t + 2_000))
    assert due(storage, t + 2_499, **gates) == []
    assert due(storage, t + 2_500, **gates) == [KEY]


def test_e2_b2_a_review_takes_the_sweep_s_claim_with_its_token_and_no_one_else_can(
    backend: Backend,
) -> None:
    say(backend.db, "hello")
    other = backend.open()  # another service
    t = now_ms()
    assert claim_due(backend.db, "sweep", t) == [KEY]
    assert claim_due(other, "theirs", t) == []
    assert not other.write(lambda w: w.claim_review(KEY, token="theirs", now=t, ttl_ms=TTL))
    later = t + 1_000
    assert backend.db.write(lambda w: w.claim_review(KEY, token="sweep", now=later, ttl_ms=TTL))
    with other.read() as r:
        state = r.conversation(KEY)
    assert state is not None
    assert (state.review_claim_token, state.review_claim_expires_at) == ("sweep", later + TTL)
    with other.read() as r:
        newest = r.newest_user_message_id(KEY)
    assert not other.write(
        lambda w: w.finish_review(KEY, token="theirs", now=later, last_message_id=newest)
    )
    assert backend.db.write(
        lambda w: w.finish_review(KEY, token="sweep", now=later, last_message_id=newest)
    )
    assert due(other, later) == []


def test_b2_a_sweep_claim_given_back_is_due_for_the_next_sweep_of_any_service(
    backend: Backend,
) -> None:
    say(backend.db, "hello")
    other = backend.open()
    t = now_ms()
    assert claim_due(backend.db, "mine", t) == [KEY]
    assert not other.write(lambda w: w.release_review(KEY, token="not mine"))
    assert backend.db.write(lambda w: w.release_review(KEY, token="mine"))
    assert not backend.db.write(lambda w: w.release_review(KEY, token="mine"))  # once
    with other.read() as r:
        state = r.conversation(KEY)
    assert state is not None and state.review_claim_token is None
    assert state.last_reviewed_at is None  # nothing was reviewed
    assert claim_due(other, "theirs", t) == [KEY]


def test_m5_a_release_drops_a_due_mark_whose_backlog_is_gone(tmp_path: Path) -> None:
    """Messages deleted from outside fermix leave the mark without a backlog: the claim that
    finds nothing to review gives it back, and the conversation is no longer due."""
    path = tmp_path / "memory.db"
    db = Database(path)
    try:
        gone = say(db, "deleted later")
        raw = apsw.Connection(str(path))
        with transaction(raw):
            raw.execute("DELETE FROM messages WHERE id = ?", (gone.id,))
        raw.close()
        t = now_ms()
        assert claim_due(db, "s", t) == [KEY]
        assert db.write(lambda w: w.release_review(KEY, token="s"))
        assert due(db, t) == []
    finally:
        db.close()


def test_m7_the_sqlite_sweep_reads_the_due_index_not_the_messages(tmp_path: Path) -> None:
    db = Database(tmp_path / "memory.db")
    db.close()
    conn = apsw.Connection(str(tmp_path / "memory.db"))
    plan = " ".join(
        str(row[-1])
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT agent_id FROM conversations WHERE review_due_at IS NOT NULL"
            " AND (last_reviewed_at IS NULL OR last_reviewed_at <= 0)"
            " ORDER BY review_due_at LIMIT 5"
        )
    )
    conn.close()
    assert "conversations_due" in plan and "messages" not in plan


def test_m7_an_append_to_a_conversation_already_due_writes_no_page_of_the_due_index(
    tmp_path: Path,
) -> None:
    """Issue 25: the due time is set once, by the first waiting user message; later
    appends move the conversation's window (its row is written) but leave the due index's
    pages alone, so they cost no page of the log for it (the log's frames, read back)."""
    path = tmp_path / "memory.db"
    db = Database(path)
    try:
        first = say(db, "first")
        before = _log_bytes(path)
        for n, role in enumerate(["user", "assistant", "user"]):
            say(db, f"more {n}", role=role)
        written = _pages_logged(path, before)
        assert due(db, now_ms()) == [KEY]
        with db.read() as r:
            assert r.window_mark(KEY)[0] == 4
    finally:
        db.close()
    assert "conversations" in written and "messages" in written
    assert "conversations_due" not in written
    conn = apsw.Connection(str(path))
    try:
        rows = conn.execute("SELECT review_due_at FROM conversations").fetchall()
    finally:
        conn.close()
    assert rows == [(first.created_at,)]


def _log_bytes(path: Path) -> int:
    return Path(f"{path}-wal").stat().st_size


def _pages_logged(path: Path, start: int) -> set[str]:
    """The b-trees (tables and indexes) whose pages the log holds past ``start`` bytes."""
    log = Path(f"{path}-wal").read_bytes()
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        page_size = int(conn.execute("PRAGMA page_size").fetchall()[0][0])
        owners = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
    finally:
        conn.close()
    frame = 24 + page_size
    offset = max(32, start)
    pages = set()
    while offset + frame <= len(log):
        pages.add(int.from_bytes(log[offset : offset + 4], "big"))
        offset += frame
    return {owners[page] for page in pages if page in owners}


# -- random histories against the rule the index replaces --------------------------------

_INTERVAL_MS = 1_000
_BACKOFF_MS = 500
_HOURS = _INTERVAL_MS / 3_600_000
_agents = itertools.count()

_op = st.one_of(
    st.tuples(st.just("say"), st.integers(0, 2), st.sampled_from(["user", "user", "assistant"])),
    st.tuples(st.just("review"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("fail"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("sweep"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("wait"), st.sampled_from([1, 300, 499, 500, 999, 1_000]), st.just(0)),
)


def _expected(db: Store, agent: str, now: int) -> list[ConversationKey]:
    """The sweep's rule before migration 9: every conversation with user messages after its
    cursor, through the review gate, not held by a live claim."""
    with db.read() as r:
        pending = r.with_new_user_messages(agent_id=agent)
    return sorted(
        state.key
        for state, _ in pending
        if review.gate(
            state,
            now_ms=now,
            interval_hours=_HOURS,
            backoff_ms=_BACKOFF_MS,
            newest_user_message_id=state.last_reviewed_message_id + 1,
        )
        is None
        and (state.review_claim_token is None or (state.review_claim_expires_at or 0) <= now)
    )


def _review(db: Store, key: ConversationKey, now: int, take: int, token: str) -> None:
    """One review as :class:`fermix.runtime.reviewing.Reviewing` writes it: claim, take the
    oldest ``take`` waiting messages, finish; a partial one keeps its last complete time."""
    if not db.write(lambda w: w.claim_review(key, token=token, now=now, ttl_ms=300)):
        return
    with db.read() as r:
        state = r.conversation(key)
        assert state is not None
        newest = r.newest_user_message_id(key)
        shown, total = r.review_backlog(
            key, after_id=state.last_reviewed_message_id, up_to=newest, limit=take
        )
    last = shown[-1].id if shown else newest

    def finish(w: Any) -> None:
        assert w.finish_review(key, token=token, now=now, last_message_id=last)
        if total > len(shown):
            w.update_conversation(key, last_reviewed_at=state.last_reviewed_at)

    db.write(finish)


def _fail(db: Store, key: ConversationKey, now: int, token: str) -> None:
    if db.write(lambda w: w.claim_review(key, token=token, now=now, ttl_ms=300)):
        db.write(lambda w: w.fail_review(key, token=token, now=now))


def _sweep(db: Store, agent: str, now: int, limit: int, token: str, *, give_back: bool) -> None:
    """A sweep claims; its claims go back at once, or are held until they expire."""
    gates = {"interval_ms": _INTERVAL_MS, "backoff_ms": _BACKOFF_MS}
    claimed = [k for k in claim_due(db, token, now, limit=limit, **gates) if k.agent_id == agent]
    assert len(set(claimed)) == len(claimed) <= limit
    if give_back:
        for key in claimed:
            assert db.write(lambda w, key=key: w.release_review(key, token=token))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(_op, min_size=1, max_size=14))
def test_m5_m7_the_due_index_agrees_with_the_join_and_the_gate_on_any_history(
    backend: Backend, ops: list[tuple[str, int, Any]]
) -> None:
    db = backend.db
    agent = f"a{next(_agents)}"
    keys = [ConversationKey(agent, "tg", str(i)) for i in range(3)]
    now = now_ms()
    tokens = itertools.count()
    for op, n, arg in ops:
        if op == "say":
            say(db, f"said {op}", key=keys[n], role=arg)
        elif op == "review":
            _review(db, keys[n], now, arg, f"r{next(tokens)}")
        elif op == "fail":
            _fail(db, keys[n], now, f"f{next(tokens)}")
        elif op == "sweep":
            _sweep(db, agent, now, n, f"s{next(tokens)}", give_back=not arg)
        else:
            now += n
        found = due(db, now, interval_ms=_INTERVAL_MS, backoff_ms=_BACKOFF_MS)
        assert sorted(k for k in found if k.agent_id == agent) == _expected(db, agent, now)


# -- migration 9 on a database written by migration 8 ------------------------------------


def test_m5_migration_9_marks_due_exactly_the_conversations_with_a_backlog(
    tmp_path: Path,
) -> None:
    assert [m.version for m in migrations()][8] == 9
    path = tmp_path / "memory.db"
    old = apsw.Connection(str(path))
    old.execute("PRAGMA journal_mode = WAL")
    for migration in migrations()[:8]:
        with transaction(old):
            for _ in old.execute(migration.sql):
                pass
            old.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
                (migration.version, migration.name),
            )
            old.execute(f"PRAGMA user_version = {migration.version}")
    first_waiting: dict[ConversationKey, int] = {}
    with transaction(old):
        for c in range(6):
            key = ConversationKey("agent", "tg", f"c{c}")
            old.execute(
                "INSERT INTO conversations (agent_id, channel, chat_id, thread_scope,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0)",
                key.as_tuple(),
            )
            ids = []
            for i in range(4):
                role = "assistant" if c == 5 or i == 1 else "user"
                rows: Any = old.execute(
                    "INSERT INTO messages (agent_id, channel, chat_id, thread_scope, role,"
                    " content, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (*key.as_tuple(), role, f"m{i}", 1_000 * c + i),
                ).fetchall()
                ids.append((int(rows[0][0]), role, 1_000 * c + i))
            # c0: never reviewed; c1: reviewed up to m0; c2: up to m2; c3, c5: all of it
            cursor = {0: 0, 1: ids[0][0], 2: ids[2][0]}.get(c, ids[-1][0])
            old.execute(
                "UPDATE conversations SET last_reviewed_message_id = ? WHERE chat_id = ?",
                (cursor, key.chat_id),
            )
            waiting = [t for i, role, t in ids if role == "user" and i > cursor]
            if waiting:
                first_waiting[key] = min(waiting)
    old.close()

    db = Database(path)
    try:
        with db.read() as r:
            assert r.schema_version() == latest_version()
            pending = {s.key for s, _ in r.with_new_user_messages()}
        assert due(db, now_ms()) == sorted(first_waiting, key=first_waiting.__getitem__)
        assert set(first_waiting) == pending
        conn = apsw.Connection(str(path))
        stored = {
            ConversationKey(*row[:4]): row[4]
            for row in conn.execute(
                "SELECT agent_id, channel, chat_id, thread_scope, review_due_at"
                " FROM conversations WHERE review_due_at IS NOT NULL"
            )
        }
        conn.close()
        assert stored == first_waiting
    finally:
        db.close()


@pytest.mark.parametrize("limit", [1, 2])
def test_m7_a_sweep_claims_at_most_its_limit_oldest_due_first(storage: Store, limit: int) -> None:
    now = now_ms()
    for n, key in enumerate((OTHER, KEY)):
        say(storage, "hello", key=key, at=now + n)
    assert claim_due(storage, "s", now, limit=limit) == sorted([OTHER, KEY][:limit])


def test_m7_a_sweep_takes_conversations_due_at_once_in_key_order_as_its_preview_lists(
    storage: Store,
) -> None:
    # Stored in the reverse of key order, all due from the same time: the sweep's limit
    # cuts ties by the key's bytes on both adapters, not by the order rows were written.
    now = now_ms()
    keys = [ConversationKey("agent", "telegram", chat) for chat in ("z", "b", "B", "a")]
    for key in keys:
        say(storage, "hello", key=key, at=now)
    in_key_order = sorted(keys)
    assert due(storage, now) == in_key_order
    assert due(storage, now, limit=2) == in_key_order[:2]
    assert claim_due(storage, "s", now, limit=2) == in_key_order[:2]
    assert claim_due(storage, "t", now, limit=1) == in_key_order[2:3]


def test_w1_the_last_review_and_compaction_keep_their_outcome_and_a_bounded_reason(
    storage: Store,
) -> None:
    """W1: each conversation keeps how its last review and compaction ended and why, on
    both adapters; a reason is bounded to one short line, and recording one moves no
    ``updated_at`` (the console's order)."""
    say(storage, "hello")
    with storage.read() as r:
        before = r.conversation(KEY)
    assert before is not None and before.review_outcome is None
    assert before.compaction_outcome is None

    storage.write(
        lambda w: w.record_outcome(
            KEY, work="review", outcome="failed", reason="model_error:\n  x " * 100, now=5
        )
    )
    storage.write(
        lambda w: w.record_outcome(
            KEY, work="compaction", outcome="skipped", reason="no_model", now=6
        )
    )
    with storage.read() as r:
        after = r.conversation(KEY)
    assert after is not None
    assert (after.review_outcome, after.review_outcome_at) == ("failed", 5)
    assert after.review_reason is not None and len(after.review_reason) == REASON_MAX_CHARS
    assert "\n" not in after.review_reason and after.review_reason.startswith(
        "model_error: x model_error: x"
    )
    assert (after.compaction_outcome, after.compaction_reason) == ("skipped", "no_model")
    assert after.compaction_outcome_at == 6 and after.updated_at == before.updated_at


def test_w1_an_outcome_of_unknown_work_is_refused_with_a_typed_error(storage: Store) -> None:
    say(storage, "hello")
    with pytest.raises(InvalidInputError, match="work must be one of"):
        storage.write(
            lambda w: w.record_outcome(KEY, work="dreaming", outcome="x", reason="", now=1)
        )
