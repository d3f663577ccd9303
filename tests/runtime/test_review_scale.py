"""Reviews at scale: every user message reviewed exactly once however long the backlog
(M5), the rows shown to a review within a token budget at 10,000 rows, and other owners'
prompt files rebuilt off the review's path (M6).

Each test wires a home as a process does (``Database``, ``Writer``, ``PromptFiles``,
``Reviewing`` with the test's clock) and answers the reviewer from the loopback model
server, whose recorded requests are what the model was shown. Threads are waited on through
events, locks and :meth:`PromptFiles.settle`, never by sleeping.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import Clock, StartMemory, config_for, fact, memory_row, reading
from hypothesis import given, settings
from hypothesis import strategies as st
from model_server import ModelServer
from rig import Rig

from fermix import model
from fermix.api import Memory
from fermix.config import Config, MemoryConfig
from fermix.core import categories
from fermix.core.review import CUT_MARK, ReviewResult, Skip, pack_backlog, pick_rows, row_tokens
from fermix.core.review_answer import NOTHING_TO_SAVE
from fermix.home import Home
from fermix.model import ConversationKey, ConversationState, MemoryRow, Message
from fermix.runtime.prompt_files import PromptFiles, disk
from fermix.storage import Writes
from fermix.token_counts import MESSAGE_OVERHEAD_TOKENS, count_tokens

MODEL = "openai/reviewer"
HOUR_MS = 3_600_000
BACKOFF_MS = MemoryConfig().review_failure_backoff_ms
WAIT_S = 30

reviewer_config = functools.partial(config_for, primary=MODEL, memory=MemoryConfig())
"""``config_for`` the loopback server with the reviewer's defaults (background review on)."""


@pytest.fixture
def make_rig(home: Path, model_server: ModelServer, clock: Clock) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(config: Config | None = None) -> Rig:
        rigs.append(Rig(home, config or reviewer_config(model_server), clock=clock))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.close()


KEY = ConversationKey("agent", "tg", "1")


def shown_messages(server: ModelServer) -> list[list[int]]:
    """The ids of the user messages each request showed the model, request by request."""
    return [
        [m["id"] for m in json.loads(r["messages"][1]["content"])["user_messages"]]
        for r in server.requests
    ]


def sent_data(server: ModelServer, index: int = -1) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(server.requests[index]["messages"][1]["content"])
    return data


def state_of(home: Path, key: ConversationKey = KEY) -> ConversationState:
    with reading(home) as reads:
        state = reads.conversation(key)
    assert state is not None
    return state


# -- M5: every user message reviewed exactly once ----------------------------------------


def _message(id: int, text: str) -> Message:
    return Message(
        id=id,
        agent_id="agent",
        owner_id="alice",
        channel="tg",
        chat_id="1",
        thread_scope="",
        sender="alice",
        role="user",
        kind="chat",
        content=text,
        metadata_json="{}",
        created_at=id,
    )


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=80), min_size=1, max_size=30),
    max_messages=st.integers(min_value=1, max_value=40),
    budget=st.integers(min_value=10, max_value=400),
)
def test_m5_pack_takes_the_oldest_messages_with_no_gap_and_always_at_least_one(
    lengths: list[int], max_messages: int, budget: int
) -> None:
    msgs = [_message(i + 1, "word " * n) for i, n in enumerate(lengths)]
    packed = pack_backlog(msgs[::-1], max_messages=max_messages, token_budget=budget, model=None)
    ids = [m.id for m in packed.messages]
    assert ids == list(range(1, len(ids) + 1))  # the oldest, in order, no gap
    assert 1 <= len(ids) <= max_messages
    cost = sum(count_tokens(m.content, None) + MESSAGE_OVERHEAD_TOKENS for m in packed.messages)
    if packed.truncated:
        assert len(ids) == 1 and packed.messages[0].content.endswith(CUT_MARK)
        assert count_tokens(msgs[0].content, None) + MESSAGE_OVERHEAD_TOKENS > budget
    else:
        assert cost <= budget
        assert [m.content for m in packed.messages] == [m.content for m in msgs[: len(ids)]]
        if len(ids) < min(len(msgs), max_messages):  # stopped by the budget, at the next one
            nxt = msgs[len(ids)]
            assert cost + count_tokens(nxt.content, None) + MESSAGE_OVERHEAD_TOKENS > budget


@settings(max_examples=150, deadline=None)
@given(
    relevant=st.lists(st.integers(min_value=1, max_value=60), unique=True, max_size=40),
    newest=st.lists(st.integers(min_value=1, max_value=60), unique=True, max_size=40),
    budget=st.integers(min_value=1, max_value=1500),
)
def test_m6_pick_rows_stays_within_the_budget_and_shows_only_rows_given(
    relevant: list[int], newest: list[int], budget: int
) -> None:
    rows = {i: memory_row(id=i, key=f"k{i}", value="v" * (i * 3)) for i in range(1, 61)}
    picked = pick_rows(
        [rows[i] for i in relevant], [rows[i] for i in newest], token_budget=budget, model=None
    )
    ids = [r.id for r in picked]
    assert ids == sorted(set(ids)) and set(ids) <= set(relevant) | set(newest)
    assert sum(row_tokens(r, None) for r in picked) <= budget
    # the best relevant row is shown if it fits, and the newest if it fits beside it
    left = budget
    if relevant and row_tokens(rows[relevant[0]], None) <= budget:
        assert relevant[0] in ids
        left -= row_tokens(rows[relevant[0]], None)
    if newest and row_tokens(rows[newest[0]], None) <= left:
        assert newest[0] in ids


def test_m5_a_backlog_of_100_messages_takes_three_reviews_each_message_shown_once_in_order(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path, clock: Clock
) -> None:
    rig = make_rig()
    said = []
    for i in range(100):
        said.append(rig.say(KEY, f"note number {i} about my day"))
        if i % 10 == 0:
            rig.say(KEY, "an assistant answer is not reviewed", role="assistant")
    results: list[ReviewResult] = []
    for _ in range(3):
        model_server.reply(NOTHING_TO_SAVE)
        assert rig.reviewing.due() == [KEY]  # the rest is due at once, not in 24 hours
        results.append(rig.reviewing.review(KEY))  # as the sweep and the dispatch run it
    assert [(r.status, r.messages, r.left) for r in results] == [
        ("nothing", 40, 60),
        ("nothing", 40, 20),
        ("nothing", 20, 0),
    ]
    ids = [m.id for m in said]
    assert shown_messages(model_server) == [ids[:40], ids[40:80], ids[80:]]
    state = state_of(home)
    assert (state.last_reviewed_message_id, state.last_reviewed_at) == (ids[-1], clock.now)
    assert rig.reviewing.due() == []
    assert rig.reviewing.review(KEY, force=True).skip is Skip.NO_NEW_MESSAGES
    rig.say(KEY, "one more")
    assert rig.reviewing.review(KEY).skip is Skip.UNDER_INTERVAL  # caught up: the interval
    assert len(model_server.requests) == 3


def test_m5_a_forced_review_takes_the_whole_backlog_in_several_reviews(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path, clock: Clock
) -> None:
    rig = make_rig()
    ids = [rig.say(KEY, f"fact {i}: I collect stamp number {i}").id for i in range(100)]
    for _ in range(3):
        model_server.reply(NOTHING_TO_SAVE)
    result = rig.reviewing.review(KEY, force=True)
    shown = shown_messages(model_server)
    assert [i for batch in shown for i in batch] == ids  # each once, in order, none skipped
    assert [len(batch) for batch in shown] == [40, 40, 20]
    assert state_of(home).last_reviewed_message_id == ids[-1]
    assert (result.status, result.messages, result.left, result.reviews) == ("nothing", 100, 0, 3)


def test_m5_a_backlog_within_the_interval_is_due_at_once_and_the_interval_counts_after_it(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path, clock: Clock
) -> None:
    rig = make_rig()
    first = rig.say(KEY, "reviewed long ago")
    model_server.reply(NOTHING_TO_SAVE)
    assert rig.reviewing.review(KEY).status == "nothing"
    reviewed_at = clock.now
    ids = [rig.say(KEY, f"later message {i}").id for i in range(50)]
    assert rig.reviewing.due() == []  # within the interval
    clock.advance(25 * HOUR_MS)
    model_server.reply(NOTHING_TO_SAVE)
    rig.reviewing.review(KEY)
    assert shown_messages(model_server) == [[first.id], ids[:40]]
    # the partial review keeps the time of the last one that caught up: still due
    assert state_of(home).last_reviewed_at == reviewed_at
    assert rig.reviewing.due() == [KEY]
    model_server.reply(NOTHING_TO_SAVE)
    assert rig.reviewing.review(KEY).left == 0
    assert state_of(home).last_reviewed_at == clock.now
    assert shown_messages(model_server) == [[first.id], ids[:40], ids[40:]]
    rig.say(KEY, "new after the catch-up")
    assert rig.reviewing.due() == []


def test_m5_a_review_failing_in_a_backlog_is_visible_and_keeps_the_rest_for_after_the_backoff(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path, clock: Clock
) -> None:
    rig = make_rig()
    ids = [rig.say(KEY, f"message {i}").id for i in range(100)]
    model_server.reply(NOTHING_TO_SAVE)
    model_server.reply("this is not an answer")
    result = rig.reviewing.review(KEY, force=True)
    assert shown_messages(model_server) == [ids[:40], ids[40:80]]
    state = state_of(home)
    assert (state.last_reviewed_message_id, state.review_failed_at) == (ids[39], clock.now)
    assert (result.status, result.messages, result.left, result.reviews) == ("failed", 40, 60, 2)
    assert result.error is not None
    assert rig.reviewing.due() == []  # backing off, and visible as such
    clock.advance(BACKOFF_MS)
    assert rig.reviewing.due() == [KEY]
    model_server.reply(NOTHING_TO_SAVE)
    model_server.reply(NOTHING_TO_SAVE)
    assert rig.reviewing.review(KEY).messages == 40
    assert rig.reviewing.review(KEY).messages == 20
    # the failed batch is shown again, whole; every other message once
    assert shown_messages(model_server) == [ids[:40], ids[40:80], ids[40:80], ids[80:]]


def test_m5_a_message_larger_than_the_budget_is_cut_in_its_turn_and_the_queue_goes_on(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path
) -> None:
    budget = MemoryConfig(review_input_token_budget=60)
    rig = make_rig(reviewer_config(model_server, memory=budget))
    small = rig.say(KEY, "I live in Porto")
    huge = rig.say(KEY, "my whole diary, page after page, " * 200)
    after = rig.say(KEY, "I work nights")
    for _ in range(3):
        model_server.reply(NOTHING_TO_SAVE)
    result = rig.reviewing.review(KEY, force=True)
    assert shown_messages(model_server) == [[small.id], [huge.id], [after.id]]
    cut = sent_data(model_server, 1)["user_messages"][0]["text"]
    assert cut.endswith(CUT_MARK) and huge.content.startswith(cut[: -len(CUT_MARK)])
    assert count_tokens(cut, MODEL) + 4 <= 60
    assert state_of(home).last_reviewed_message_id == after.id
    assert (result.messages, result.truncated, result.reviews, result.left) == (3, 1, 3, 0)


@pytest.fixture
def running(start_memory: StartMemory, model_server: ModelServer, clock: Clock) -> Memory:
    return start_memory(reviewer_config(model_server), clock=clock)


def test_m5_the_sweep_and_the_dispatch_take_the_rest_of_a_backlog_at_once(
    running: Memory, model_server: ModelServer, home: Path
) -> None:
    conv = running.conversation("agent", "tg", "1", owner_id="alice", trust="operator")
    ids = [conv.append_user(f"thing {i} I did today").id for i in range(100)]
    for _ in range(3):
        model_server.reply(NOTHING_TO_SAVE)
    running.tick()  # the sweep: the first 40
    # asked after the sweep's review, and due at once: the next 40
    running.review(conv, force=False)
    assert shown_messages(model_server) == [ids[:40], ids[40:80]]
    conv.commit("Noted.")  # the dispatch after a turn: the last 20
    assert running.review(conv, force=False).skip is Skip.UNDER_INTERVAL  # caught up
    assert state_of(home, conv.key).last_reviewed_message_id == ids[-1]
    assert shown_messages(model_server) == [ids[:40], ids[40:80], ids[80:]]


# -- M6: the rows shown fit a budget, chosen by relevance --------------------------------


def _seed_rows(writes: Writes, agent_id: str, owner_id: str, count: int, start: int) -> None:
    words = ["plans", "meeting", "budget", "travel", "garden", "piano"]
    words += ["green", "tea", "review", "office", "project"]
    for i in range(count):
        category = "context" if i % 3 else "interest"
        scope, owner = (
            (categories.agent_scope(agent_id), "")
            if category == "context"
            else (categories.owner_scope(owner_id), owner_id)
        )
        writes.upsert_row(
            agent_id=agent_id,
            owner_id=owner,
            scope=scope,
            category=category,
            key=f"fact_{start + i}",
            value=f"Note {start + i}: {words[i % 11]} {words[(i * 7) % 11]} item {i}",
            promote_target=model.TARGET_OF[category],
            now=2_000_000 + start + i,
        )


def test_m6_at_10000_rows_the_rows_shown_fit_the_budget_and_the_relevant_row_is_among_them(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path
) -> None:
    budget = 3000
    rig = make_rig(
        reviewer_config(model_server, memory=MemoryConfig(review_rows_token_budget=budget))
    )
    agent_scope, alice_scope = categories.agent_scope("agent"), categories.owner_scope("alice")

    def seed(writes: Writes) -> list[MemoryRow]:
        coffee = writes.upsert_row(
            agent_id="agent",
            owner_id="alice",
            scope=alice_scope,
            category="preference",
            key="morning_drink",
            value="Drinks strong black coffee every morning",
            promote_target="user_md",
            now=1_000_000,  # the oldest row: never among the newest
        )
        bobs = writes.upsert_row(
            agent_id="agent",
            owner_id="bob",
            scope=categories.owner_scope("bob"),
            category="preference",
            key="coffee",
            value="Bob roasts his own coffee",
            promote_target="user_md",
        )
        other = writes.upsert_row(
            agent_id="other",
            owner_id="",
            scope=categories.agent_scope("other"),
            category="context",
            key="coffee",
            value="The other agent's coffee machine",
            promote_target="memory_md",
        )
        _seed_rows(writes, "agent", "alice", 10_000, start=0)
        return [coffee, bobs, other]

    coffee, bobs, other = rig.db.write(seed, label="seed")
    with reading(home) as reads:
        in_scope = len(reads.rows(agent_id="agent", owner_id="alice", scopes=[alice_scope]))
        in_scope += len(reads.rows(agent_id="agent", owner_id="", scopes=[agent_scope]))
    assert in_scope == 10_001
    rig.say(KEY, "I quit coffee last week, these days it's green tea")
    newest = max(r.id for r in [coffee, bobs, other]) + 10_000  # the last seeded row
    # row newest - 5000 is seeded row 4999: "piano budget", none of the message's words
    model_server.reply_json(
        {
            "operations": [
                {"op": "replace", "id": coffee.id, "value": "Drinks green tea, quit coffee"},
                {"op": "archive", "id": newest - 5_000, "reason": "not shown to this review"},
                {"op": "archive", "id": bobs.id, "reason": "another owner's row"},
            ]
        }
    )
    result = rig.reviewing.review(KEY)
    rows = sent_data(model_server)["existing_rows"]
    cost = sum(count_tokens(json.dumps(row, ensure_ascii=False), MODEL) + 1 for row in rows)
    assert cost <= budget
    shown = {row["id"] for row in rows}
    assert coffee.id in shown  # the relevant row, however old
    assert newest in shown  # and the newest
    assert shown.isdisjoint({bobs.id, other.id})  # never outside the review's scopes (SC3)
    assert result.shown == len(rows) and 20 < len(rows) < 200
    # admission still allows only the ids shown
    assert (result.status, result.replaced, result.archived) == ("applied", 1, 0)
    assert result.refused == [
        f"archive: id {newest - 5_000} was not shown to this review",
        f"archive: id {bobs.id} was not shown to this review",
    ]


def test_m6_the_messages_words_each_have_their_say_in_choosing_rows(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path
) -> None:
    rig = make_rig(reviewer_config(model_server, memory=MemoryConfig(review_rows_token_budget=600)))

    def seed(writes: Writes) -> list[MemoryRow]:
        _seed_rows(writes, "agent", "alice", 2_000, start=0)
        return [
            writes.upsert_row(
                agent_id="agent",
                owner_id="",
                scope=categories.agent_scope("agent"),
                category="context",
                key="sailboat",
                value="Keeps a sailboat in Cascais",
                promote_target="memory_md",
                now=1,
            )
        ]

    (boat,) = rig.db.write(seed, label="seed")
    # a long first message, then the one that names the row
    rig.say(KEY, " ".join(f"word{i}" for i in range(60)))
    rig.say(KEY, "the sailboat needs a new mast")
    model_server.reply(NOTHING_TO_SAVE)
    rig.reviewing.review(KEY)
    assert boat.id in {row["id"] for row in sent_data(model_server)["existing_rows"]}


# -- M6: other owners' files rebuilt off the review's path -------------------------------


def test_m6_a_shared_row_rebuilds_this_owner_at_once_and_other_owners_later_or_on_compose(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path
) -> None:
    rig = make_rig()
    owners = ["bob", "carol", "dave"]
    for owner in ["alice", *owners]:
        rig.writer.write_rows(
            fact("identity", "name", f"Called {owner}", owner_id=owner), label="seed"
        )
    fermix_home = Home(home)
    other = PromptFiles(fermix_home, rig.db)  # another process's view of the same files
    assert "Called dave" in other.texts("agent", "dave")[0]
    rig.say(KEY, "Rule for everyone: the office closes at six")
    model_server.reply_json(
        {
            "operations": [
                {
                    "op": "add",
                    "category": "context",
                    "key": "hours",
                    "value": "The office closes at six",
                }
            ]
        }
    )
    # Another process holds bob's files: the background rebuilds wait at bob, first in line.
    held, release = threading.Event(), threading.Event()

    def hold_bob() -> None:
        with disk.PairLocks().hold(disk.prompt_dir(fermix_home, "agent", "bob")):
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold_bob)
    holder.start()
    try:
        assert held.wait(WAIT_S)
        outcome: list[ReviewResult] = []
        reviewer = threading.Thread(target=lambda: outcome.append(rig.reviewing.review(KEY)))
        reviewer.start()
        reviewer.join(WAIT_S)
        # the review did not wait for another owner's files
        assert not reviewer.is_alive() and outcome[0].status == "applied"
        six = "The office closes at six"
        assert six in rig.files.texts("agent", "alice")[1]  # this owner: at once
        assert six in rig.files.texts("agent", "")[1]
        assert rig.files.queued >= 2  # bob (waiting) and carol, dave
        assert six in rig.files.texts("agent", "carol")[1]  # rendered on its compose
        assert six in other.texts("agent", "dave")[1]  # another process sees the marker
    finally:
        release.set()
        holder.join(WAIT_S)
    rig.files.settle()
    assert rig.files.queued == 0
    path = disk.file_path(fermix_home, "agent", "memory_md", "bob")
    assert six in path.read_text("utf-8")
    assert rig.files.stale() == []


def _on_disk(home: Home, owner: str) -> list[tuple[bytes, int] | None]:
    """Each prompt file of ``owner``'s: its bytes and modification time, or None."""
    found = []
    for path in disk.paths(home, "agent", owner):
        found.append((path.read_bytes(), path.stat().st_mtime_ns) if path.exists() else None)
    return found


def test_m6_p1_compose_is_a_pure_read_it_serves_rows_whose_rebuild_is_queued_and_writes_nothing(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path
) -> None:
    """A review's shared row queues the other owners' rebuilds; until the background thread
    gets there, their compose (in this process and in another) shows the fresh rows, with no
    commit, no revision and no file written; then the queued rebuilds write them."""
    rig = make_rig()
    owners = ["bob", "carol"]
    for owner in ["alice", *owners]:
        rig.writer.write_rows(
            fact("identity", "name", f"Called {owner}", owner_id=owner), label="seed"
        )
    fermix_home = Home(home)
    other = PromptFiles(fermix_home, rig.db)  # another process's view of the same files
    for owner in owners:
        assert f"Called {owner}" in other.texts("agent", owner)[0]
    rig.say(KEY, "Rule for everyone: the office closes at six")
    six = "The office closes at six"
    model_server.reply_json(
        {"operations": [{"op": "add", "category": "context", "key": "hours", "value": six}]}
    )
    # Another process holds bob's files: the background rebuilds wait at bob, first in line.
    held, release = threading.Event(), threading.Event()

    def hold_bob() -> None:
        with disk.PairLocks().hold(disk.prompt_dir(fermix_home, "agent", "bob")):
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold_bob)
    holder.start()
    try:
        assert held.wait(WAIT_S)
        assert rig.reviewing.review(KEY).status == "applied"
        assert rig.files.pending(("agent", "bob")) and rig.files.pending(("agent", "carol"))
        before = {owner: _on_disk(fermix_home, owner) for owner in owners}
        with reading(home) as reads:
            revisions = {
                owner: reads.current_revision("agent", "memory_md", owner_id=owner)
                for owner in owners
            }
        commits = rig.db.commits
        for _ in range(3):
            for owner in owners:
                assert six in rig.files.texts("agent", owner)[1]  # queued here
                assert six in other.texts("agent", owner)[1]  # the marker tells
        assert rig.db.commits == commits
        assert {owner: _on_disk(fermix_home, owner) for owner in owners} == before
        for owner in owners:  # no MEMORY.md on disk yet: the compose created none
            assert before[owner][1] is None
        with reading(home) as reads:
            for owner in owners:
                now = reads.current_revision("agent", "memory_md", owner_id=owner)
                assert now == revisions[owner]  # no revision recorded by a compose
    finally:
        release.set()
        holder.join(WAIT_S)
    rig.files.settle()
    for owner in owners:
        assert six in disk.file_path(fermix_home, "agent", "memory_md", owner).read_text("utf-8")
    assert rig.files.stale() == []
    assert rig.db.commits > commits


def test_m6_a_forced_review_returns_with_every_owner_s_files_rebuilt(
    make_rig: Callable[..., Rig], model_server: ModelServer, home: Path
) -> None:
    rig = make_rig()
    for owner in ["alice", "bob", "carol"]:
        rig.writer.write_rows(
            fact("identity", "name", f"Called {owner}", owner_id=owner), label="seed"
        )
    rig.say(KEY, "Rule: answers in English")
    model_server.reply_json(
        {
            "operations": [
                {"op": "add", "category": "directive", "key": "lang", "value": "Answers in English"}
            ]
        }
    )
    assert rig.reviewing.review(KEY, force=True).status == "applied"
    assert rig.files.queued == 0
    for owner in ["", "alice", "bob", "carol"]:
        path = disk.file_path(Home(home), "agent", "memory_md", owner)
        assert "Answers in English" in path.read_text("utf-8")
