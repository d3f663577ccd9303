"""Forgetting an owner, a conversation, a message and a memory row (F1-F5, F8), on both
backends.

Each test plants marker words, words no other text of the test contains, through one of the
paths by which a person's words reach fermix: a chat, a group chat, the agent's memory
tool, a review, a voice transcript, a scheduled job and its run, a compaction's summary, a
prompt file's rollback. After the forget, no file of the home holds a marker, as text or as
the full-text index stores it (its stem), while the other owner's rows stay byte for byte.
On PostgreSQL, no live or dead tuple of any table holds one (read from its pages with
pageinspect). A real home and database, the loopback model server for reviews and
compactions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from factories import StartMemory, config_for
from model_server import ModelServer

from fermix.api import Memory
from fermix.config import Config, StorageConfig
from fermix.conversation import Conversation
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import MemoryRow
from fermix.runtime.forgetting import STEP_S, Steps
from fermix.storage import fulltext

AGENT = "bot"
WINDOW = 2_000
"""A context window small enough that a few dozen turns need a compaction."""


def _markers(prefix: str) -> dict[str, str]:
    """One marker word per path, unlike any other word of the test."""
    paths = ("chat", "group", "tool", "review", "voice", "job", "run", "summary", "rollback")
    return {path: f"{prefix}{path}zq" for path in paths}


ALICE = _markers("xylofonalice")
BOB = _markers("quokkabob")


def _stems(words: list[str]) -> list[bytes]:
    """Each word, and each token the full-text index stores of it (porter stems)."""
    found = set()
    for word in words:
        found.add(word.encode())
        found.update(token.encode() for token in fulltext.standalone_tokenizer()(word))
    return sorted(found)


def _files_holding(home: Path, needles: list[bytes]) -> list[str]:
    """``file: word`` for every file of the home that holds one of ``needles``."""
    found = []
    for root, _dirs, names in os.walk(home):
        for name in names:
            path = Path(root, name)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            found += [f"{path.relative_to(home)}: {n.decode()}" for n in needles if n in data]
    return found


def _tuples_holding(url: str, needles: list[bytes]) -> list[str]:
    """``table: word`` for every live or dead tuple of every table holding a needle (F3)."""
    found = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class AS c"
                " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 't') AND n.nspname IN ('public', 'pg_toast')"
                " AND c.relpages >= 0"
            )
        ]
        for table in tables:
            pages = conn.execute(
                "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                (table,),
            ).fetchone()
            assert pages is not None
            for page in range(int(pages[0])):
                for (data,) in conn.execute(
                    "SELECT t_data FROM heap_page_items(get_raw_page(%s, %s))"
                    " WHERE t_data IS NOT NULL",
                    (table, page),
                ):
                    found += [f"{table}: {n.decode()}" for n in needles if n in bytes(data)]
    return found


# -- the two backends --------------------------------------------------------------------


@dataclasses.dataclass
class Backend:
    name: str
    url: str | None

    def config(self, base: Config) -> Config:
        if self.url is None:
            return base
        return dataclasses.replace(base, storage=StorageConfig(url=self.url))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", None)
    return Backend("postgres", request.getfixturevalue("postgres_db"))


@pytest.fixture
def config(model_server: ModelServer, backend: Backend) -> Config:
    base = config_for(model_server, context_window=WINDOW, persist_transcripts=True)
    return backend.config(base)


@pytest.fixture
def mem(start_memory: StartMemory, config: Config) -> Memory:
    return start_memory(config)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _add(key: str, value: str, *, speaker: str | None = None) -> dict[str, Any]:
    op = {"op": "add", "category": "preference", "key": key, "value": value}
    return op if speaker is None else {**op, "speaker": speaker}


def _plant(mem: Memory, server: ModelServer, owner: str, words: dict[str, str]) -> Conversation:
    """Every path's marker of ``owner`` into the home; returns the owner's own chat."""
    conv = mem.conversation(AGENT, "tg", f"{owner}-dm", owner_id=owner)
    conv.append_user(f"I keep a pet called {words['chat']}")
    conv.append_assistant("A lovely name.")
    # the group chat: the other owner owns it, this one speaks in it
    group = mem.conversation(AGENT, "tg", "group", owner_id="carol")
    group.append_user(f"in the group I say {words['group']}", owner_id=owner)
    group.append_user("and carol answers", owner_id="carol")
    # the agent's memory tool, at conversation scope
    stored = json.loads(mem.tools.run(_call("memory_store", key="note", value=words["tool"]), conv))
    assert "error" not in stored
    # a review that stores a fact drawn from the chat
    server.reply_json({"operations": [_add("pet", f"Has a pet called {words['review']}")]})
    reviewed = mem.review(conv)
    assert reviewed.added == 1, reviewed.refused
    # a voice transcript
    assert mem.voice_transcript(
        AGENT, f"{owner}-phone", "user", f"say {words['voice']}", owner_id=owner
    )
    # a job and its run
    job = mem.create_job(
        AGENT, f"{owner}-digest", schedule="0 8 * * *", prompt=words["job"], owner_id=owner
    )
    run = mem.start_run(job.id)
    mem.finish_run(run.id, status="succeeded", output=f"digest of {words['run']}")
    # a compaction whose summary names the marker
    for i in range(30):
        conv.append_user(f"turn {i}: tell me about the harbour in Porto again, please")
        conv.append_assistant("The harbour of Porto is on the Douro, near the sea, and old.")
    server.reply(f"Summary: the user talked about {words['summary']} and the harbour.")
    assert mem.compact(conv, force=True).status == "compacted"
    # a rolled-back prompt file: a revision that held the marker comes back as the newest
    conv.append_user("I have a new toy")
    server.reply_json({"operations": [_add("toy", f"Likes {words['rollback']}")]})
    assert mem.review(conv).added == 1
    (with_toy,) = [
        r for r in mem.revisions(AGENT, "user_md", owner_id=owner) if words["rollback"] in r.content
    ][-1:]
    server.reply_json(
        {"operations": [{"op": "archive", "id": _row(mem, owner, "toy").id, "reason": "gone"}]}
    )
    conv.append_user("I gave that toy away")
    assert mem.review(conv).archived == 1
    mem.rollback(AGENT, "user_md", with_toy.revision, owner_id=owner)
    return conv


def _row(mem: Memory, owner: str, key: str) -> MemoryRow:
    (row,) = [
        r
        for r in mem.list_rows(agent_id=AGENT, archived=None)
        if r.owner_id == owner and r.key == key
    ]
    return row


def _snapshot(mem: Memory, owner: str) -> dict[str, Any]:
    """Everything of ``owner`` a host can read back, to compare byte for byte."""
    rows = sorted(
        (
            dataclasses.astuple(r)
            for r in mem.list_rows(agent_id=AGENT, archived=None)
            if r.owner_id == owner
        ),
    )
    revisions = [
        dataclasses.astuple(r)
        for name in ("user_md", "memory_md")
        for r in mem.revisions(AGENT, name, owner_id=owner)
    ]
    dm = mem.conversation(AGENT, "tg", f"{owner}-dm", owner_id=owner)
    return {
        "rows": rows,
        "revisions": revisions,
        "history": [dataclasses.astuple(m) for m in dm.history()],
        "files": dm.memory_files(),
    }


# -- F1, F3: an owner forgotten, nothing of them left in any file -------------------------


def test_f1_f3_forget_owner_leaves_no_marker_in_any_file_and_the_other_owner_byte_for_byte(
    mem: Memory, model_server: ModelServer, home: Path, backend: Backend
) -> None:
    _plant(mem, model_server, "alice", ALICE)
    _plant(mem, model_server, "bob", BOB)
    bob_before = _snapshot(mem, "bob")
    # her words, and her id too: no row names her afterwards (the audit keeps a keyed hash)
    needles = [*_stems(list(ALICE.values())), b"alice"]
    assert _files_holding(home, _stems(list(BOB.values()))) or backend.url is not None

    report = mem.forget_owner("alice")

    assert report.done, report
    assert report.counts["messages"] >= 60 and report.counts["memory_rows"] >= 3
    assert report.counts["jobs"] == 1 and report.counts["job_runs"] == 1
    assert report.counts["prompt_files"] >= 1 and report.counts["revisions"] >= 3
    assert _files_holding(home, needles) == []
    if backend.url is not None:
        assert _tuples_holding(backend.url, needles) == []
    assert _snapshot(mem, "bob") == bob_before
    # the group chat keeps carol's and bob's words, and names alice nowhere
    group = mem.conversation(AGENT, "tg", "group", owner_id="carol")
    assert [m.owner_id for m in group.history()] == ["carol", "bob", "carol"]
    # nothing of alice is shown: rows, files, history, recall, the audit
    assert [r for r in mem.list_rows(archived=None) if r.owner_id == "alice"] == []
    again = mem.conversation(AGENT, "tg", "alice-dm", owner_id="alice")
    assert again.history() == []
    assert not any(w in "".join(again.memory_files()) for w in ALICE.values()), again.memory_files()
    (audit,) = mem.erasures()
    assert audit.subject is None and "alice" not in json.dumps(audit.as_dict())
    assert audit.state == "done" and audit.counts == report.counts


def test_f8_an_unknown_owner_is_not_found_and_a_pattern_or_an_empty_id_is_refused(
    mem: Memory,
) -> None:
    mem.conversation(AGENT, "tg", "1", owner_id="alice").append_user("hello")
    with pytest.raises(NotFoundError):
        mem.forget_owner("nobody")
    for pattern in ("*", "%", "al%", ""):
        with pytest.raises(InvalidInputError):
            mem.forget_owner(pattern)
    assert mem.erasures() == []
    assert [m.content for m in mem.conversation(AGENT, "tg", "1", owner_id="alice").history()] == [
        "hello"
    ]


# -- F2: less than an owner ----------------------------------------------------------------


def test_f2_forget_memory_deletes_the_row_renders_the_files_again_and_drops_the_revisions(
    mem: Memory, model_server: ModelServer, home: Path
) -> None:
    conv = mem.conversation(AGENT, "tg", "dm", owner_id="alice")
    conv.append_user("I like tea")
    model_server.reply_json(
        {"operations": [_add("drink", "Likes zanzibarteazq"), _add("city", "Lives in Porto")]}
    )
    mem.review(conv)
    row = _row(mem, "alice", "drink")
    assert "zanzibarteazq" in conv.memory_files()[0]

    report = mem.forget_memory(row.id)

    assert report.done and report.counts == {"memory_rows": 1}
    assert mem.get_row(row.id) is None
    user_md, _ = conv.memory_files()
    assert "zanzibarteazq" not in user_md and "Porto" in user_md
    revisions = mem.revisions(AGENT, "user_md", owner_id="alice")
    assert revisions and not any("zanzibarteazq" in r.content for r in revisions)
    if mem.config.storage.url is None:
        assert _files_holding(home, _stems(["zanzibarteazq"])) == []


def test_f2_forget_a_message_and_a_conversation(mem: Memory) -> None:
    conv = mem.conversation(AGENT, "tg", "dm", owner_id="alice")
    kept = conv.append_user("the weather is fine")
    gone = conv.append_user("my code is 4242 zebrasecretzq")
    other = mem.conversation(AGENT, "tg", "other", owner_id="alice")
    other.append_user("another chat")

    assert mem.forget_message(gone.id).counts == {"messages": 1}
    assert [m.id for m in conv.history()] == [kept.id]
    with pytest.raises(NotFoundError):
        mem.forget_message(gone.id)

    report = conv.forget()
    assert report.done and report.counts["messages"] == 1 and report.counts["conversations"] == 1
    assert conv.history() == [] and conv.state() is None
    assert [m.content for m in other.history()] == ["another chat"]


# -- F4: a review in flight writes nothing of the owner ------------------------------------


def test_f4_a_review_that_read_before_the_forget_writes_nothing_after_it(
    mem: Memory, model_server: ModelServer
) -> None:
    conv = mem.conversation(AGENT, "tg", "dm", owner_id="alice")
    conv.append_user("I have a parrot")
    forgot: list[Any] = []
    model_server.reply_json(
        {"operations": [_add("pet", "Has a parrot")]},
        before=lambda: forgot.append(mem.forget_owner("alice")),
    )
    result = mem.review(conv)
    assert forgot and forgot[0].done
    assert result.added == 0
    assert mem.list_rows(archived=None) == []
    assert conv.history() == []


# -- F4: no other process shows the owner, a racing append is whole -----------------------


def test_f4_another_process_on_the_home_shows_nothing_of_the_owner_afterwards(
    mem: Memory, start_memory: StartMemory, config: Config, home: Path
) -> None:
    """A second Memory on the same home (or the same PostgreSQL) stands for another process:
    it held alice's window, files and rows in its caches before the forget."""
    other = start_memory(config, home=home)
    mine = mem.conversation(AGENT, "tg", "dm", owner_id="alice")
    mine.append_user("my locker code is plumbagozq")
    row = json.loads(mem.tools.run(_call("memory_store", key="code", value="plumbagozq"), mine))
    assert "error" not in row
    theirs = other.conversation(AGENT, "tg", "dm", owner_id="alice")
    assert "plumbagozq" in json.dumps(theirs.compose("sys"))
    assert any("plumbagozq" in m.content for m in theirs.history())
    recalled = other.tools.run(_call("memory_recall", query="plumbagozq", source="history"), theirs)
    assert "plumbagozq" in recalled

    assert mem.forget_owner("alice").done

    assert theirs.history() == []
    assert "plumbagozq" not in json.dumps(theirs.compose("sys"))
    assert "plumbagozq" not in "".join(theirs.memory_files())
    recalled = other.tools.run(_call("memory_recall", query="plumbagozq", source="history"), theirs)
    assert "plumbagozq" not in recalled
    assert other.list_rows(agent_id=AGENT, archived=None) == []


def test_f4_an_append_racing_the_forget_is_erased_whole_or_kept_whole(mem: Memory) -> None:
    """Appends of alice on a thread while her erasure runs: afterwards each is either gone,
    or stored with its index entry (the search finds it), never half."""
    conv = mem.conversation(AGENT, "tg", "dm", owner_id="alice")
    for i in range(3 * 500):
        conv.append_user(f"old message {i}")
    stop = threading.Event()
    acked: list[int] = []

    def append() -> None:
        i = 0
        while not stop.is_set():
            acked.append(conv.append_user(f"racing kumquatzq {i}").id)
            i += 1

    thread = threading.Thread(target=append)
    thread.start()
    try:
        report = mem.forget_owner("alice")
    finally:
        stop.set()
        thread.join(30)
    assert report.done and acked
    kept = {m.id for m in conv.history() if "kumquatzq" in m.content}
    assert kept <= set(acked)
    # each message kept has its index entry: the full-text search finds every one of them
    with mem._runtime.read() as reads:
        hits = reads.search_messages("kumquatzq", key=conv.key, limit=len(kept) + 10)
    assert {h.message.id for h in hits} == kept
    assert all("old message" not in m.content for m in conv.history())


# -- the steps' sizes -----------------------------------------------------------------------


def test_f1_a_step_takes_about_its_time_whatever_a_row_costs() -> None:
    """A step's size follows what the steps took: a fixed part (the quickest step) and a
    part per row; the next step gets the rows that fit in STEP_S beside the fixed part,
    never below one nor above the storage's batch (F1: others wait one step at most)."""
    slow = Steps(20, limit=500)  # a row costs STEP_S / 4, a step nothing more
    slow.took(0.001)  # the quickest step: its time is the fixed part; rows seem free: grow
    assert slow.size == 40
    slow.took(0.001 + 40 * STEP_S / 4)
    assert slow.size == 4
    slow.took(0.001 + 4 * STEP_S / 4)
    assert slow.size == 4  # it fits: kept
    dear = Steps(8, limit=500)
    dear.took(0.0)
    dear.took(8 * 10 * STEP_S)  # ten steps' worth per row
    assert dear.size == 1  # never zero
    cheap = Steps(20, limit=500)  # every step the same, whatever its size: round trips
    for _ in range(10):
        cheap.took(2 * STEP_S)
    assert cheap.size == 500
