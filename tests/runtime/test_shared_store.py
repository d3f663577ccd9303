"""Several services on one store (issue 15 item 2, B2): what SQLite's single writer hid,
made explicit in the runtime, and held on both adapters.

A "service" here is what a process wires (``Writer``, ``PromptFiles``, ``Reviewing``) on a
``Storage`` of its own opened on the shared store: on SQLite another ``Database`` on the same
file and home (services on one machine), on PostgreSQL another ``PgDatabase`` on the same
``postgres_db``, each with a home of its own (services on several machines). Two
``fermix.Memory`` on one PostgreSQL URL close the file: the end-to-end view.

- The sweep (M7): every service's sweep claims due conversations in one write, never one
  another service claimed; a review takes the sweep's claim with its token (E2); a claim
  no review takes goes back at once.
- Prompt files (P1, P2): on PostgreSQL a compose serves the pair's current revisions, so a
  memory written through one service shows in another's USER.md at once; concurrent
  rebuilds through two services end on the newest rows, revisions numbered with no gap and
  never going back to older rows.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import apsw
import psycopg
import pytest
from factories import Clock, StartMemory, config_for, fact
from model_server import ModelServer
from storage_fixtures import Backend, Store

from fermix.api import Memory
from fermix.config import Config, MemoryConfig, ModelConfig, StorageConfig
from fermix.core import review
from fermix.core.review import Skip
from fermix.core.review_answer import NOTHING_TO_SAVE
from fermix.home import Home
from fermix.model import ConversationKey, NewMessage
from fermix.runtime.prompt_files import PromptFiles, disk, render_pair
from fermix.runtime.reviewing import Reviewing
from fermix.runtime.writer import Writer
from fermix.storage.sqlite.connection import transaction

MODEL = "openai/reviewer"
AGENT = "agent"


@dataclass
class Service:
    """One service's runtime objects on its own connection to the shared store."""

    home: Home
    db: Store
    writer: Writer
    files: PromptFiles
    reviewing: Reviewing

    def say(self, key: ConversationKey, text: str, role: str = "user") -> int:
        new = NewMessage(key, role, text, owner_id="alice", sender="alice")
        return self.writer.append(new, trust="operator").id


Services = Callable[..., Service]


@pytest.fixture
def services(
    backend: Backend, tmp_path: Path, model_server: ModelServer, clock: Clock
) -> Iterator[Services]:
    """``services(config=None)`` wires one more service on the backend's store: the first on
    ``backend.db``, each later one on a store instance of its own. SQLite's services share
    one home (the file lives there); PostgreSQL's each have their own."""
    made: list[Service] = []

    def make(config: Config | None = None) -> Service:
        db = backend.db if not made else backend.open()
        name = "home" if backend.name == "sqlite" else f"home{len(made)}"
        home = Home(tmp_path / name)
        prompt_files = PromptFiles(home, db)
        writer = Writer(db, prompt_files)
        config = config or config_for(model_server, primary=MODEL, memory=MemoryConfig())
        made.append(
            Service(home, db, writer, prompt_files, Reviewing(config, db, writer, clock=clock))
        )
        return made[-1]

    yield make
    for service in made:
        service.files.settle()


def _key(n: int) -> ConversationKey:
    return ConversationKey(AGENT, "tg", f"chat{n}")


# -- the sweep (M7, E2) -------------------------------------------------------------------


def test_m7_e2_two_services_sweeping_at_once_claim_and_review_each_due_conversation_once(
    services: Services, model_server: ModelServer
) -> None:
    a, b = services(), services()
    keys = [_key(n) for n in range(8)]
    for key in keys:
        a.say(key, f"a fact for {key.chat_id}")
        a.say(key, "noted", role="assistant")
    claimed: dict[str, list[ConversationKey]] = {"a": [], "b": []}
    barrier = threading.Barrier(2, timeout=30)

    def sweep(name: str, service: Service) -> None:
        barrier.wait()
        while got := service.reviewing.claim_due(3):
            claimed[name] += got

    threads = [threading.Thread(target=sweep, args=item) for item in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(claimed["a"] + claimed["b"]) == keys  # each once, none left
    assert a.reviewing.due() == b.reviewing.due() == []
    theirs = claimed["b"][0] if claimed["b"] else claimed["a"][0]
    other = a if theirs in claimed["b"] else b
    # a review in the other service respects the sweep's claim (E2)
    assert other.reviewing.review(theirs).skip is Skip.CLAIMED
    for _ in keys:
        model_server.reply(NOTHING_TO_SAVE)
    results = [a.reviewing.review(k) for k in claimed["a"]]
    results += [b.reviewing.review(k) for k in claimed["b"]]
    assert [r.status for r in results] == ["nothing"] * len(keys)
    assert len(model_server.requests) == len(keys)
    with a.db.read() as reads:
        states = {s.key: s for s in reads.conversations(agent_id=AGENT)}
        newest = {k: reads.newest_user_message_id(k) for k in keys}
    assert all(states[k].last_reviewed_message_id == newest[k] for k in keys)
    assert all(states[k].review_claim_token is None for k in keys)


def test_m7_a_claim_the_sweep_took_and_no_review_took_goes_back_to_any_service(
    services: Services,
) -> None:
    a, b = services(), services()
    a.say(_key(1), "hello")
    assert a.reviewing.claim_due(5) == [_key(1)]
    assert b.reviewing.claim_due(5) == []
    assert a.reviewing.release(_key(1))
    assert not a.reviewing.release(_key(1))  # given back once
    assert b.reviewing.claim_due(5) == [_key(1)]


def _delete_from_outside(backend: Backend, message_id: int) -> None:
    """SQL from outside fermix deletes a message (on the store's own connection)."""
    if backend.name == "sqlite":
        conn = apsw.Connection(str(backend.db.path))
        with transaction(conn):
            conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
        conn.close()
        return
    with psycopg.connect(backend.db.url, autocommit=True) as pg:
        pg.execute("DELETE FROM messages WHERE id = %s", (message_id,))


def test_m5_e2_a_swept_conversation_with_nothing_left_to_review_gives_its_claim_back(
    services: Services, backend: Backend, model_server: ModelServer
) -> None:
    """The sweep claimed it, then its only message was deleted from outside: the review the
    sweep dispatched finds nothing, and gives the claim back at once (not after
    ``CLAIM_TTL_MS``), the conversation no longer due in any service."""
    a, b = services(), services()
    gone = a.say(_key(1), "deleted later")
    assert a.reviewing.claim_due(5) == [_key(1)]
    _delete_from_outside(backend, gone)
    assert a.reviewing.review(_key(1)).skip is Skip.NO_NEW_MESSAGES
    with b.db.read() as reads:
        state = reads.conversation(_key(1))
    assert state is not None and state.review_claim_token is None
    assert b.reviewing.due() == [] and b.reviewing.claim_due(5) == []
    assert model_server.requests == []


def test_m8_without_a_model_the_sweep_claims_nothing_but_lists_what_is_due(
    services: Services, model_server: ModelServer
) -> None:
    config = config_for(model_server, primary=MODEL, memory=MemoryConfig())
    a = services(config)
    a.reviewing.reconfigure(dataclasses.replace(config, model=ModelConfig()))  # no model
    assert a.reviewing.route.primary is None
    a.say(_key(1), "hello")
    assert a.reviewing.due() == [_key(1)]
    assert a.reviewing.claim_due(5) == []
    assert a.reviewing.review(_key(1)).skip is Skip.NO_MODEL


def test_m7_a_fractional_review_interval_is_due_exactly_when_the_gate_says(
    services: Services, model_server: ModelServer, clock: Clock
) -> None:
    hours = 2 / 7  # 1,028,571.43 ms: the sweep counts whole milliseconds
    a = services(config_for(model_server, primary=MODEL, memory=MemoryConfig(
        review_interval_hours=hours)))  # fmt: skip
    a.say(_key(1), "first")
    model_server.reply(NOTHING_TO_SAVE)
    assert a.reviewing.review(_key(1)).status == "nothing"
    a.say(_key(1), "second")
    for step in (1_028_571, 1):
        clock.advance(step)
        with a.db.read() as reads:
            state = reads.conversation(_key(1))
        gate = review.gate(
            state,
            now_ms=clock.now,
            interval_hours=hours,
            backoff_ms=0,
            newest_user_message_id=10**12,
        )
        assert (a.reviewing.due() == [_key(1)]) == (gate is None) == (step == 1)


@pytest.fixture
def sweeping_memory(
    backend: Backend, start_memory: StartMemory, model_server: ModelServer, tmp_path: Path
) -> Callable[[], Memory]:
    """A running Memory with one Reviewer on the backend's store (PostgreSQL: by the storage
    URL setting, B1)."""
    url = getattr(backend.db, "url", None)
    config = config_for(
        model_server, primary=MODEL, memory=MemoryConfig(review_workers=1, sweep_interval_s=0)
    )
    if url is not None:
        config = dataclasses.replace(config, storage=StorageConfig(url=url))

    def start() -> Memory:
        return start_memory(config, home=tmp_path / "memory-home")

    return start


def test_m7_the_tick_gives_back_a_claim_whose_conversation_has_a_review_pending(
    sweeping_memory: Callable[[], Memory], model_server: ModelServer
) -> None:
    """One Reviewer, busy with a review that hangs; a turn's review of another conversation
    waits behind it. The sweep claims that conversation, cannot dispatch it (a review of it
    is pending here), and gives the claim back at once, so the pending review runs."""
    memory = sweeping_memory()
    release = threading.Event()
    model_server.hang(release)
    busy = memory.conversation(AGENT, "tg", "busy", owner_id="alice")
    busy.append_user("this review hangs")
    try:
        assert memory.tick() == 1
        assert model_server.wait_for_requests(1, timeout=30)
        waiting = memory.conversation(AGENT, "tg", "waiting", owner_id="bob")
        waiting.append_user("I play the cello")
        waiting.commit("Nice!")  # its review queues behind the hanging one
        assert memory.tick() == 0
        state = memory._runtime.state(waiting.key)
        assert state is not None and state.review_claim_token is None
        model_server.reply(NOTHING_TO_SAVE)  # for the review that waited
    finally:
        release.set()
    assert model_server.wait_for_requests(2, timeout=30)
    assert memory.review(waiting, force=False).skip is Skip.UNDER_INTERVAL  # reviewed once


# -- prompt files (P1, P2, B2) ------------------------------------------------------------


def _user_md(service: Service, owner: str = "alice") -> str:
    return service.files.texts(AGENT, owner)[0]


def test_b2_p1_a_memory_written_through_one_service_shows_in_another_s_user_md_at_once(
    services: Services,
) -> None:
    a, b = services(), services()
    assert "Porto" not in _user_md(b)
    a.writer.write_rows(fact("identity", "city", "Lives in Porto", owner_id="alice"), label="w")
    assert "Lives in Porto" in _user_md(b)
    a.writer.write_rows(fact("identity", "city", "Lives in Lisbon", owner_id="alice"), label="w")
    text = _user_md(b)
    assert "Lives in Lisbon" in text and "Porto" not in text
    # the files on disk follow what is served, in each home, off the compose's path
    b.files.settle()
    assert disk.paths(b.home, AGENT, "alice")[0].read_text() == text
    # a rollback through B is what A composes next (P2)
    rolled = b.files.rollback(AGENT, "user_md", 1, owner_id="alice")
    assert "Porto" in rolled.content and _user_md(a) == rolled.content


def test_b2_a_new_owner_s_files_render_the_agent_s_shared_rows_in_any_service(
    services: Services,
) -> None:
    a, b = services(), services()
    a.db.write(fact("context", "office", "The office opens at nine"))  # no rebuild yet
    assert "opens at nine" in b.files.texts(AGENT, "guest")[1]
    b.files.settle()  # its rebuild was queued, off the compose's path
    with a.db.read() as reads:
        current = reads.current_revision(AGENT, "memory_md", owner_id="guest")
    assert current is not None and "opens at nine" in current.content


def test_b2_on_postgres_the_stored_revision_is_the_file_and_the_disk_only_a_cache(
    services: Services, backend: Backend
) -> None:
    if backend.name == "sqlite":
        pytest.skip("on SQLite the files on disk are the prompt files (one machine)")
    a, b = services(), services()
    a.writer.write_rows(fact("identity", "name", "Ana", owner_id="alice"), label="w")
    served = _user_md(b)
    b.files.settle()  # the file on disk follows on the background thread
    path = disk.paths(b.home, AGENT, "alice")[0]
    path.write_text("edited by hand")
    assert _user_md(b) == served  # served from the store, not the file
    assert b.files.stale() == []  # a file on disk that differs is no lag of the store
    path.unlink()
    assert b.files.stale() == []


_STEP = re.compile(r"w(\d) step (\d+)")


def test_b2_concurrent_rebuilds_through_two_services_end_on_the_newest_rows_gapless(
    services: Services,
) -> None:
    """Four writers, two per service, each moving its own row forward and rebuilding: every
    revision renders each row at a step no older than the revision before showed, the
    numbers run 1..N with no gap, and the last is the rendering of the rows as they end."""
    a, b = services(), services()
    steps = 6
    barrier = threading.Barrier(4, timeout=30)
    errors: list[BaseException] = []

    def writer(w: int, service: Service) -> None:
        try:
            barrier.wait()
            for i in range(1, steps + 1):
                unit = fact("identity", f"counter_w{w}", f"w{w} step {i}", owner_id="alice")
                result = service.writer.write_rows(unit, label=f"w{w}")
                assert result.error is None
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w, (a, b)[w % 2])) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    with a.db.read() as reads:
        history = list(reversed(reads.revisions(AGENT, "user_md", owner_id="alice")))
        final = render_pair(reads, AGENT, "alice").user_md
    assert [r.revision for r in history] == list(range(1, len(history) + 1))
    seen = {w: 0 for w in range(4)}
    for revision in history:
        shown = {int(w): int(i) for w, i in _STEP.findall(revision.content)}
        assert all(shown.get(w, 0) >= seen[w] for w in seen), revision.revision
        seen.update(shown)
    assert seen == {w: steps for w in range(4)}
    assert history[-1].content == final == _user_md(a) == _user_md(b)


# -- two Memory objects on one PostgreSQL URL (B1, B2) ------------------------------------


def test_b2_two_memories_on_one_postgres_url_compose_the_same_memory(
    postgres_db: str, start_memory: StartMemory, model_server: ModelServer, tmp_path: Path
) -> None:
    base = config_for(model_server, primary=MODEL, memory=MemoryConfig(sweep_interval_s=0))
    config = dataclasses.replace(base, storage=StorageConfig(url=postgres_db))
    one = start_memory(config, home=tmp_path / "one")
    two = start_memory(config, home=tmp_path / "two")
    chat = one.conversation(AGENT, "tg", "1", owner_id="alice")
    chat.append_user("I'm Ana and I teach piano")
    model_server.reply_json(
        {
            "operations": [
                {"op": "add", "category": "identity", "key": "job", "value": "Teaches piano"}
            ]
        }
    )
    assert one.review(chat).status == "applied"
    same = two.conversation(AGENT, "tg", "1", owner_id="alice")
    composed = same.compose("You are helpful.")
    assert "Teaches piano" in composed[1]["content"]
    assert composed[1:] == chat.compose("You are helpful.")[1:]
    assert [m.content for m in same.history()] == ["I'm Ana and I teach piano"]
