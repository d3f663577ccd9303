"""The workloads of bench/backends.py, each through the storage port and nothing else.

A helper module (its name starts with ``_``): bench/run.py does not run it.

Every workload takes a :class:`fermix.storage.Storage` (SQLite's ``Database`` or
PostgreSQL's ``PgDatabase``) and drives it through its sessions only: an append is the unit
``fermix/runtime/writer.py`` commits for ``Conversation.append_user`` without a client key
(the conversation's row touched through ``touch_known``, the message inserted) run with
``Storage.append``; a search is ``Reads.search_messages`` in a read unit.

The one exception is the baseline of the concurrent appends on PostgreSQL,
:func:`plain_concurrent`: fermix's own ``INSERT`` (``fermix/storage/postgres/messages.py``,
with its stems, on fermix's schema with its trigger and indexes) sent by plain psycopg, each
statement its own transaction (autocommit: one round trip and one commit per row), as an
application would write rows without fermix's group commit: on a connection per thread, or
on a ``psycopg_pool`` pool of as many connections as fermix's lanes, shared by the threads.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from _timing import percentile
from psycopg_pool import ConnectionPool

from fermix.model import AppendResult, ConversationKey, Message, NewMessage, PendingAppend
from fermix.runtime.writer import append_unit
from fermix.storage import Storage
from fermix.storage.postgres import messages as pg_messages

AGENT, OWNER, TRUST = "bench", "alice", "operator"
THREADS, CONVERSATIONS_PER_THREAD = 8, 8


def append(db: Storage, key: ConversationKey, text: str) -> Message:
    """What ``Conversation.append_user(text)`` commits, through the port: the append unit of
    ``fermix/runtime/writer.py`` (no client key)."""
    new = NewMessage(key, "user", text, owner_id=OWNER, sender=OWNER, trust=TRUST)
    result: AppendResult = db.append(append_unit(PendingAppend(new, TRUST)), label="append")
    return result.message


@dataclass
class Run:
    """Appends timed one by one: how many, the wall time over all, each one's latency."""

    count: int = 0
    elapsed_ns: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    commits: int = 0

    @property
    def rate(self) -> float:
        """Acknowledged appends per second."""
        return self.count / (self.elapsed_ns / 1e9) if self.elapsed_ns else 0.0

    def percentile_us(self, q: float) -> float:
        """The ``q``-th percentile latency, in microseconds."""
        return percentile(self.latencies_ns, q) / 1000

    def add(self, other: Run) -> None:
        """Count another round of the same measure in this one."""
        self.count += other.count
        self.elapsed_ns += other.elapsed_ns
        self.latencies_ns.extend(other.latencies_ns)
        self.commits += other.commits


def chunks(items: Sequence[str], n: int) -> list[Sequence[str]]:
    """``items`` cut into ``n`` consecutive pieces of near-equal size."""
    bounds = [len(items) * i // n for i in range(n + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(n)]


def sequential(db: Storage, key: ConversationKey, texts: Sequence[str]) -> Run:
    """One thread appending ``texts`` to one conversation, each append timed."""
    clock = time.perf_counter_ns
    latencies: list[int] = []
    before = db.commits
    start = clock()
    for text in texts:
        t0 = clock()
        append(db, key, text)
        latencies.append(clock() - t0)
    return Run(len(texts), clock() - start, latencies, db.commits - before)


Timed = tuple[int, int, list[int]]
"""One thread's share: its start and end (``perf_counter_ns``), each append's latency."""


def each_timed(
    barrier: threading.Barrier, items: Sequence[str], op: Callable[[int, str], object]
) -> Timed:
    """``op(i, item)`` for each of ``items`` once ``barrier`` lets this thread go: its start,
    its end and each call's latency (ns). fermix's threads and the plain baseline's are timed
    by this one loop."""
    clock = time.perf_counter_ns
    latencies: list[int] = []
    barrier.wait()
    start = clock()
    for i, item in enumerate(items):
        t0 = clock()
        op(i, item)
        latencies.append(clock() - t0)
    return (start, clock(), latencies)


def in_threads(
    share: Callable[[int, threading.Barrier], Timed], name: str
) -> tuple[int, list[int]]:
    """Run ``share(t, barrier)`` in :data:`THREADS` threads, each waiting on ``barrier``
    before its clock starts; the wall time from the first start to the last end, and every
    latency. A thread's error is raised here, once all have ended."""
    barrier = threading.Barrier(THREADS)
    results: list[Timed] = [(0, 0, [])] * THREADS
    errors: list[BaseException] = []

    def one(t: int) -> None:
        try:
            results[t] = share(t, barrier)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()  # the others stop waiting for this thread
            raise

    threads = [threading.Thread(target=one, args=(t,), name=f"{name}-{t}") for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    elapsed = max(end for _, end, _ in results) - min(start for start, _, _ in results)
    return elapsed, [ns for _, _, lat in results for ns in lat]


def concurrent(db: Storage, prefix: str, texts: Sequence[str]) -> Run:
    """:data:`THREADS` threads, each appending its share of ``texts`` to its own
    :data:`CONVERSATIONS_PER_THREAD` conversations in turn; timed from first to last."""
    shares = chunks(texts, THREADS)

    def appends(t: int, barrier: threading.Barrier) -> Timed:
        keys = [
            ConversationKey(AGENT, "threads", f"{prefix}-t{t}-c{c}")
            for c in range(CONVERSATIONS_PER_THREAD)
        ]
        return each_timed(
            barrier,
            shares[t],
            lambda i, text: append(db, keys[i % CONVERSATIONS_PER_THREAD], text),
        )

    before = db.commits
    elapsed, latencies = in_threads(appends, "bench")
    return Run(len(latencies), elapsed, latencies, db.commits - before)


def plain_concurrent(url: str, prefix: str, texts: Sequence[str], *, pool: int = 0) -> Run:
    """:func:`concurrent`'s work without fermix's write path: :data:`THREADS` threads, each
    inserting its share of ``texts`` into its own :data:`CONVERSATIONS_PER_THREAD`
    conversations with fermix's ``INSERT``, one row and one commit per statement, on a
    psycopg connection of its own (autocommit), or with ``pool`` > 0 on a connection taken
    from a ``psycopg_pool.ConnectionPool`` of ``pool`` connections for each row. The
    conversations' rows are made before the clock starts (fermix's append touches its row in
    the same transaction; here the insert's trigger alone updates it), so the baseline does
    no more than one insert a row."""
    shares = chunks(texts, THREADS)
    with contextlib.ExitStack() as stack:
        connection = _plain_connections(stack, url, pool)

        def inserts(t: int, barrier: threading.Barrier) -> Timed:
            keys = [
                ConversationKey(AGENT, "plain", f"{prefix}-t{t}-c{c}")
                for c in range(CONVERSATIONS_PER_THREAD)
            ]
            with connection(t) as conn:
                for key in keys:
                    stamp = time.time_ns() // 1_000_000
                    conn.execute(
                        "INSERT INTO conversations (agent_id, channel, chat_id, thread_scope,"
                        " owner_id, trust, created_at, updated_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        (*key.as_tuple(), OWNER, TRUST, stamp, stamp),
                    )

            def insert(i: int, text: str) -> None:
                key = keys[i % CONVERSATIONS_PER_THREAD]
                new = NewMessage(key, "user", text, owner_id=OWNER, sender=OWNER, trust=TRUST)
                with connection(t) as conn:
                    pg_messages.insert(conn, new)

            return each_timed(barrier, shares[t], insert)

        elapsed, latencies = in_threads(inserts, "plain")
    return Run(len(latencies), elapsed, latencies, len(latencies))


Connected = Callable[[int], contextlib.AbstractContextManager[psycopg.Connection]]
"""Thread ``t``'s connection for one statement (:func:`plain_concurrent`)."""


def _plain_connections(stack: contextlib.ExitStack, url: str, pool: int) -> Connected:
    """A connection per thread, or with ``pool`` > 0 one of ``pool`` pooled connections per
    statement; closed with ``stack``."""
    if pool:
        shared = stack.enter_context(
            ConnectionPool(
                url, min_size=pool, max_size=pool, kwargs={"autocommit": True}, open=False
            )
        )
        shared.wait()
        return lambda t: shared.connection()
    conns = [stack.enter_context(psycopg.connect(url, autocommit=True)) for _ in range(THREADS)]
    return lambda t: contextlib.nullcontext(conns[t])


# -- writer processes ---------------------------------------------------------------------


@dataclass(frozen=True)
class WriterSpec:
    """What one writer process does: which store, for how long, with which texts."""

    backend: str  # "sqlite" or "postgres"
    target: str  # the SQLite file, or the PostgreSQL URL
    prefix: str
    seconds: float
    texts: tuple[str, ...]
    warmup: int = 50


def open_store(backend: str, target: str) -> Storage:
    """The port's adapter for ``backend`` on ``target``."""
    if backend == "sqlite":
        from fermix.storage.sqlite.database import Database

        return Database(target)
    from fermix.storage.postgres import PgDatabase

    return PgDatabase(target)


def writer_process(spec: WriterSpec, ready: Any, results: Any) -> None:
    """A writer process: open the store, warm up, wait for every writer, then append to
    its own conversations one after another for ``spec.seconds``; report the count."""
    db = open_store(spec.backend, spec.target)
    try:
        keys = [
            ConversationKey(AGENT, "procs", f"{spec.prefix}-c{c}")
            for c in range(CONVERSATIONS_PER_THREAD)
        ]
        texts = spec.texts
        for i in range(spec.warmup):
            append(db, keys[i % len(keys)], texts[i % len(texts)])
        ready.wait()
        clock = time.perf_counter
        start = clock()
        deadline = start + spec.seconds
        n = 0
        while clock() < deadline:
            append(db, keys[n % len(keys)], texts[n % len(texts)])
            n += 1
        results.put((n, clock() - start))
    finally:
        db.close()


@dataclass(frozen=True)
class ProcessRun:
    """Writer processes appending at once: how many, and their total throughput."""

    processes: int
    appends: int
    rate: float


def writer_processes(
    backend: str, target: str, processes: int, seconds: float, texts: Sequence[str], tag: str
) -> ProcessRun:
    """``processes`` spawned writer processes appending at once for ``seconds`` each."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=writer_process,
            args=(
                WriterSpec(backend, target, f"{tag}-p{p}", seconds, tuple(texts)),
                ready,
                results,
            ),
            name=f"bench-writer-{p}",
        )
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        ready.wait(timeout=120)
        counts = [results.get(timeout=seconds + 120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    if failed:
        raise RuntimeError(f"{backend} writer processes exited with {failed}")
    return ProcessRun(
        processes,
        sum(n for n, _ in counts),
        sum(n / elapsed for n, elapsed in counts),
    )


# -- search -------------------------------------------------------------------------------


@dataclass
class Searches:
    """One adapter's query times at one size, per scope (wall clock, ms)."""

    conversation_ms: list[float] = field(default_factory=list)
    owner_ms: list[float] = field(default_factory=list)
    found: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    """Each scope's hit ids per question, best first, in the order asked."""

    def p(self, scope: str, q: float) -> float:
        """The ``q``-th percentile of ``scope``'s query times, in ms."""
        times = self.conversation_ms if scope == "conversation" else self.owner_ms
        return round(percentile(times, q), 3)


def search_once(
    db: Storage, searches: Searches, scope: str, text: str, key: ConversationKey, owner: str
) -> None:
    """One timed search of ``scope``, as ``memory_recall`` searches history without vectors."""
    start = time.perf_counter()
    with db.read() as reads:
        if scope == "conversation":
            found = reads.search_messages(text, key=key, limit=20)
        else:
            found = reads.search_messages(text, agent_id=key.agent_id, owner_id=owner, limit=20)
    elapsed = (time.perf_counter() - start) * 1000
    (searches.conversation_ms if scope == "conversation" else searches.owner_ms).append(elapsed)
    searches.found.setdefault(scope, []).append(tuple(hit.message.id for hit in found))


def same_hits(first: Searches, second: Searches) -> tuple[int, int]:
    """How many searches found the same messages in the same order on both, of how many."""
    pairs = [
        (a, b)
        for scope, found in first.found.items()
        for a, b in zip(found, second.found.get(scope, []), strict=True)
    ]
    return sum(a == b for a, b in pairs), len(pairs)


def search_rounds(
    stores: dict[str, Storage],
    questions: Sequence[str],
    targets: Sequence[tuple[ConversationKey, str]],
    warmup: int,
) -> dict[str, Searches]:
    """Every question in both scopes on every store, in a rotating order; the first
    ``warmup`` questions are asked but not counted."""
    measures = [(name, scope) for name in stores for scope in ("conversation", "owner")]
    results = {name: Searches() for name in stores}
    for n, (text, (key, owner)) in enumerate(zip(questions, targets, strict=True)):
        shift = n % len(measures)
        for name, scope in measures[shift:] + measures[:shift]:
            search_once(stores[name], results[name], scope, text, key, owner)
        if n + 1 == warmup:
            results = {name: Searches() for name in stores}
    return results


def loadavg() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]
