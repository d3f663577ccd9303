"""Three fermix services as separate processes on one PostgreSQL: one memory (B2, N3, N8).

Each service is ``fermix server start`` on a home of its own, pointed at the test's
database (``postgres_db``) by ``FERMIX_STORAGE_URL``, its wall clock off by a second and a
half from the others' as on other machines (tests/multi_service.py); the load is aiohttp
clients in this process, as bots would be. What one process on SQLite gave for free must
hold across processes here:

- an append acknowledged through one service is in every later read through any other, a
  window moved through one (compaction, ``/new``) is moved through all, and one
  conversation's messages are in one order everywhere: the order they were acknowledged
  in, whatever the services' clocks say (B2, A1, K1, K4);
- a conversation is reviewed once per backlog whichever services sweep it or are asked,
  never by two at once, and its rows show in the same USER.md, the stored revision,
  through every service (B2, M5, M7, P2);
- a SIGKILL of one service under load loses no acknowledged append, and a client's retry
  on another service with the same key stores nothing twice (N3, N8);
- the hostile catalogue sent through one service while the others serve traffic gets
  typed 4xx answers and changes nothing in the database (N8).

``FERMIX_SOAK_KILLS`` sets the kills of the SIGKILL test (1 by default).
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hostile_data import NUMBERS, TEXTS
from model_server import ModelServer
from multi_service import Fleet, ReviewModel, Snapshots, launch_fleet, service_config
from server_fixtures import AGENT
from test_http_hostile import Http

from fermix.model import USER_MD, ConversationKey
from fermix.wire import decode_handle, encode_handle

DEADLINE_S = 60.0
"""The longest any condition below is polled for."""
POLL_S = 0.05
"""Between looks at another process's state: not a wait on a thread of ours."""

StartFleet = Callable[..., Fleet]


@pytest.fixture
def start_fleet(tmp_path: Path, postgres_db: str) -> Iterator[StartFleet]:
    """``start_fleet(config)``: three services on the test's database, stopped (SIGTERM)
    after the test; each must then exit 0."""
    started: list[Fleet] = []

    def start(config: str) -> Fleet:
        fleet = launch_fleet(tmp_path, postgres_db, config)
        started.append(fleet)
        return fleet

    yield start
    for fleet in started:
        codes = fleet.stop()
        assert codes == [0] * len(codes), fleet.logs()


def _handle(channel: str, chat: str, owner: str = "ana", agent: str = AGENT) -> str:
    return encode_handle(ConversationKey(agent, channel, chat, ""), owner, "guest")


def _session(token: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=30),
        connector=aiohttp.TCPConnector(limit=64),
    )


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with session.request(method, url, json=body) as response:
        return response.status, await response.json()


async def _append(
    session: aiohttp.ClientSession, base: str, handle: str, text: str, **fields: Any
) -> dict[str, Any]:
    body = {"role": "user", "text": text, **fields}
    status, stored = await _call(
        session, "POST", f"{base}/v1/conversations/{handle}/messages", body
    )
    assert status in (200, 201), stored
    return dict(stored)


async def _history(session: aiohttp.ClientSession, base: str, handle: str) -> list[tuple[int, str]]:
    status, body = await _call(session, "GET", f"{base}/v1/conversations/{handle}/messages")
    assert status == 200, body
    return [(m["id"], m["content"]) for m in body["messages"]]


def _poll(condition: Callable[[], bool], what: str, fleet: Fleet) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {DEADLINE_S} s\n{fleet.logs()}")
        time.sleep(POLL_S)


# -- 1. fresh reads across services -----------------------------------------------------------


def test_b2_an_append_through_one_service_is_read_at_once_through_the_others(
    start_fleet: StartFleet, model_server: ModelServer
) -> None:
    """B2, A1: one token works on every service (the tokens table is shared); each append,
    through A, B or C in turn, is in the history and the composed prompt read through the
    two others right after its answer, in the order of the answers, though B's clock is
    ahead of A's and C's behind."""
    fleet = start_fleet(service_config(model_server.url))
    handle = _handle("fresh", "solo")

    async def run() -> None:
        async with _session(fleet.host_token) as session:
            texts: list[str] = []
            for n in range(15):
                writer, *readers = [fleet.urls[(n + i) % 3] for i in range(3)]
                stored = await _append(session, writer, handle, f"turn {n} via {n % 3}")
                texts.append(stored["content"])
                histories = await asyncio.gather(*(_history(session, r, handle) for r in readers))
                for history in histories:
                    assert [text for _, text in history] == texts
                composed = await asyncio.gather(
                    *(
                        _call(
                            session,
                            "POST",
                            f"{r}/v1/conversations/{handle}/compose",
                            {"system": "s"},
                        )
                        for r in readers
                    )
                )
                for status, body in composed:
                    assert status == 200, body
                    contents = [m["content"] for m in body["messages"]]
                    assert [c for c in contents if c in texts] == texts

    asyncio.run(run())


def test_b2_concurrent_appends_through_three_services_are_in_one_order_everywhere(
    start_fleet: StartFleet, model_server: ModelServer
) -> None:
    """B2, A1, N8: six clients append to one conversation through the three services in
    turn; after each answer the client reads through another service, and every append
    acknowledged before that read began is there. At the end the three histories are one
    list: each append once, in id order, each client's in the order it sent them."""
    fleet = start_fleet(service_config(model_server.url))
    handle = _handle("fresh", "shared")
    clients, rounds = 6, 12
    acked: set[int] = set()

    async def client(session: aiohttp.ClientSession, c: int) -> None:
        for n in range(rounds):
            stored = await _append(session, fleet.urls[(c + n) % 3], handle, f"c{c} #{n}")
            acked.add(stored["id"])
            required = set(acked)  # acknowledged before the read below starts
            seen = {i for i, _ in await _history(session, fleet.urls[(c + n + 1) % 3], handle)}
            assert required <= seen, f"missing through another service: {required - seen}"

    async def run() -> list[list[tuple[int, str]]]:
        async with _session(fleet.host_token) as session:
            await asyncio.gather(*(client(session, c) for c in range(clients)))
            return list(
                await asyncio.gather(*(_history(session, url, handle) for url in fleet.urls))
            )

    first, *others = asyncio.run(run())
    assert all(history == first for history in others)
    ids = [i for i, _ in first]
    assert ids == sorted(ids) and set(ids) == acked
    texts = [text for _, text in first]
    assert sorted(texts) == sorted(f"c{c} #{n}" for c in range(clients) for n in range(rounds))
    for c in range(clients):
        assert [t for t in texts if t.startswith(f"c{c} ")] == [f"c{c} #{n}" for n in range(rounds)]


def test_b2_k1_k4_a_window_moved_through_one_service_is_moved_through_every_other(
    start_fleet: StartFleet, model_server: ModelServer
) -> None:
    """B2, K1, K4, A1: every service has read (and cached) the window; a compaction through
    A, then an operator's ``/new`` through B, move it: the next read through each service
    shows the window moved, with no reload. A revoked token is refused by every service at
    once."""
    fleet = start_fleet(service_config(model_server.url, context_window=2_000))
    handle = encode_handle(ConversationKey(AGENT, "moved", "chat", ""), "ana", "operator")

    async def run() -> None:
        async with _session(fleet.operator_token) as session:
            for n in range(40):
                base = fleet.urls[n % 3]
                await _append(session, base, handle, f"marker{n:03d}u I ask about the harbour.")
                await _append(
                    session, base, handle, f"marker{n:03d}a It is busy in May.", role="assistant"
                )
            first = await asyncio.gather(*(_history(session, u, handle) for u in fleet.urls))
            assert all(len(history) == 80 for history in first)

            model_server.reply("Ana asked about the harbour many times.")
            status, body = await _call(
                session,
                "POST",
                f"{fleet.urls[0]}/v1/conversations/{handle}/compact",
                {"force": True},
            )
            assert status == 200 and body["status"] == "compacted", body
            moved = await asyncio.gather(*(_history(session, u, handle) for u in fleet.urls))
            assert moved[0] == moved[1] == moved[2] and len(moved[0]) < 80
            assert moved[0][0][1] == "Ana asked about the harbour many times."
            assert moved[0][-1] == first[0][-1]

            status, body = await _call(
                session,
                "POST",
                f"{fleet.urls[1]}/v1/conversations/{handle}/command",
                {"text": "/new"},
            )
            assert status == 200 and body["reply"], body
            cleared = await asyncio.gather(*(_history(session, u, handle) for u in fleet.urls))
            assert cleared == [[], [], []]
            stored = await _append(session, fleet.urls[2], handle, "a fresh start")
            fresh = await asyncio.gather(*(_history(session, u, handle) for u in fleet.urls))
            assert fresh == [[(stored["id"], "a fresh start")]] * 3

    asyncio.run(run())

    with fleet.tokens() as tokens:
        (host,) = [t for t in tokens.list() if not t.operator]
        tokens.revoke(host.id)

    async def refused() -> list[int]:
        async with _session(fleet.host_token) as session:
            answers = await asyncio.gather(
                *(
                    _call(session, "GET", f"{u}/v1/conversations/{handle}/messages")
                    for u in fleet.urls
                )
            )
            return [status for status, _ in answers]

    assert asyncio.run(refused()) == [401, 401, 401]


# -- 2. one review per conversation across services -------------------------------------------

REVIEWED = 18
"""Conversations of the review test, one guest owner each."""


@pytest.fixture
def review_model() -> Iterator[ReviewModel]:
    """The loopback model of the review test, counting reviews per conversation."""
    server = ReviewModel()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _files(fleet: Fleet, handle: str) -> list[tuple[int, Any]]:
    async def run() -> list[tuple[int, Any]]:
        async with _session(fleet.host_token) as session:
            return list(
                await asyncio.gather(
                    *(
                        _call(session, "GET", f"{u}/v1/conversations/{handle}/files")
                        for u in fleet.urls
                    )
                )
            )

    return asyncio.run(run())


def _stored_user_md(fleet: Fleet, owner: str) -> str | None:
    with fleet.store() as db, db.read() as reads:
        revision = reads.current_revision(AGENT, USER_MD, owner_id=owner)
    return None if revision is None else revision.content


def _settled(fleet: Fleet, keys: list[ConversationKey]) -> bool:
    """Whether no review is due, claimed or under way for ``keys``: every user message
    reviewed, no claim held (so no service will review them again)."""
    with fleet.store() as db, db.read() as reads:
        for key in keys:
            state = reads.conversation(key)
            newest = reads.newest_user_message_id(key)
            if state is None or state.last_reviewed_message_id < newest:
                return False
            if state.review_claim_token is not None:
                return False
    return True


@pytest.mark.slow
def test_m7_b2_each_backlog_is_reviewed_once_across_three_sweeping_services(
    start_fleet: StartFleet, review_model: ReviewModel
) -> None:
    """M5, M7, B2, P2: three services sweep every 0.1 s and, at the same time, each is
    asked to review every conversation: every backlog gets exactly one model call, never
    two at once for one conversation. A second backlog, reviewed by force through all
    three services at once, gets one more, and one answer only says it applied. The rows
    of each review show in one USER.md, the stored revision, through every service."""
    fleet = start_fleet(
        service_config(review_model.url, sweep_interval_s=0.1, review_interval_hours=24)
    )
    keys = [ConversationKey(AGENT, "review", f"chat-{i}", "") for i in range(REVIEWED)]
    handles = [_handle("review", f"chat-{i}", owner=f"guest{i}") for i in range(REVIEWED)]

    async def first_backlog(session: aiohttp.ClientSession, i: int) -> None:
        base = fleet.urls[i % 3]
        await _append(session, base, handles[i], "Hello, what can you do?", role="assistant")
        await _append(session, base, handles[i], f"conv-{i}: I live in city=Porto{i}")
        # Asked through every service while the sweeps find it due too.
        asked = await asyncio.gather(
            *(
                _call(
                    session, "POST", f"{u}/v1/conversations/{handles[i]}/review", {"force": False}
                )
                for u in fleet.urls
            )
        )
        assert all(status == 200 for status, _ in asked), asked

    async def second_backlog(session: aiohttp.ClientSession, i: int) -> list[Any]:
        await _append(session, fleet.urls[(i + 1) % 3], handles[i], f"conv-{i}: I drink=tea{i}")
        asked = await asyncio.gather(
            *(
                _call(session, "POST", f"{u}/v1/conversations/{handles[i]}/review", {"force": True})
                for u in fleet.urls
            )
        )
        assert all(status == 200 for status, _ in asked), asked
        return [body for _, body in asked]

    async def phase(work: Callable[..., Any], indexes: range) -> list[Any]:
        async with _session(fleet.host_token) as session:
            return list(await asyncio.gather(*(work(session, i) for i in indexes)))

    asyncio.run(phase(first_backlog, range(REVIEWED)))
    _poll(lambda: _settled(fleet, keys), "every first backlog reviewed", fleet)
    assert review_model.mixed == []
    assert dict(review_model.reviews) == dict.fromkeys(range(REVIEWED), 1)

    second = range(0, REVIEWED, 2)
    answers = asyncio.run(phase(second_backlog, second))
    for bodies in answers:
        # One applies; each other one found the claim held ("skipped"), or claimed after
        # the first had finished and found nothing left to review ("nothing").
        statuses = sorted(b["status"] for b in bodies)
        assert statuses[0] == "applied" and set(statuses[1:]) <= {"nothing", "skipped"}, bodies
    _poll(lambda: _settled(fleet, keys), "every second backlog reviewed", fleet)
    assert dict(review_model.reviews) == {i: 1 + (i in second) for i in range(REVIEWED)}
    assert set(review_model.most_at_once.values()) == {1}

    for i in range(REVIEWED):
        stored = _stored_user_md(fleet, f"guest{i}")
        assert stored is not None and f"Porto{i}" in stored
        assert (f"tea{i}" in stored) == (i in second), stored
        served = _files(fleet, handles[i])
        assert [status for status, _ in served] == [200] * 3, served
        assert [body["user_md"] for _, body in served] == [stored] * 3


# -- 3. SIGKILL under load -------------------------------------------------------------------

LOADERS = 24
LOADED = 144
"""Conversations of the load, each fed by one client, in order."""
KILL_EVERY = 300
"""Acknowledged appends between two kills (and after the last restart)."""


@dataclass
class Loader:
    """One client of the load: its conversations, what was acknowledged, by which service."""

    index: int
    handles: list[str]
    acked: dict[str, list[str]] = field(default_factory=dict)
    """handle -> the texts acknowledged, in order."""
    retries: int = 0
    replayed: int = 0


@dataclass
class Load:
    """Every client's progress, and which service acknowledged how many appends."""

    loaders: list[Loader]
    by_service: list[int] = field(default_factory=lambda: [0, 0, 0])

    @property
    def acked(self) -> int:
        return sum(self.by_service)


async def _append_somewhere(
    session: aiohttp.ClientSession, fleet: Fleet, load: Load, loader: Loader, handle: str, n: int
) -> None:
    """Append the loader's next text to ``handle`` through one service, and on a failure
    (refused, reset, cut off: the service was killed) through the next one, with the same
    client key, until one acknowledges it (N3)."""
    done = loader.acked.setdefault(handle, [])
    text = f"l{loader.index} {handle[-8:]} #{len(done)}"
    body = {"role": "user", "text": text, "client_key": f"l{loader.index}-{len(done)}"}
    service = (loader.index + n) % 3
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            async with session.post(
                f"{fleet.urls[service]}/v1/conversations/{handle}/messages", json=body
            ) as response:
                if response.status in (200, 201):
                    stored = await response.json()
                    assert stored["content"] == text, stored
                    loader.replayed += response.status == 200
                    load.by_service[service] += 1
                    done.append(text)
                    return
                assert response.status == 503, f"{response.status}: {await response.text()}"
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            pass  # the service is down or went down mid-answer: another one, same key
        loader.retries += 1
        assert time.monotonic() < deadline, f"{text} was never acknowledged"
        service = (service + 1) % 3
        await asyncio.sleep(0.01)  # a client's back-off before its retry


async def _load(fleet: Fleet, load: Load, loader: Loader, stop: asyncio.Event) -> None:
    async with _session(fleet.host_token) as session:
        for n in itertools.count():
            if stop.is_set():
                return
            for handle in loader.handles:
                await _append_somewhere(session, fleet, load, loader, handle, n)


async def _acked(load: Load, count: int, what: str, *, service: int | None = None) -> None:
    """Wait until ``count`` appends are acknowledged (through ``service`` at least once more
    when given), polling the clients' counts with a deadline."""
    served = 0 if service is None else load.by_service[service]
    deadline = time.monotonic() + DEADLINE_S
    while load.acked < count or (service is not None and load.by_service[service] <= served):
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S} s"
        await asyncio.sleep(POLL_S)


@pytest.mark.slow
def test_n8_sigkill_of_one_service_under_load_loses_no_acknowledged_append(
    start_fleet: StartFleet, model_server: ModelServer
) -> None:
    """N3, N8, B2: 24 clients append through the three services in turn, each to its own
    conversations; one service is SIGKILLed mid-load and started again (``FERMIX_SOAK_KILLS``
    times), and a client whose append failed sends it to the next service with the same
    key. Every acknowledged append is stored exactly once, each conversation in its
    client's order; the services' embedders, taking rows committed out of id order by
    three processes, leave no message without its vector."""
    fleet = start_fleet(service_config(model_server.url, embedding=True))
    kills = int(os.environ.get("FERMIX_SOAK_KILLS", "1"))
    chats = [f"chat-{c}" for c in range(LOADED)]
    load = Load(
        [Loader(i, [_handle("load", chat) for chat in chats[i::LOADERS]]) for i in range(LOADERS)]
    )

    async def soak() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_load(fleet, load, one, stop)) for one in load.loaders]
        loop = asyncio.get_running_loop()
        try:
            for k in range(kills):
                victim = fleet[k % 3]
                await _acked(load, load.acked + KILL_EVERY, "load before the kill")
                await loop.run_in_executor(None, victim.kill)
                await loop.run_in_executor(None, victim.start)
            await _acked(load, load.acked + KILL_EVERY, "load after the last restart")
            restarted = (kills - 1) % 3
            await _acked(
                load, load.acked + 1, "load through the restarted service", service=restarted
            )
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(soak())
    retried = sum(loader.retries for loader in load.loaders)
    assert retried > 0, "no client saw the kill: the test tested nothing"
    checked = 0
    with fleet.store() as db, db.read() as reads:
        for loader in load.loaders:
            for handle, texts in loader.acked.items():
                key = decode_handle(handle)[0]
                stored = [m.content for m in reads.messages(key)]
                assert stored == texts, f"{key.chat_id}: stored {stored[-3:]}, acked {texts[-3:]}"
                checked += len(texts)
    assert checked == load.acked
    print(
        json.dumps(
            {
                "kills": kills,
                "acknowledged": checked,
                "retries": retried,
                "replayed": sum(loader.replayed for loader in load.loaders),
            }
        )
    )

    def covered() -> bool:
        with fleet.store() as db, db.read() as reads:
            coverage = reads.vector_coverage()
        return coverage.message_vectors == coverage.messages == checked

    _poll(covered, "a vector for every message", fleet)


# -- 4. the hostile catalogue through one service --------------------------------------------

HOSTILE = "intruder"
"""The agent the hostile requests act for: its rows are compared, the others' traffic is not."""


class Traffic:
    """Normal appends and reads of agent ``assistant`` through some services, on a thread of
    its own, until :meth:`stop`; what each service acknowledged, and any failure."""

    def __init__(self, fleet: Fleet, services: list[int]) -> None:
        self.fleet, self.services = fleet, services
        self.acked: dict[str, list[str]] = {}
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="normal-traffic")

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._clients())
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which raises it
            self.failure = exc

    async def _clients(self) -> None:
        async with _session(self.fleet.host_token) as session:
            await asyncio.gather(*(self._client(session, c) for c in range(4)))

    async def _client(self, session: aiohttp.ClientSession, c: int) -> None:
        handle = _handle("normal", f"chat-{c}")
        texts = self.acked.setdefault(handle, [])
        for n in itertools.count():
            if self._stop.is_set():
                return
            base = self.fleet.urls[self.services[n % len(self.services)]]
            stored = await _append(session, base, handle, f"normal {c} #{n}")
            texts.append(stored["content"])
            assert [t for _, t in await _history(session, base, handle)] == texts


_UNTYPED = ("Invalid HTTP request", "refused while sending")
"""What :class:`Http` answers itself when the HTTP layer refused a request before fermix
saw it: a request line it cannot parse, a body cut off past the size limit."""


def _typed(status: int, body: Any) -> None:
    """A 2xx, or a typed JSON error: never a 5xx, never a traceback (N8)."""
    assert status < 500, body
    if status >= 400:
        assert set(body) == {"error"}, body
        error = body["error"]
        assert error["message"] and "Traceback" not in json.dumps(body), body
        assert error.get("type") or error["message"].startswith(_UNTYPED), body


def _without(snapshot: dict[str, Any], *tables: str) -> dict[str, Any]:
    return {t: rows for t, rows in snapshot.items() if t not in tables}


@pytest.mark.slow
def test_n8_the_hostile_catalogue_through_one_service_changes_nothing_on_any(
    start_fleet: StartFleet, model_server: ModelServer, postgres_db: str
) -> None:
    """N8, B2: every text and number of the catalogue goes through service B, in every
    field a host fills, while A and C serve normal appends and reads of another agent.
    Every answer is a 2xx or a typed 4xx; a refused request changes no row of the shared
    database (every table, compared row by row), an accepted append adds its one message,
    verbatim, read back the same through A and C; the normal traffic loses nothing."""
    fleet = start_fleet(service_config(model_server.url))
    token = fleet.create_token([HOSTILE])
    handle = _handle("hostile", "chat", agent=HOSTILE)
    snapshots = Snapshots(postgres_db, HOSTILE)
    api = Http(fleet[1].url, token)
    path = f"/v1/conversations/{handle}/messages"
    try:
        with Traffic(fleet, [0, 2]) as traffic:
            status, body = api.call("POST", path, {"role": "user", "text": "seed"})
            assert status == 201, body
            for text in TEXTS:
                before = snapshots.take()
                status, body = api.call("POST", path, {"role": "user", "text": text})
                _typed(status, body)
                after = snapshots.take()
                if status == 201:
                    assert body["content"] == text  # stored verbatim, once
                    added = [row for row in after["messages"] if row not in before["messages"]]
                    assert len(added) == 1
                    assert _without(after, "messages", "conversations") == _without(
                        before, "messages", "conversations"
                    )
                else:
                    assert after == before
                for name in ("role", "owner_id", "sender", "kind", "trust", "client_key"):
                    before = snapshots.take()
                    request = {"role": "user", "text": "fine", name: text}
                    status, body = api.call("POST", path, request)
                    _typed(status, body)
                    if status >= 400:
                        assert snapshots.take() == before, name
                before = snapshots.take()
                quoted = urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")
                for query in (
                    f"/v1/conversations/{quoted}/messages",
                    f"/v1/agents/{HOSTILE}/memories/search?q={quoted}",
                ):
                    try:
                        status, body = api.call("GET", query)
                    except (http.client.HTTPException, OSError):
                        continue  # a path the HTTP layer itself refuses to carry
                    _typed(status, body)
                assert snapshots.take() == before
            for number in NUMBERS:
                before = snapshots.take()
                requests: list[tuple[str, str, Any]] = [
                    ("GET", f"{path}?limit={number}", None),
                    (
                        "POST",
                        f"/v1/conversations/{handle}/compose",
                        {"system": "s", "limit": number},
                    ),
                    (
                        "POST",
                        path,
                        {
                            "role": "user",
                            "text": "x",
                            "peak_prompt_tokens": number,
                            "client_key": "n",
                        },
                    ),
                    ("GET", f"/v1/agents/{HOSTILE}/memories?limit={number}", None),
                    ("POST", path, {"role": "user", "text": number}),
                ]
                for method, route, request in requests:
                    status, body = api.call(method, route, request)
                    _typed(status, body)
                added = [r for r in snapshots.take()["messages"] if r not in before["messages"]]
                assert len(added) <= 1  # at most the one keyed append
    finally:
        api.conn.close()
        snapshots.close()
    if traffic.failure is not None:
        raise traffic.failure
    assert sum(len(texts) for texts in traffic.acked.values()) > 0

    async def histories() -> list[list[tuple[int, str]]]:
        async with _session(token) as session:
            return list(await asyncio.gather(*(_history(session, u, handle) for u in fleet.urls)))

    through_a, through_b, through_c = asyncio.run(histories())
    assert through_a == through_b == through_c
    assert through_b[0][1] == "seed"
    with fleet.store() as db, db.read() as reads:
        for chat, texts in traffic.acked.items():
            assert [m.content for m in reads.messages(decode_handle(chat)[0])] == texts
