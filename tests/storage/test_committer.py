"""The group commit: batching, isolation of a failing unit, retries, close (A1, S8).

Batches are formed deterministically, without sleeps: a *gate* unit holds the connection
(its caller leads) until the test releases it; the units called meanwhile queue, and the
test waits on the queue's growth (a condition, with a timeout) before it lets the gate go.
The gate's caller then takes them into its own transaction (up to ``max_batch`` units in
all) and commits them with the gate, on its own thread.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import apsw
import pytest
from factories import reading, stored_messages
from faults import FaultVFS

from fermix.errors import StorageError, WriteFailedError
from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage import Writes, affinity, leaders
from fermix.storage.affinity import WriterCpu
from fermix.storage.sqlite import messages
from fermix.storage.sqlite.committer import Committer, RetryPolicy
from fermix.storage.sqlite.database import Database
from fermix.storage.sqlite.migrations import open_database

KEY = ConversationKey("agent", "cli", "1")
WAIT_S = 10.0
"""The longest any test waits for another thread; a correct committer takes milliseconds."""
_vfs = FaultVFS("fermix-faulty-committer")

Work = Callable[[apsw.Connection], Any]


def _insert(text: str, key: ConversationKey = KEY) -> Callable[[apsw.Connection], Message]:
    return lambda conn: messages.insert(conn, NewMessage(key, "user", text))


def _stored(home: Path, key: ConversationKey = KEY) -> list[str]:
    """The texts of ``key``'s messages in ``home``'s ``memory.db``, oldest first."""
    return [m.content for m in stored_messages(home, key)]


class _WatchedQueue(deque[Any]):
    """The committer's queue, with a condition to wait on until it holds ``n`` units."""

    def __init__(self) -> None:
        super().__init__()
        self._grew = threading.Condition()

    def append(self, unit: Any) -> None:
        super().append(unit)
        with self._grew:
            self._grew.notify_all()

    def wait_for_length(self, n: int) -> None:
        with self._grew:
            assert self._grew.wait_for(lambda: len(self) >= n, WAIT_S), f"{n} units never queued"


class _Gate:
    """A unit that holds the connection until :meth:`open` (and records where it ran)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()
        self.ran_on: threading.Thread | None = None

    def __call__(self, conn: apsw.Connection) -> str:
        self.ran_on = threading.current_thread()
        self.entered.set()
        assert self._open.wait(WAIT_S), "the gate was never opened"
        return "gate"

    def open(self) -> None:
        self._open.set()


def _call(committer: Committer, work: Work, label: str = "unit") -> Future[Any]:
    """``committer.run(work)`` on a thread of its own; its outcome as a future."""
    future: Future[Any] = Future()

    def call() -> None:
        try:
            future.set_result(committer.run(work, label=label))
        except BaseException as exc:  # noqa: BLE001 - handed to the test through the future
            future.set_exception(exc)

    threading.Thread(target=call, daemon=True).start()
    return future


@pytest.fixture
def committer(tmp_path: Path) -> Iterator[Committer]:
    committer = Committer(open_database(tmp_path / "memory.db"))
    yield committer
    committer.close()


def _held(committer: Committer) -> tuple[_WatchedQueue, _Gate, Future[Any]]:
    """The connection held by a gate: the queue to watch, the gate, its caller's outcome."""
    watched = _WatchedQueue()
    committer._queue = watched  # the units queue here from now on
    gate = _Gate()
    gate_call = _call(committer, gate, label="gate")
    assert gate.entered.wait(WAIT_S)
    return watched, gate, gate_call


def _hold_and_queue(committer: Committer, works: list[Work]) -> tuple[_Gate, list[Future[Any]]]:
    """Hold the connection with a gate, then queue ``works`` in this order behind it."""
    watched, gate, gate_call = _held(committer)
    futures = []
    for n, work in enumerate(works, 1):
        futures.append(_call(committer, work, label=f"unit {n}"))
        watched.wait_for_length(n)
    futures.insert(0, gate_call)
    return gate, futures


def test_a1_concurrent_units_share_commits_and_all_land(tmp_path: Path) -> None:
    committer = Committer(open_database(tmp_path / "memory.db"))
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait(5)
        for i in range(50):
            committer.run(_insert(f"{n}-{i}"))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with reading(tmp_path) as reads:
        assert reads.count_messages(KEY) == 400
    assert committer.batches <= 400
    committer.close()


def test_a1_a_failing_unit_is_left_out_and_its_batchmates_commit(tmp_path: Path) -> None:
    committer = Committer(open_database(tmp_path / "memory.db"))

    def bad(conn: apsw.Connection) -> None:
        messages.insert(conn, NewMessage(KEY, "user", "half"))
        raise ValueError("this unit fails after writing")

    gate, (gated, *futures) = _hold_and_queue(committer, [_insert("a"), bad, _insert("b")])
    before = committer.batches
    gate.open()
    outcomes = [future.exception(WAIT_S) for future in futures]
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], ValueError)
    assert gated.result(WAIT_S) == "gate"
    assert committer.batches == before + 1  # the three joined the gate's transaction
    assert _stored(tmp_path) == ["a", "b"]
    committer.close()


def test_a1_transient_faults_are_retried_then_typed(tmp_path: Path) -> None:
    committer = Committer(
        open_database(tmp_path / "memory.db", vfs=_vfs.vfs_name), retry=RetryPolicy(attempts=3)
    )
    _vfs.plan.fail("write", times=2, suffix="-wal")
    committer.run(_insert("after two faults"))
    _vfs.plan.fail("write", times=None, suffix="-wal")
    try:
        with pytest.raises(WriteFailedError, match="3 attempts"):
            committer.run(_insert("never"))
    finally:
        _vfs.plan.clear()
    assert _stored(tmp_path) == ["after two faults"]
    committer.close()


def test_a1_s8_each_of_many_threads_gets_its_own_results_in_the_order_it_called(
    tmp_path: Path, committer: Committer
) -> None:
    threads, per_thread = 8, 60
    start = threading.Barrier(threads)
    results: dict[int, list[Message]] = {}

    def writer(n: int) -> None:
        key = ConversationKey("agent", "cli", f"t{n}")
        start.wait(WAIT_S)
        results[n] = [committer.run(_insert(f"{n}-{i}", key)) for i in range(per_thread)]

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S * 3)
    assert sorted(results) == list(range(threads))
    for n, stored in results.items():
        # Each caller got back its own rows, committed in the order it called.
        assert [m.content for m in stored] == [f"{n}-{i}" for i in range(per_thread)]
        ids = [m.id for m in stored]
        assert ids == sorted(ids)
        key = ConversationKey("agent", "cli", f"t{n}")
        assert _stored(tmp_path, key) == [m.content for m in stored]
    assert committer.batches <= threads * per_thread


def test_s8_units_queued_behind_a_busy_connection_join_its_transaction_in_queue_order(
    tmp_path: Path, committer: Committer
) -> None:
    ran_on: list[threading.Thread] = []

    def insert(text: str) -> Work:
        def work(conn: apsw.Connection) -> Message:
            ran_on.append(threading.current_thread())
            return messages.insert(conn, NewMessage(KEY, "user", text))

        return work

    texts = ["first", "second", "third", "fourth"]
    gate, (gated, *futures) = _hold_and_queue(committer, [insert(t) for t in texts])
    before = committer.batches
    gate.open()
    stored = [future.result(WAIT_S) for future in futures]
    assert gated.result(WAIT_S) == "gate"
    assert committer.batches == before + 1
    assert [m.content for m in stored] == texts
    assert [m.id for m in stored] == sorted(m.id for m in stored)
    # The caller holding the connection committed them for their four callers.
    assert set(ran_on) == {gate.ran_on}
    assert _stored(tmp_path) == texts


def test_s8_a_batch_takes_at_most_max_batch_units_and_the_next_caller_queued_leads_the_next(
    tmp_path: Path,
) -> None:
    committer = Committer(open_database(tmp_path / "memory.db"), max_batch=3)
    ran_on: dict[str, threading.Thread] = {}

    def insert(text: str) -> Work:
        def work(conn: apsw.Connection) -> Message:
            ran_on[text] = threading.current_thread()
            return messages.insert(conn, NewMessage(KEY, "user", text))

        return work

    texts = ["a", "b", "c", "d", "e"]
    gate, (gated, *futures) = _hold_and_queue(committer, [insert(t) for t in texts])
    before = committer.batches
    gate.open()
    assert [future.result(WAIT_S).content for future in futures] == texts
    assert gated.result(WAIT_S) == "gate"
    assert committer.batches == before + 2  # the gate with a and b, then c with d and e
    assert ran_on["a"] is ran_on["b"] is gate.ran_on
    assert ran_on["c"] is ran_on["d"] is ran_on["e"] is not gate.ran_on
    assert _stored(tmp_path) == texts
    committer.close()


def test_a1_a_units_database_error_reaches_only_its_caller_typed(
    tmp_path: Path, committer: Committer
) -> None:
    def breaks_a_constraint(conn: apsw.Connection) -> None:
        conn.execute("INSERT INTO messages (content) VALUES ('no agent, no role')")

    gate, (_gated, *futures) = _hold_and_queue(
        committer, [_insert("a"), breaks_a_constraint, _insert("b")]
    )
    gate.open()
    assert futures[0].result(WAIT_S).content == "a"
    assert futures[2].result(WAIT_S).content == "b"
    error = futures[1].exception(WAIT_S)
    assert isinstance(error, WriteFailedError) and "unit 2" in str(error)
    assert isinstance(error.__cause__, apsw.ConstraintError)
    assert _stored(tmp_path) == ["a", "b"]


def test_a1_s8_a_batch_whose_commit_keeps_failing_fails_every_caller_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    committer = Committer(
        open_database(tmp_path / "memory.db", vfs=_vfs.vfs_name),
        retry=RetryPolicy(attempts=3, initial_wait_s=0.001, max_wait_s=0.005),
    )
    gate, (gated, *futures) = _hold_and_queue(committer, [_insert("a"), _insert("b"), _insert("c")])
    _vfs.plan.fail("write", times=None, suffix="-wal")
    try:
        gate.open()
        errors = [future.exception(WAIT_S) for future in futures]
    finally:
        _vfs.plan.clear()
    errors.append(gated.exception(WAIT_S))  # the three joined the gate's transaction
    for error in errors:
        assert isinstance(error, WriteFailedError) and "3 attempts" in str(error)
    assert _stored(tmp_path) == []
    committer.run(_insert("after the fault"))
    committer.close()
    assert _stored(tmp_path) == ["after the fault"]


def test_s8_a_lone_caller_commits_on_its_own_thread(committer: Committer) -> None:
    def where(conn: apsw.Connection) -> threading.Thread:
        return threading.current_thread()

    me = threading.current_thread()
    assert [committer.run(where) for _ in range(3)] == [me, me, me]
    assert committer.batches == 3

    gate, (gated, queued) = _hold_and_queue(committer, [where])
    gate.open()
    assert gated.result(WAIT_S) == "gate"
    assert queued.result(WAIT_S) is gate.ran_on  # committed by the caller holding the connection
    # The connection is free again: the next lone call commits on its own thread at once.
    assert [committer.run(where) for _ in range(2)] == [me, me]


def test_a1_s8_a_batchs_callers_are_answered_even_when_the_next_batch_fails(
    tmp_path: Path,
) -> None:
    committer = Committer(
        open_database(tmp_path / "memory.db"),
        retry=RetryPolicy(attempts=2, initial_wait_s=0.001, max_wait_s=0.002),
        max_batch=2,
    )

    def always_busy(conn: apsw.Connection) -> None:
        raise apsw.BusyError("another process holds the write lock")

    # The gate's batch takes "committed" (max_batch 2); the busy unit leads the next one.
    gate, (gated, committed, failing) = _hold_and_queue(
        committer, [_insert("committed"), always_busy]
    )
    gate.open()
    assert committed.result(WAIT_S).content == "committed"
    error = failing.exception(WAIT_S)
    assert isinstance(error, WriteFailedError) and "2 attempts" in str(error)
    assert gated.result(WAIT_S) == "gate"
    committer.close()
    assert _stored(tmp_path) == ["committed"]


@pytest.mark.parametrize("attempts", [1, 2, 3])
def test_s8_a_policy_of_n_attempts_runs_a_busy_batch_n_times(tmp_path: Path, attempts: int) -> None:
    """``RetryPolicy(attempts=n)`` tries a batch that keeps failing transiently exactly n
    times (one attempt: no retry at all), then fails it typed."""
    committer = Committer(
        open_database(tmp_path / "memory.db"),
        retry=RetryPolicy(attempts=attempts, initial_wait_s=0.001, max_wait_s=0.002),
    )
    tries = []

    def busy(conn: apsw.Connection) -> None:
        tries.append(1)
        raise apsw.BusyError("another process holds the write lock")

    with pytest.raises(WriteFailedError):
        committer.run(busy)
    committer.close()
    assert len(tries) == attempts


class _InterruptedOnce:
    """A caller's wake-up lock whose first wait is interrupted (as by KeyboardInterrupt)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.interrupted = False

    def acquire(self) -> bool:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


def test_a1_an_interrupted_caller_still_leads_the_batch_handed_to_it_then_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unit(leaders.Unit):
        def __init__(self, work: Work, label: str, *, queued: bool) -> None:
            super().__init__(work, label, queued=queued)
            if label == "unit 1" and self.wake is not None:
                self.wake = _InterruptedOnce(self.wake)  # type: ignore[assignment]

    monkeypatch.setattr(leaders, "Unit", Unit)
    committer = Committer(open_database(tmp_path / "memory.db"), max_batch=1)
    # max_batch 1: the gate commits alone and hands the connection to unit 1's caller,
    # whose wait was interrupted; it must still lead, or unit 2 would wait forever.
    gate, (gated, first, second) = _hold_and_queue(committer, [_insert("a"), _insert("b")])
    gate.open()
    assert isinstance(first.exception(WAIT_S), KeyboardInterrupt)
    assert second.result(WAIT_S).content == "b"
    assert gated.result(WAIT_S) == "gate"
    committer.close()
    assert _stored(tmp_path) == ["a", "b"]


class _Seen(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def _close_in_thread(committer: Committer) -> tuple[threading.Thread, threading.Event]:
    """``committer.close()`` on a thread of its own; the event is set once it returned."""
    closed = threading.Event()

    def close() -> None:
        committer.close()
        closed.set()

    closer = threading.Thread(target=close)
    closer.start()
    return closer, closed


def test_a1_a8_close_while_busy_commits_the_queued_work_then_refuses_new_work(
    tmp_path: Path,
) -> None:
    committer = Committer(open_database(tmp_path / "memory.db"))
    gate, futures = _hold_and_queue(committer, [_insert("a"), _insert("b")])
    logger = logging.getLogger("fermix.storage.leaders")
    seen, level = _Seen("closing the writer"), logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.DEBUG)
    try:
        closer, closed = _close_in_thread(committer)
        assert seen.event.wait(WAIT_S)  # close() has begun while the gate holds the connection
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    assert not closed.is_set()
    with pytest.raises(StorageError, match="closed"):
        committer.run(_insert("too late"))
    gate.open()
    closer.join(WAIT_S)
    assert closed.is_set()
    assert futures[0].result(WAIT_S) == "gate"
    assert [f.result(WAIT_S).content for f in futures[1:]] == ["a", "b"]
    assert _stored(tmp_path) == ["a", "b"]


def test_a1_close_waits_for_a_lone_caller_that_is_committing(tmp_path: Path) -> None:
    committer = Committer(open_database(tmp_path / "memory.db"))
    gate = _Gate()
    gated = _call(committer, gate)
    assert gate.entered.wait(WAIT_S)
    closer, closed = _close_in_thread(committer)
    assert not closed.is_set()
    gate.open()
    closer.join(WAIT_S)
    assert closed.is_set() and gated.result(WAIT_S) == "gate"
    assert committer.batches == 1


def _pages_after_each(committer: Committer, count: int) -> list[int]:
    """Commit ``count`` messages one by one; the log's pages after each commit."""
    pages = []
    for i in range(count):
        committer.run(_insert(f"m{i}"))
        pages.append(committer._wal_pages)
    return pages


def test_a1_s8_no_commit_checkpoints_the_log_before_the_inline_threshold(
    tmp_path: Path,
) -> None:
    # SQLite's own auto-checkpoint (at 1,000 pages, inside the COMMIT) is replaced: with the
    # background checkpointer held back, the log grows past it and nothing copies it back.
    committer = Committer(open_database(tmp_path / "memory.db"), inline_pages=10**9)
    assert committer._checkpointer is not None
    asked: list[None] = []
    committer._checkpointer.request = lambda: asked.append(None)  # type: ignore[method-assign]
    pages = _pages_after_each(committer, 300)
    committer.close()
    assert pages == sorted(pages) and pages[-1] > 1000  # never started over: no checkpoint
    assert len(asked) >= pages[-1] // 1000  # the background was asked every 1,000 pages
    assert len(_stored(tmp_path)) == 300


def test_s8_past_the_inline_threshold_the_committing_party_checkpoints_and_the_log_restarts(
    tmp_path: Path,
) -> None:
    conn = open_database(tmp_path / "memory.db")
    # The log the migrations left (some 80 pages since migration 8) is not the committer's.
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    committer = Committer(conn, checkpoint_pages=16, inline_pages=64)
    assert committer._checkpointer is not None
    committer._checkpointer.request = lambda: None  # type: ignore[method-assign]
    pages = _pages_after_each(committer, 100)
    committer.close()
    per_commit = max(b - a for a, b in itertools.pairwise(pages) if b > a)
    assert max(pages) < 64 + per_commit  # bounded: checkpointed once past 64 pages
    assert any(b < a for a, b in itertools.pairwise(pages))  # and the log started over
    assert _stored(tmp_path) == [f"m{i}" for i in range(100)]


def test_a1_s8_the_background_checkpointer_copies_the_log_and_stops_at_close(
    tmp_path: Path,
) -> None:
    committer = Committer(open_database(tmp_path / "memory.db"), checkpoint_pages=16)
    checkpointer = committer._checkpointer
    assert checkpointer is not None
    _pages_after_each(committer, 50)
    committer.close()
    assert checkpointer.checkpoints >= 1
    assert checkpointer._thread is not None and not checkpointer._thread.is_alive()
    assert _stored(tmp_path) == [f"m{i}" for i in range(50)]
    conn = apsw.Connection(str(tmp_path / "memory.db"))  # the log was folded in at close
    try:
        assert conn.execute("SELECT count(*) FROM messages").fetchall()[0][0] == 50
    finally:
        conn.close()


# -- the conversation rows a write session knows (one touch statement less per append) ---


def _append(db: Database, owner: str, trust: str, text: str) -> None:
    def unit(writes: Writes) -> Message:
        writes.touch_known(KEY, owner, trust)
        return writes.insert_message(NewMessage(KEY, "user", text, owner_id=owner))

    db.append(unit, label="append")


def _owner_and_trust(db: Database) -> tuple[str, str]:
    with db.read() as reads:
        state = reads.conversation(KEY)
    assert state is not None
    return (state.owner_id, state.trust)


def test_a1_m1_an_append_brings_the_row_back_after_another_process_or_unit_changed_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "memory.db"
    mine, other = Database(path), Database(path)  # two connections: as two processes
    try:
        _append(mine, "alice", "operator", "a")
        _append(mine, "alice", "operator", "b")  # known: no touch statement
        other.write(lambda w: w.touch_conversation(KEY, owner_id="bob", trust="guest"))
        assert _owner_and_trust(mine) == ("bob", "guest")
        _append(mine, "alice", "operator", "c")  # another connection committed: touched
        assert _owner_and_trust(mine) == ("alice", "operator")
        # A unit of this process that is not an append may change the row: forgotten too.
        mine.write(lambda w: w.update_conversation(KEY, owner_id="carol", trust="guest"))
        _append(mine, "alice", "operator", "d")
        assert _owner_and_trust(mine) == ("alice", "operator")

        # A rolled-back append leaves nothing known: the next one touches again.
        def failing(writes: Writes) -> None:
            writes.touch_known(KEY, "dave", "guest")
            raise ValueError("refused")

        with pytest.raises(ValueError, match="refused"):
            mine.append(failing, label="append")
        assert _owner_and_trust(mine) == ("alice", "operator")
        _append(mine, "dave", "guest", "e")
        assert _owner_and_trust(mine) == ("dave", "guest")
        mine.write(lambda w: w.update_conversation(KEY, owner_id="erin"))
        with pytest.raises(ValueError, match="refused"):
            mine.append(failing, label="append")
        _append(mine, "dave", "guest", "f")
        assert _owner_and_trust(mine) == ("dave", "guest")
    finally:
        mine.close()
        other.close()
    assert _stored(tmp_path) == ["a", "b", "c", "d", "e", "f"]


# -- the writer's CPU (fermix.storage.affinity) --------------------------------------------

_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
_needs_two_cpus = pytest.mark.skipif(
    len(_CPUS) < 2, reason="narrowing a thread to one CPU needs a process allowed two (Linux)"
)


def _affinity_of(thread_future: Future[int]) -> set[int]:
    return os.sched_getaffinity(thread_future.result(WAIT_S))


def _queued_caller(
    committer: Committer, watched: Any, n: int, *, own: set[int] | None = None
) -> tuple[Future[int], Future[set[int]], Future[set[int]]]:
    """A thread that (with ``own`` CPUs, if given) calls the committer, queued ``n``-th:
    its native id, and the CPUs it had before and after its call."""
    tid: Future[int] = Future()
    before: Future[set[int]] = Future()
    after: Future[set[int]] = Future()

    def call() -> None:
        if own is not None:
            os.sched_setaffinity(0, own)
        before.set_result(os.sched_getaffinity(0))
        tid.set_result(threading.get_native_id())
        committer.run(_insert(f"queued {n}"), label=f"unit {n}")
        after.set_result(os.sched_getaffinity(0))

    threading.Thread(target=call, daemon=True).start()
    watched.wait_for_length(n)
    return tid, before, after


@_needs_two_cpus
def test_a1_a_contended_caller_waits_on_the_writer_cpu_and_leaves_with_its_own_cpus(
    tmp_path: Path,
) -> None:
    """While the writer is contended, a queued caller's thread runs on the writer's CPU
    (the hand-offs of the group commit stay on one core); it returns with the CPUs it had,
    and once a batch commits alone, callers are left alone again."""
    cpu = _CPUS[-1]
    committer = Committer(open_database(tmp_path / "memory.db"), cpu=WriterCpu(cpu))
    try:
        watched, gate, gate_call = _held(committer)
        queued = [_queued_caller(committer, watched, n) for n in (1, 2)]
        for tid, before, _after in queued:
            assert before.result(WAIT_S) == set(_CPUS)
            assert _affinity_of(tid) == {cpu}, "a queued caller waits on the writer's CPU"
        gate.open()
        assert gate_call.result(WAIT_S) == "gate"
        for _tid, before, after in queued:
            assert after.result(WAIT_S) == before.result(WAIT_S)

        # Contended until a batch commits alone: that one is narrowed, the next is not.
        seen = [committer.run(lambda conn: os.sched_getaffinity(0)) for _ in range(2)]
        assert seen == [{cpu}, set(_CPUS)]
        assert os.sched_getaffinity(0) == set(_CPUS)
    finally:
        committer.close()
    assert _stored(tmp_path) == ["queued 1", "queued 2"]


@_needs_two_cpus
def test_a1_a_caller_whose_cpus_exclude_the_writer_cpu_is_left_alone(tmp_path: Path) -> None:
    cpu, other = _CPUS[-1], _CPUS[0]
    committer = Committer(open_database(tmp_path / "memory.db"), cpu=WriterCpu(cpu))
    try:
        watched, gate, gate_call = _held(committer)
        tid, before, after = _queued_caller(committer, watched, 1, own={other})
        assert _affinity_of(tid) == {other}
        gate.open()
        gate_call.result(WAIT_S)
        assert before.result(WAIT_S) == after.result(WAIT_S) == {other}
    finally:
        committer.close()


def test_a1_the_writer_cpu_is_off_when_switched_off_or_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(affinity.ENV_SWITCH, "0")
    assert WriterCpu.for_process().cpu is None
    assert WriterCpu(None).narrow() is None
    if len(_CPUS) < 2:
        return

    def refused(pid: int, cpus: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    writer_cpu = WriterCpu(_CPUS[-1])
    monkeypatch.setattr(os, "sched_setaffinity", refused)  # a sandbox refusing the call
    with caplog.at_level(logging.INFO, logger=affinity.__name__):
        assert writer_cpu.narrow() is None
    assert writer_cpu.cpu is None, "a refused call turns it off for the process"
    assert "writer CPU affinity off" in caplog.text
    assert os.sched_getaffinity(0) == set(_CPUS)
