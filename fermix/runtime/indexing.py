"""``Indexer``: the background embedder of one process (Q2), and the query vectors of search.

Nothing is embedded on the acknowledged path. An append wakes the indexer (:meth:`wake`,
an event set), whose thread then embeds in batches of ``batch_size`` what has no vector
yet, oldest first: messages, then live memory rows. While batches come full and no append
comes, each next batch is twice as large, up to ``max_batch_size`` (:func:`next_batch`): a
backlog (a burst of appends, a rebuild, another model) drains in fewer reads, transactions
and hand-offs to the writer; the first append brings it back to ``batch_size``. Each
batch is read in a read unit, embedded off any lock, and stored in one write through the
writer, where a row that went away meanwhile, or got its vector from another process, is
skipped. It looks for rows without a vector, so a crash loses nothing: the next start finds
them again. Without an append it looks again every ``poll_s`` seconds (memory rows are
written by reviews, and other processes append too), and from the first row every
``rescan_s``.

The indexer yields to appends, which share the process (its GIL, its CPUs) and the writer
with it: woken, it waits until no append came for ``settle_s`` (at most ``max_delay_s``),
and after a batch during which appends came it waits again, at most ``yield_factor`` times
the batch's own time, so that under a steady stream of appends it takes a bounded share of
the process and vectors still follow (bench/append.py measures appends with it on).
``settle_s`` is 10 ms: a pause is some hundred times the gap between a burst's appends (one
append takes 0.1-0.2 ms), and every millisecond of it is added to the time until a burst is
searchable (LoCoMo's 2,760 turns from one thread, bench/peers.py: 0.36 s of appends, then
the pause, then 0.19 s of embedding; 50 ms of it was a tenth of the whole). Embedding with
no pause at all doubled those appends' time (the GIL, below).

Why it waits rather than embed beside the appends on a second core: its work is not free of
the GIL the appends share (tokenizing, pooling, building rows all hold it). Embedding ahead
while appends streamed, holding the vectors and storing them when the appends paused, was
measured (issue 25): it embedded some 1,000 of LoCoMo's 2,760 turns before their appends
ended, but under bench/append.py's 8 appending threads their p99 went from 3.0-4.5 ms to
7.9-9.5 ms and their rate from 10,400-11,500 to 8,200-8,800 a second. The time until
searchable is cut instead by what a batch costs (:mod:`fermix.embedding`'s pooling and
token weights, one call a scope, a word's tokens looked up).

A forked child runs none of its parent's indexers: :meth:`Indexer.stop` there joins no
thread, and the module's registry and lock start afresh (``os.register_at_fork``).

At start the indexer records its model and dimension (``embedding_model``); when another
was recorded, every vector is dropped and computed again in the background. If another
process records a different model later, this one stops embedding and its searches use no
vectors (the last process started wins, and ``fermix doctor`` reports the mismatch).

A search finds its process's indexer by its store (:func:`active`: the file, or the
PostgreSQL database without its password); without one (embedding off, or a plain storage
session) search is full-text only.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import chain

import numpy as np
from numpy.typing import NDArray

from fermix.config import EmbeddingConfig
from fermix.embedding import Embedder, EmbeddingError, TokenCounts, from_config, to_blob, to_int8
from fermix.errors import FermixError
from fermix.runtime.writer import Writer
from fermix.storage import Reads, Storage, Writes
from fermix.storage.port import PendingText, StoredVector

log = logging.getLogger(__name__)

BATCH_GROWTH = 4
"""``max_batch_size`` by default: this many times ``batch_size``. A grown batch drains a
backlog with fewer writes (2,760 LoCoMo turns: 128 rows a batch took 0.28 s, 32 took 0.31 s,
256 no less than 128), and an append that comes during one waits for its write: 4x keeps
that write short."""

Progress = Callable[[int], None]
"""Told how many rows a batch embedded (``fermix index rebuild``'s progress bar)."""


class Indexer:
    """Embeds what has no vector yet, in batches, on its own thread (Q2)."""

    def __init__(
        self,
        db: Storage,
        writer: Writer,
        embedder: Embedder,
        *,
        batch_size: int = 32,
        max_batch_size: int | None = None,
        poll_s: float = 5.0,
        rescan_s: float = 600.0,
        retry_s: float = 30.0,
        settle_s: float = 0.01,
        max_delay_s: float = 2.0,
        yield_factor: float = 4.0,
    ) -> None:
        self.db = db
        self.writer = writer
        self.embedder = embedder
        self.batch_size = batch_size
        self.max_batch_size = max(
            batch_size, BATCH_GROWTH * batch_size if max_batch_size is None else max_batch_size
        )
        self._batch = batch_size
        """The size of the next batch (:func:`next_batch`)."""
        self.poll_s = poll_s
        self.rescan_s = rescan_s
        self.retry_s = retry_s
        self.settle_s = settle_s
        self.max_delay_s = max_delay_s
        self.yield_factor = yield_factor
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._waking = threading.Lock()
        """Orders :meth:`wake` with the thread's check before it says it is idle."""
        self._woken = 0
        """Counts :meth:`wake` calls: the thread waiting for appends to pause reads it, so
        that an append wakes no thread (only the first after a pass sets ``_wake``)."""
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        """The process whose thread this is: a forked child has none of its parent's."""
        self._lock = threading.Lock()
        self._recorded: tuple[str, int] | None = None
        self._message_cursor = 0
        self._memory_cursor = 0
        self._scanned_at = time.monotonic()
        self.embedded = 0
        """Rows this indexer embedded since it started."""

    @classmethod
    def from_config(cls, db: Storage, writer: Writer, config: EmbeddingConfig) -> Indexer | None:
        """The indexer ``[fermix_core.embedding]`` asks for, or None when it is off."""
        if not config.enabled:
            return None
        embedder = from_config(
            config.model, api_base=config.api_base, api_key_env=config.api_key_env
        )
        return cls(db, writer, embedder, batch_size=config.batch_size)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (it loads the model and records it first, off the caller's path)."""
        with self._lock:
            if self._thread is None:
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="fermix-embedder", daemon=True
                )
                self._thread.start()
        register(self.db, self)

    def wake(self) -> None:
        """Something was stored: look for rows without a vector (once appends pause).

        On the append path: while ``_wake`` is set (and so ``_idle`` clear, and a pass
        due), it only counts."""
        self._woken += 1
        if not self._wake.is_set():
            with self._waking:
                self._idle.clear()
                self._wake.set()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until the thread found nothing to embed since the last :meth:`wake`."""
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread after the batch under way (at most ``timeout`` seconds)."""
        unregister(self.db, self)
        thread = self._thread
        if thread is not None and self._pid != os.getpid():
            # Started by the process this one was forked from: its thread stayed there, and
            # its events' locks may be held by it forever. Nothing here to stop or join.
            return
        self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # what is stored from here on wakes the next pass
            started = time.monotonic()
            try:
                busy = self.step()
            except (FermixError, OSError) as exc:
                log.warning("background embedding paused for %g s: %s", self.retry_s, exc)
                self._stop.wait(self.retry_s)
                continue
            if busy:
                if self._wake.is_set():  # appends came meanwhile: let them have the process
                    spent = time.monotonic() - started
                    self._settle(max(self.settle_s, self.yield_factor * spent))
                continue
            with self._waking:
                if not self._wake.is_set():
                    self._idle.set()
            if self._wake.wait(self.poll_s):
                self._settle(self.max_delay_s)

    def _settle(self, budget: float) -> None:
        """Wait until no :meth:`wake` came for ``settle_s``, or ``budget`` seconds passed
        (sleeping, never woken by an append: :attr:`_woken` says whether any came)."""
        end = time.monotonic() + budget
        while not self._stop.is_set():
            seen = self._woken
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._stop.wait(min(self.settle_s, remaining))
            if self._woken == seen:
                return

    # -- the work -----------------------------------------------------------------------

    def record(self) -> tuple[str, int]:
        """Record this indexer's model as the vectors' (dropping any of another model)."""
        recorded = (self.embedder.name, self.embedder.dimension())
        changed = self.writer.write(
            lambda w: w.record_embedding_model(*recorded), label="record embedding model"
        )
        if changed:
            log.debug("embedding model %s (%d dims) recorded; embedding again", *recorded)
            self.rewind()
        self._recorded = recorded
        return recorded

    def rewind(self) -> None:
        """Look for rows without a vector from the first row again."""
        self._message_cursor = self._memory_cursor = 0
        self._scanned_at = time.monotonic()

    def usable(self, reads: Reads) -> bool:
        """Whether the stored vectors are this indexer's model's."""
        recorded = self._recorded
        return recorded is not None and reads.embedding_model() == recorded

    def step(self) -> bool:
        """Embed one batch; returns whether there was any work."""
        if self._recorded is None:
            self.record()
        if time.monotonic() - self._scanned_at > self.rescan_s:
            self.rewind()
        woken, limit = self._woken, self._batch
        with self.db.read() as reads:
            if not self.usable(reads):
                return False  # another process recorded another model since
            messages = reads.messages_to_embed(after_id=self._message_cursor, limit=limit)
            memories = (
                []
                if messages
                else reads.memories_to_embed(after_id=self._memory_cursor, limit=limit)
            )
            pending = messages or memories
            if not pending:
                self._memory_cursor = 0  # rows whose text changed lost their vector
                self._batch = self.batch_size
                return False
            items = self._vectors(reads, pending)
        recorded = self._recorded

        def unit(writes: Writes) -> int:
            if writes.embedding_model() != recorded:
                return 0
            if messages:
                return writes.store_message_vectors(items)
            return writes.store_memory_vectors(items)

        self.writer.write(unit, label="embed messages" if messages else "embed memory rows")
        if messages:
            self._message_cursor = pending[-1].id
        else:
            self._memory_cursor = pending[-1].id
        self.embedded += len(items)
        self._batch = next_batch(
            limit,
            self.batch_size,
            self.max_batch_size,
            full=len(pending) == limit,
            appended=self._woken != woken,
        )
        return True

    def catch_up(self, progress: Progress = lambda n: None) -> int:
        """Embed batches until nothing is left (``fermix index rebuild``); returns how many."""
        done = 0
        self.rewind()
        while not self._stop.is_set():
            before = self.embedded
            if not self.step():
                break
            progress(self.embedded - before)
            done += self.embedded - before
        return done

    def _vectors(self, reads: Reads, pending: Sequence[PendingText]) -> list[StoredVector]:
        texts = [p.text for p in pending]
        tokens = self.embedder.tokens(texts)
        vectors = np.zeros((len(pending), self._recorded[1] if self._recorded else 0), np.float32)
        if not self.embedder.counts_tokens:
            vectors = self.embedder.embed(texts)
        else:
            # Each scope in one call, its rows in parts of batch_size as batches of batch_size
            # would be: a larger batch (next_batch) gives each row the vector it would have had.
            for scope in dict.fromkeys(p.scope for p in pending):
                rows = [i for i, p in enumerate(pending) if p.scope == scope]
                seen = set(chain.from_iterable(tokens[i] for i in rows))
                counts = self.counts(reads, [scope], seen)
                vectors[rows] = self.embedder.embed(
                    [texts[i] for i in rows],
                    tokens=[tokens[i] for i in rows],
                    counts=counts,
                    parts=[i // self.batch_size for i in rows],
                )
        blobs = to_int8(vectors)
        return [
            StoredVector(p.id, p.scope, to_blob(blobs[i]), tokens[i]) for i, p in enumerate(pending)
        ]

    # -- search -------------------------------------------------------------------------

    def counts(self, reads: Reads, scopes: Iterable[str], tokens: Iterable[int]) -> TokenCounts:
        """The token counts of ``scopes`` for ``tokens`` (and their total)."""
        found, total = reads.token_counts(list(scopes), list(tokens))
        return TokenCounts(found, total)

    def query(self, reads: Reads, text: str, scopes: Iterable[str]) -> NDArray[np.float32] | None:
        """``text``'s unit vector, weighted by the counts of ``scopes``; None when the
        stored vectors are of another model, the text has no token, or the model failed."""
        if not self.usable(reads):
            return None
        try:
            tokens = self.embedder.tokens([text])
            counts = self.counts(reads, scopes, tokens[0]) if self.embedder.counts_tokens else None
            vector: NDArray[np.float32] = self.embedder.embed([text], tokens=tokens, counts=counts)[
                0
            ]
        except EmbeddingError as exc:
            log.warning("search without vectors: %s", exc)
            return None
        recorded = self._recorded
        if recorded is None or len(vector) != recorded[1] or not np.any(vector):
            return None
        return vector


def next_batch(current: int, base: int, ceiling: int, *, full: bool, appended: bool) -> int:
    """The size of the batch after one of ``current`` rows: ``base`` when appends came
    meanwhile (they get the process back soonest) or the batch was not full (the backlog is
    done), else twice ``current``, at most ``ceiling`` (Q2)."""
    if appended or not full:
        return base
    return min(2 * current, max(ceiling, base))


# -- which indexer serves a database --------------------------------------------------

_ACTIVE: dict[str, list[Indexer]] = {}
_ACTIVE_LOCK = threading.Lock()


def _after_fork() -> None:
    # A forked child runs none of its parent's indexers (their threads stayed behind), and
    # the lock may have been held by one of them at the fork: both start afresh.
    global _ACTIVE_LOCK
    _ACTIVE_LOCK = threading.Lock()
    _ACTIVE.clear()


os.register_at_fork(after_in_child=_after_fork)


@functools.lru_cache(maxsize=64)
def _store(name: str) -> str:
    """One registry key per store, however it was named: a file's real path (the name
    SQLite gives its own file, symbolic links resolved), a URL as it is."""
    return os.path.realpath(name) if os.path.isabs(name) else name


def _names(db: Storage) -> set[str]:
    """The names a search may give ``db``'s store: its port's ``key``, and its sessions'
    ``database_file``, which may spell the same store otherwise (SQLite resolves links;
    PostgreSQL names the database from the connection, the key from the URL)."""
    with db.read() as reads:
        return {_store(db.key), _store(reads.database_file())}


def register(db: Storage, indexer: Indexer) -> None:
    """Make ``indexer`` serve the searches of the store ``db`` opens."""
    names = _names(db)
    with _ACTIVE_LOCK:
        for name in names:
            _ACTIVE.setdefault(name, []).append(indexer)


def unregister(db: Storage, indexer: Indexer) -> None:
    """Stop ``indexer`` serving searches."""
    with _ACTIVE_LOCK:
        for key, found in list(_ACTIVE.items()):
            if indexer in found:
                found.remove(indexer)
            if not found:
                del _ACTIVE[key]


def active(reads: Reads) -> Indexer | None:
    """The running indexer of the store ``reads`` reads, if this process has one (found
    by the session's ``database_file``)."""
    if not _ACTIVE:
        return None
    key = _store(reads.database_file())
    with _ACTIVE_LOCK:
        found = _ACTIVE.get(key)
        return found[-1] if found else None
