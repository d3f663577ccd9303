"""Group commit on PostgreSQL: the concurrent write units of one process share transactions.

The leader/absorb scheme of :mod:`fermix.storage.sqlite.committer` (the shared
:class:`~fermix.storage.leaders.GroupCommit`), on one psycopg connection (autocommit mode,
transactions opened and ended here); a process runs its appends on a few of them side by
side, one per lane of conversations (:meth:`fermix.storage.postgres.PgDatabase.append`):

* a caller that finds the connection free leads: ``BEGIN`` (READ COMMITTED), its unit, and
  every unit queued meanwhile (up to ``max_batch``), then ``COMMIT``; it wakes its batch's
  callers and hands the connection to the first caller queued after them;
* a caller that finds it held queues and sleeps on a lock of its own.

**Two round trips an append, with a remote server.** There a batch (other than one run of
plain appends, which takes one: below) runs in pipeline mode
(:func:`fermix.storage.postgres.connection.pipeline`): ``BEGIN`` and the statements whose result
nobody reads (a conversation's touch) go out with the next statement read, so an append
costs one round trip for ``BEGIN``, touch and insert, and one for ``COMMIT``, instead of
four. With a server on this machine, where a round trip costs less than pipeline mode's own
work, each statement goes out alone. A pipelined attempt that fails is rolled back with
psycopg's ``rollback()``, which also forgets its prepared statements: a statement prepared
behind a failed one in the pipeline never was, though psycopg counts it as prepared.

**A batch of appends in one round trip.** A batch's plain appends in distinct
conversations (no client key to read first, no peak to write after:
:attr:`~fermix.storage.appending.AppendUnit.plain`) are stored together: one ``INSERT ...
ON CONFLICT`` of their conversations' rows, locking them in queue order as their own
touches would, then one ``INSERT ... SELECT`` of their messages in that order, so the
``messages_bi`` trigger draws their ids in it, each timed as one insert alone is
(:func:`fermix.storage.postgres.messages.insert_all`). Their rows go out as one JSON array
each, and each append's stems are made by its own caller before it queues
(:class:`StemmedAppend`): what the leader does, every caller of its batch waits for.

A batch that is one such run and nothing else (the leader takes in what queued before it
starts; the usual batch) is sent as one simple query (:meth:`PgCommitter._run_whole`):
``BEGIN``; :data:`NO_WAITING`; the touch and the insert as statements prepared once per
connection (``EXECUTE``, their JSON quoted by libpq); ``COMMIT``. The leader waits for the
server once, in either mode. Any other batch starting with a run of them stores it with the
same two statements, each its own round trip (:func:`_append_all`), so that the units it
absorbs meanwhile can follow in the same transaction.

Measured here (issue 25: 8 threads over 64 conversations, 2 lanes, the durable server on
this machine, alternated rounds against plain psycopg in the same run): in four round
trips (``BEGIN`` with :data:`NO_WAITING`, touch, insert, ``COMMIT``) fermix stored 2,600 to
2,800 messages a second against psycopg's 3,200 to 3,400; each round trip cost the leader
0.2 to 0.4 ms of waiting for its thread's turn on a busy 2-CPU machine, more than the
server's own work. In one simple query with the statements planned each time, 2,450 to
2,650; prepared once, 3,100 to 3,500 against 3,200 to 3,400.

Profiled earlier (issue 25: 8 threads over 64 conversations, a durable server on this
machine, a loaded 2-CPU machine): statement by statement a batch of 8 took 9.9 to 11.7 ms
(a touch 170 to 280 us and an insert 345 to 390 us as the client waits for them, against
25 and 160 to 200 us of server time in ``pg_stat_statements``; ``COMMIT``, the WAL's fsync,
0.2 to 8 ms whatever the transaction wrote). With the absorbed appends stored together it
took 4.6 to 5.4 ms, seven statements of which the leader's own work was about 1 ms: psycopg
building the ``unnest``'s arrays (180 us for 8 rows, where ``json.dumps`` takes 20) and the
stems (25 us an append). In four statements, with the stems made by the callers, the
leader's work is about 0.4 ms and a batch of 8 about 2.3 ms, most of it the server's: the
insert of 8 rows about 1.1 ms (the stems' GIN index most of it), the trigger 0.2.

Why this does not pass plain psycopg on this machine (issue 25, the workload above, 2 lanes,
2 CPUs): a batch holds 2.6 appends on average, its one round trip takes 1.6 to 1.7 ms (1.0 to
1.15 with ``synchronous_commit`` off, so the WAL's fsync is some 0.5 ms of it) and the hand-off
to the next leader 0.3 to 0.4 ms, so each lane's connection is busy 82 to 86% of the time.
The 8 callers are a closed loop: those of the batch in flight come back after it has
committed, so they wait for the next batch to run before theirs, about two round trips an
append. The machine stays 26 to 33% idle, at 410 to 550 us of CPU a message (the server's
and this process's together); psycopg's 8 connections keep it 10 to 15% idle, at 515 to 745
us. The work a commit per row adds (the transaction, the fsync's share of CPU) is small next
to each row's own (the trigger, the GIN entries, the heap and b-trees), so a group commit
saves about 100 us of CPU a message, and with 8 callers it cannot keep more work in
flight. Measured without gain (alternated rounds, the same run): 3 and 4 lanes (smaller
batches: more CPU a message), an append sent to a free lane when its own lane is held, a
leader that runs the next batch itself, a wait for more callers before ``BEGIN``, and this
process's callers narrowed to one CPU as SQLite's are (:mod:`fermix.storage.affinity`).
What a connection per caller has, batching or not: PostgreSQL flushes the WAL once for
every commit waiting at that moment, so psycopg's 8 connections, committing a row each,
already share fsyncs, 2.2 to 2.3 commits a WAL fsync (``pg_stat_io``, three rounds of 4,000
appends), where fermix's 2 lanes fsync once a batch of 2.6 to 3.5. On as many connections as
fermix's lanes (a ``psycopg_pool`` pool of 2 shared by the 8 threads, a connection taken for
each row: bench/backends.py's second baseline), fermix stored 1.40 to 1.53 times as many
messages a second as plain psycopg in alternated rounds (2,860 to 3,300 against 1,950 to
2,200), 1.34 to 1.43 in four full runs of the benchmark, and 1.18 to 1.30 times as many as
psycopg on a pool of 4.

An error of a run (a constraint, a value PostgreSQL cannot hold) fails it whole: the batch
runs again unit by unit in savepoints, as for any unit's error, so the error reaches its
own unit alone, the one it would get alone. A locked row makes the run wait no more than
an absorbed unit does (``lock_timeout``, below): the run and the units after it go to the
next batch, or, when the run is the batch's first, the batch runs again with its first
unit alone and waiting for its row.

**No deadlock between the batches of two services.** A batch holds the row locks its units
took until it commits (a conversation's row for each append); two batches each waiting for
a row the other holds deadlock, and PostgreSQL aborts one after ``deadlock_timeout`` (1 s).
So a batch waits for a lock only in its first unit, when it holds none: the units absorbed
after it (and a first run of appends, its first unit among them) run under
``lock_timeout`` = 1 ms, and one that would wait longer (``LockNotAvailable``) is left out
with every unit after it: the attempt is rolled back and runs again without them, and
they go back to the front of the queue, the first of them to lead the next batch, where it
may wait. A transaction waiting while it holds no lock cannot
be part of a cycle, and a wait that ends within 1 ms ends long before the deadlock detector
looks, so no deadlock comes of batching: only a unit that locks two rows in the opposite
order of another unit's could still meet one, as it would alone, and an append locks one
row. Leaving out the later units too keeps each caller's units in call order. (Locking a
batch's conversations in key order first, the other way, needs to know a unit's rows
before running it; a unit is a function.) A deadlock or a serialization failure that
happens anyway is a transient error, retried as below.

A unit that raises aborts the transaction (a failed statement aborts a PostgreSQL
transaction): it is rolled back and the batch runs again with a ``SAVEPOINT`` per unit, so
only the failing unit is left out and its caller alone gets the error, a database error as
a :class:`~fermix.errors.WriteFailedError` whose cause is psycopg's. A unit alone gets its
error at once, except:

**A unique violation runs the unit once more.** Another transaction (another process)
committed the same unique key between the unit's read and its insert: the insert waited
for that commit, then failed. Under READ COMMITTED the unit's reads, run again, see the
committed row: an append retried under the same client key then answers with the stored
message (N3) instead of failing.

Transient failures (:data:`TRANSIENT_ERRORS`: deadlock, serialization failure, a lost
connection, the server shutting down) retry the whole batch per the :class:`RetryPolicy`,
on a new connection when the old one broke. After the last attempt every unit of the batch
fails with :class:`WriteFailedError`; nothing of it was committed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import psycopg
import psycopg.errors
from psycopg import pq

from fermix.model import AppendResult, ConversationKey, NewMessage
from fermix.storage.appending import AppendUnit
from fermix.storage.leaders import GroupCommit, Unit
from fermix.storage.postgres.connection import (
    Conn,
    execute_prepared,
    forget_prepared,
    pipeline,
    remote,
    script,
    send,
    settle,
)
from fermix.storage.postgres.conversations import TOUCH_ALL, touch_all, touch_all_param
from fermix.storage.postgres.messages import (
    INSERT_ALL,
    document,
    insert_all,
    insert_all_param,
    insert_stemmed,
)
from fermix.storage.postgres.session import PgWrites
from fermix.storage.retry import DEFAULT_RETRY, RetryPolicy

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.errors.TransactionRollback,  # 40001 serialization failure, 40P01 deadlock
    psycopg.OperationalError,  # connection lost, admin shutdown, too many connections
)
NO_WAITING: Final = "SET LOCAL lock_timeout = '1ms'"
"""Sent after a batch's first unit: the units absorbed after it do not wait for a lock."""
Work = Callable[[PgWrites], Any]
T = TypeVar("T")


class PgCommitter(GroupCommit):
    """The group commit on PostgreSQL: one write connection, opened again if it breaks."""

    transient = TRANSIENT_ERRORS
    driver_error = psycopg.Error

    def __init__(
        self,
        connect: Callable[[], Conn],
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_batch: int = 512,
        pipelined: bool | None = None,
    ) -> None:
        self._connect = connect
        self._conn = connect()
        self._session = PgWrites(self._conn)
        self._pipelined = remote(self._conn) if pipelined is None else pipelined
        """Whether batches run in pipeline mode (by default: with a remote server)."""
        super().__init__(retry=retry, max_batch=max_batch)
        self.transient_failures = 0
        """Attempts at a batch that failed with a transient error, for tests and benchmarks."""
        self.deferred = 0
        """Units left for a later batch because a row they needed was locked."""
        self.grouped = 0
        """Appends stored with others in one touch and one insert (:func:`_append_all`)."""
        self._named = True
        """Whether a batch that is one run of plain appends goes out as one query
        (:meth:`_run_whole`): until its statements prepared by name vanish right away."""

    def _close_connection(self) -> None:
        self._conn.close()

    def _connection(self) -> Conn:
        """The write connection, opened again if it broke (the server restarted)."""
        if self._conn.closed or self._conn.broken:
            self._conn.close()
            self._conn = self._connect()
            self._session = PgWrites(self._conn)
        return self._conn

    def _commit(self, batch: list[Unit]) -> None:
        """One attempt at the batch; transient errors propagate for a retry of all of it."""
        try:
            self._attempt(batch)
        except TRANSIENT_ERRORS:
            self.transient_failures += 1
            raise

    def _attempt(self, batch: list[Unit]) -> None:
        absorb = True
        first_waits = False
        while True:
            conn = self._connection()
            left: int | None = None
            grouped = False
            try:
                grouped = not first_waits and _plain_append(batch[0]) is not None
                if grouped and absorb and self._queue:
                    self._absorb(batch)  # those queued by now join the first run
                appends = _plain_run(batch, 0) if grouped and self._named else []
                if appends and len(appends) == len(batch):
                    left = self._run_whole(conn, batch, appends, absorb=absorb)
                else:
                    left = self._run_statements(conn, batch, absorb=absorb, grouped=grouped)
            except TRANSIENT_ERRORS:
                self._rollback()
                raise
            except Exception as exc:  # noqa: BLE001 - a unit failed: isolate it, or hand it back
                self._rollback()
                if (
                    len(batch) == 1
                    and not grouped
                    and not isinstance(exc, psycopg.errors.UniqueViolation)
                ):
                    batch[0].fail(exc, psycopg.Error)
                else:
                    # A run's error is its units' to sort out: run alone, in a savepoint,
                    # each gets the error it would get alone (a NUL in its text, say).
                    self._commit_isolated(batch)
                return
            except BaseException:
                self._rollback()
                raise
            if left is None:
                break
            self._rollback()
            if left == 0:
                # A row of the batch's first run was locked: its first unit waits for its
                # own, holding none, then the others run as absorbed units do.
                log.debug("a row of the batch's first run is locked: its first unit waits")
                first_waits = True
                continue
            # Run again without the units that would have waited, absorbing no more.
            self._defer(batch, left)
            absorb = False
        for unit in batch:
            unit.ok = True

    def _run_statements(
        self, conn: Conn, batch: list[Unit], *, absorb: bool, grouped: bool
    ) -> int | None:
        """Run ``batch`` statement by statement (:meth:`_run`), pipelined with a remote
        server, and commit it unless a unit would have waited for a lock (its index)."""
        with pipeline(conn) if self._pipelined else contextlib.nullcontext():
            self._begin(conn, waiting=not grouped)
            self._session.drop_known()
            left = self._run(conn, batch, absorb=absorb, grouped=grouped)
            if left is None:
                send(conn, "COMMIT")
        return left

    def _run_whole(
        self,
        conn: Conn,
        batch: list[Unit],
        appends: list[tuple[AppendUnit, str | None]],
        *,
        absorb: bool,
    ) -> int | None:
        """Run and commit ``batch``, one run of plain appends (``appends``, its units' own),
        in one simple query: ``BEGIN`` with :data:`NO_WAITING`, the touch, the insert and
        ``COMMIT``, one round trip. None once committed, or 0 when a row of the run was
        locked (nothing of it then ran: the batch's first unit is to wait for its own).

        The touch and the insert are statements prepared by name on the connection
        (session state). When they are gone again right after being prepared, a pooler in
        transaction mode hands this connection's transactions to other server sessions:
        from then on this committer runs its batches statement by statement, as psycopg's
        own prepared statements pass such a pooler (PgBouncer's ``max_prepared_statements``)."""
        self._session.drop_known()
        touched, news, documents = _run_rows(appends)
        touch = touch_all_param(touched)
        insert, read = insert_all_param(news, documents)
        for attempt in range(2):
            try:
                statements = [
                    "BEGIN",
                    NO_WAITING,
                    execute_prepared(conn, "fermix_touch_all", TOUCH_ALL, touch),
                    execute_prepared(conn, "fermix_insert_all", INSERT_ALL, insert),
                    "COMMIT",
                ]
                *_, returned, _ = script(conn, statements)
                break
            except psycopg.errors.LockNotAvailable:
                return 0
            except (
                psycopg.errors.InvalidSqlStatementName,
                psycopg.errors.DuplicatePreparedStatement,
            ):
                # psycopg deallocates every statement prepared on its connection after a
                # ROLLBACK or DDL there (its own cache's rule), ours too: prepare again.
                self._rollback()
                forget_prepared(conn)
                if attempt:
                    log.info("named statements do not last on this connection (a pooler?)")
                    self._named = False
                    return self._run_statements(conn, batch, absorb=absorb, grouped=True)
        for unit, result in zip(batch, read(returned), strict=True):
            unit.value = AppendResult(result, replayed=False)
        self.grouped += len(appends)
        return None

    def _begin(self, conn: Conn, *, waiting: bool) -> None:
        """Open the batch's transaction; unless ``waiting`` (its first unit may wait for a
        lock), with :data:`NO_WAITING` from the start, in the same round trip when the
        batch is not pipelined (one simple query of two statements)."""
        if waiting:
            send(conn, "BEGIN")
        elif self._pipelined:
            send(conn, "BEGIN")
            send(conn, NO_WAITING)
        else:
            conn.execute(f"BEGIN; {NO_WAITING}")

    def _run(self, conn: Conn, batch: list[Unit], *, absorb: bool, grouped: bool) -> int | None:
        """Run the batch's units, then (with ``absorb``) those queued meanwhile; return the
        index of the first unit that would have waited for a lock (it and those after it
        are to be left out; 0: a row of the first run, which then runs with its first unit
        alone and waiting), or None when all ran.

        A run of plain appends is stored together (:func:`_append_all`): with ``grouped``
        the batch starts with one, its first unit among them (the transaction began with
        :data:`NO_WAITING`; a batch that is that run alone went to :meth:`_run_whole`
        instead; one append alone runs its own two statements, cheaper for the server than
        a run of one); otherwise the first unit runs alone, waiting for its rows as long as
        it must, and the runs come after it."""
        session = self._session
        ran = 0
        if grouped and absorb and self._queue:
            self._absorb(batch)  # those queued as the transaction began join the first run
        if not grouped:
            batch[0].value = batch[0].work(session)  # a result, not an outcome until committed
            ran = 1
        while ran < len(batch) or (absorb and self._queue and self._absorb(batch)):
            if ran == 1 and not grouped:
                send(conn, NO_WAITING)
            index = ran
            while index < len(batch):
                appends = _plain_run(batch, index)
                try:
                    if len(appends) > 1:
                        for unit, result in zip(
                            batch[index:], _append_all(conn, session, appends), strict=False
                        ):
                            unit.value = result
                        self.grouped += len(appends)
                    elif appends and (stems := appends[0][1]) is not None:
                        batch[index].value = _append_one(conn, session, appends[0][0], stems)
                        settle(conn)
                    else:
                        batch[index].value = batch[index].work(session)
                        settle(conn)  # its statements' errors are its own
                except psycopg.errors.LockNotAvailable:
                    return index
                index += max(len(appends), 1)
            ran = len(batch)
        return None

    def _defer(self, batch: list[Unit], start: int) -> None:
        """Put ``batch[start:]`` back at the front of the queue, in order."""
        left = batch[start:]
        del batch[start:]
        with self._mutex:
            self._queue.extendleft(reversed(left))
        self.deferred += len(left)
        log.debug("%d write(s) wait for rows another transaction holds: next batch", len(left))

    def _commit_isolated(self, batch: list[Unit]) -> None:
        """The batch again, each unit in a savepoint, leaving out the ones that raise (and,
        as in :meth:`_attempt`, those from the first that would wait for a lock on)."""
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            self._session.drop_known()
            outcomes: list[tuple[bool, Any]] = []
            for index, unit in enumerate(batch):
                if index == 1:
                    conn.execute(NO_WAITING)
                outcome = self._savepointed(conn, unit.work, first=index == 0)
                if outcome is None:
                    self._defer(batch, index)
                    break
                outcomes.append(outcome)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._hand_out(batch, outcomes)

    def _savepointed(self, conn: Conn, work: Work, *, first: bool) -> tuple[bool, Any] | None:
        """Run ``work`` in a savepoint: its outcome, or None when it would have waited for
        a lock (not ``first``: rolled back, to run in a later batch)."""
        for attempt in range(2):
            conn.execute("SAVEPOINT unit")
            try:
                value = work(self._session)
            except TRANSIENT_ERRORS:
                raise
            except Exception as exc:  # noqa: BLE001 - handed to this unit's caller
                conn.execute("ROLLBACK TO SAVEPOINT unit")
                conn.execute("RELEASE SAVEPOINT unit")
                self._session.drop_known()
                if not first and isinstance(exc, psycopg.errors.LockNotAvailable):
                    return None
                if attempt == 0 and isinstance(exc, psycopg.errors.UniqueViolation):
                    continue  # another transaction committed the key: read it this time
                return (False, exc)
            conn.execute("RELEASE SAVEPOINT unit")
            return (True, value)
        raise AssertionError("unreachable")

    def _rollback(self) -> None:
        try:
            conn = self._conn
            if conn.closed or conn.info.transaction_status == pq.TransactionStatus.IDLE:
                pass
            elif self._pipelined:
                conn.rollback()  # and forget the prepared statements (the module's docstring)
            else:
                conn.execute("ROLLBACK")
        except psycopg.OperationalError:
            self._conn.close()  # broken: the next attempt connects again
        finally:
            self._session.drop_known()


@dataclass(frozen=True, slots=True)
class StemmedAppend:
    """A plain append (:attr:`AppendUnit.plain`) with its message's stems, made by its
    caller before it queued (:func:`stemmed`): the leader of a batch, every caller of which
    waits on it, then does not make them (about 25 us an append on this machine), and the
    callers make theirs while the batch before theirs waits on the server."""

    unit: AppendUnit
    stems: str

    def __call__(self, writes: PgWrites) -> AppendResult:
        """Run as any unit, through the port (the stems made again): in a savepoint, or
        first in a batch that waits for its row (:func:`_append_one` runs it with them)."""
        return self.unit(writes)


def stemmed(unit: Callable[[Any], T]) -> Callable[[Any], T]:
    """``unit``, as a :class:`StemmedAppend` when it is a plain append."""
    if isinstance(unit, AppendUnit) and unit.plain:
        new = unit.new
        return StemmedAppend(unit, document(new.content, new.key, new.owner_id))  # type: ignore[return-value]
    return unit


def _plain_append(unit: Unit) -> tuple[AppendUnit, str | None] | None:
    """``unit``'s append and its stems (None: not made yet) when it is a plain append."""
    work = unit.work
    if isinstance(work, StemmedAppend):
        return work.unit, work.stems
    if isinstance(work, AppendUnit) and work.plain:
        return work, None
    return None


def _plain_run(batch: list[Unit], start: int) -> list[tuple[AppendUnit, str | None]]:
    """The run of plain appends (:attr:`AppendUnit.plain`) in distinct conversations that
    starts at ``batch[start]`` (empty when that unit is none), each with its stems when
    made."""
    keys: set[ConversationKey] = set()
    run: list[tuple[AppendUnit, str | None]] = []
    for unit in batch[start:]:
        append = _plain_append(unit)
        if append is None or append[0].new.key in keys:
            break
        keys.add(append[0].new.key)
        run.append(append)
    return run


def _append_one(conn: Conn, session: PgWrites, append: AppendUnit, stems: str) -> AppendResult:
    """A plain append alone, as :class:`AppendUnit` runs it, with the stems its caller made
    (its own touch and single-row insert: a run of one costs the server more)."""
    session.touch_known(append.new.key, append.owner_id, append.trust)
    return AppendResult(insert_stemmed(conn, append.new, stems), replayed=False)


def _append_all(
    conn: Conn, session: PgWrites, appends: list[tuple[AppendUnit, str | None]]
) -> list[AppendResult]:
    """Run ``appends`` (plain, in distinct conversations) as each would run alone, in two
    statements for all: their conversations touched in their order (each row then locked,
    as by one touch), their messages inserted in their order (ids drawn in it). In a
    pipeline both go out at once. An error fails the run as a whole; the committer then
    runs its units one by one, each in a savepoint, so the error reaches its own unit.

    The touch goes around ``session``'s :meth:`~PgWrites.touch_known`, so what the session
    knows of those rows is dropped: a later unit of the batch that gives one of them its
    earlier owner or trust back touches it again."""
    session.drop_known()
    touched, news, documents = _run_rows(appends)
    touch_all(conn, touched)
    stored = insert_all(conn, news, documents)
    return [AppendResult(message, replayed=False) for message in stored]


def _run_rows(
    appends: list[tuple[AppendUnit, str | None]],
) -> tuple[list[tuple[ConversationKey, str, str]], list[NewMessage], list[str]]:
    """What a run of plain appends touches and inserts: each conversation's ``(key,
    owner_id, trust)``, the messages, and their stems (made here for an append whose caller
    did not make them)."""
    touched = [(a.new.key, a.owner_id, a.trust) for a, _ in appends]
    news = [a.new for a, _ in appends]
    documents = [
        document(new.content, new.key, new.owner_id) if stems is None else stems
        for new, (_, stems) in zip(news, appends, strict=True)
    ]
    return touched, news, documents
