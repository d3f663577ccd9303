"""Append throughput, latency and footprint of fermix's conversation path, with baselines.

Usage: ``python bench/append.py [--quick]``

Everything runs in one process, each section in its own temporary home, each figure next to
a baseline measured in the same run:

(a) one conversation appends messages one after another through the public API
    (``Memory.conversation(...).append_user``), against raw apsw inserting the same rows
    into a database opened with ``fermix.storage.open_database`` (same schema, triggers,
    indexes and connection settings), one ``BEGIN IMMEDIATE; INSERT; COMMIT`` each.
    Target: fermix at least 0.5x raw.
(b) 64 conversations fed by 8 threads (each thread owns 8 and cycles through them):
    acknowledged appends per second over all threads, against the raw single-thread figure
    of (a). The committer's transaction count shows how many appends shared a commit.
    Target: at least 1.0x raw.
(c) p50 / p99 latency of one append in microseconds, for (a) and (b) separately.
(d) threads (``threading.active_count()``) and RSS after 10,000 distinct conversations
    were each touched once, an append and a read (``--quick``: 1,000), with
    ``conversation_cap`` at its default.
    Target: threads stay within the cap plus a few service threads.
(e) LangChain's ``SQLChatMessageHistory.add_message`` doing (a) on a SQLite file (the
    first 1,000 of its messages; ``--quick``: 60), as a user gets it (SQLAlchemy's
    defaults: rollback journal, ``synchronous=FULL``) and, to separate the library from
    the fsyncs, with fermix's settings (WAL, ``synchronous=NORMAL``). An optional peer
    (``pip install -e '.[bench]'``); null when not installed.
    Target: fermix at least 10x the LangChain figure (the first row).

(f) (a) with tracing off, as shipped (the metrics count every append, O1; no span is made,
    O2), against the same path with no instrumentation at all (the runtime's
    ``instrumented`` switched off: no clock read, no count on the append path), on two
    Memories appending in turn, message by message, the one going first swapped each time:
    ``tracing_off_overhead_pct`` is how much longer the median append takes with the
    instrumentation, in per cent (``_mean``: the mean of the fastest 90 %; a mean of them all
    is the WAL's occasional fsync, which lands on either). Target: at most 3 %.

(a), (b), (e) and the raw baseline run in interleaved rounds, in a rotating order, so that
a change in machine load during the run hits them alike; after each measure the background
embedder (issue 14) is let finish, untimed, so its deferred work is not timed against the
next measure (the appends themselves never wait for it: it yields while they come); the
one-minute load average at start and end is in the JSON line, since a busy machine moves
every figure.

How to read it: a ratio is fermix's acknowledged messages per second over the baseline's,
so above 1 is faster; the table marks each target met or missed. Every append is timed
alone with ``time.perf_counter_ns`` after a warm-up that is not counted. The last line
printed is one JSON object with the headline numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fermix import Conversation, Memory
from fermix.storage.sqlite.migrations import open_database

AGENT, CHANNEL, OWNER = "bench", "cli", "alice"
THREADS, CONVERSATIONS_PER_THREAD = 8, 8
ROUNDS = 5
THREAD_SLACK = 16  # main, supervisors, sweeper, the checkpointer, actors still exiting
TARGET_SEQ, TARGET_CONCURRENT, TARGET_LANGCHAIN = 0.5, 1.0, 10.0
TARGET_OVERHEAD_PCT = 3.0
_VOCABULARY = (
    "porto moved last month weather rain coffee train meeting doctor sister birthday "
    "python garden book holiday lisbon friday dinner budget project deadline music guitar "
    "running marathon knee recipe bread flat rent neighbour dog walk morning office remote"
)
_RAW_INSERT = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)

Append = Callable[[str], object]


@dataclass(frozen=True)
class Sizes:
    """How much work each section does."""

    sequential: int
    concurrent: int
    conversations: int
    langchain: int
    warmup: int


FULL = Sizes(sequential=5000, concurrent=20000, conversations=10000, langchain=1000, warmup=300)
QUICK = Sizes(sequential=1000, concurrent=2000, conversations=1000, langchain=60, warmup=100)


@dataclass(frozen=True)
class Run:
    """Appends timed one by one: how many, the wall time over all, each one's latency."""

    count: int
    elapsed_ns: int
    latencies_ns: Sequence[int]

    @property
    def rate(self) -> float:
        """Acknowledged appends per second."""
        return self.count / (self.elapsed_ns / 1e9)

    def percentile_us(self, q: float) -> float:
        """The ``q``-th percentile latency (nearest rank), in microseconds."""
        ordered = sorted(self.latencies_ns)
        rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
        return ordered[rank] / 1000

    @staticmethod
    def merge(runs: Sequence[Run]) -> Run:
        """The rounds of one measure as a single run."""
        return Run(
            sum(r.count for r in runs),
            sum(r.elapsed_ns for r in runs),
            [ns for r in runs for ns in r.latencies_ns],
        )


@dataclass(frozen=True)
class Footprint:
    """Threads and memory before and after touching many conversations once each."""

    conversations: int
    cap: int
    threads_before: int
    threads_after: int
    live_actors: int
    rss_mb_before: float
    rss_mb_after: float
    elapsed_ns: int

    @property
    def bounded(self) -> bool:
        """Whether the live threads stayed within the cap plus the service threads."""
        return self.threads_after <= self.cap + THREAD_SLACK


def texts(count: int, seed: int = 7) -> list[str]:
    """``count`` distinct chat-like messages, the same for fermix and its baselines."""
    rng = random.Random(seed)
    words = _VOCABULARY.split()
    return [f"{i}: " + " ".join(rng.choices(words, k=14)) for i in range(count)]


def chunks(items: Sequence[str], n: int) -> list[Sequence[str]]:
    """``items`` cut into ``n`` consecutive pieces of near-equal size."""
    bounds = [len(items) * i // n for i in range(n + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(n)]


def rss_mb() -> float:
    """This process's resident set size in MB (Linux ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(append: Append, measured: Sequence[str]) -> Run:
    """Call ``append`` on each text, timing each call and the whole."""
    latencies: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    for text in measured:
        t0 = clock()
        append(text)
        latencies.append(clock() - t0)
    return Run(len(measured), clock() - start, latencies)


@contextlib.contextmanager
def raw_writer(chat_id: str) -> Iterator[Append]:
    """Raw apsw on fermix's schema and settings: one ``BEGIN IMMEDIATE; INSERT; COMMIT``."""
    with tempfile.TemporaryDirectory(prefix="fermix-bench-raw-") as tmp:
        conn = open_database(Path(tmp) / "memory.db")

        def append(text: str) -> None:
            row = (AGENT, OWNER, CHANNEL, chat_id, "", OWNER, "user", "chat", text, "{}")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_RAW_INSERT, (*row, time.time_ns() // 1_000_000))
            conn.execute("COMMIT")

        try:
            yield append
        finally:
            conn.close()


@contextlib.contextmanager
def fermix_memory(prefix: str, *, instrumented: bool = True, **options: Any) -> Iterator[Memory]:
    """A running :class:`Memory` on a fresh temporary home; ``instrumented=False`` is (f)'s
    baseline: no metrics nor tracing hooks on the append path."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        memory = Memory(tmp, **options)
        memory._runtime.instrumented = instrumented  # no public equivalent: a bench's switch
        with memory:
            yield memory


def settle(*memories: Memory) -> None:
    """Wait, untimed, until the background embedder of each memory has embedded what the
    last measure appended (Q2): its deferred work would otherwise land on whichever
    measure runs next, the raw baseline's included."""
    for memory in memories:
        indexer = memory._runtime.services.indexer  # the embedder; no public equivalent
        if indexer is not None and not indexer.wait_idle(120):
            raise RuntimeError("the background embedder did not settle within 120 s")


class Feeder:
    """8 threads, each owning 8 conversations and appending to them in turn."""

    def __init__(self, memory: Memory, pool: ThreadPoolExecutor) -> None:
        self.memory = memory
        self._pool = pool
        self._convs: list[list[Conversation]] = [
            [
                memory.conversation(AGENT, CHANNEL, f"t{t}-c{c}", owner_id=OWNER)
                for c in range(CONVERSATIONS_PER_THREAD)
            ]
            for t in range(THREADS)
        ]
        self.batches = 0
        """Transactions the committer used for the measured appends."""

    def warm(self, warm: Sequence[str]) -> None:
        """Start every actor and write its state row; not measured."""
        flat = [conv for convs in self._convs for conv in convs]
        for i, text in enumerate(warm):
            flat[i % len(flat)].append_user(text)

    def feed(self, measured: Sequence[str]) -> Run:
        """All threads at once, each on its share of ``measured``; timed from first to last."""
        shares = chunks(measured, THREADS)
        barrier = threading.Barrier(THREADS)

        def one(t: int) -> tuple[int, int, list[int]]:
            convs, clock = self._convs[t], time.perf_counter_ns
            latencies: list[int] = []
            barrier.wait()
            start = clock()
            for i, text in enumerate(shares[t]):
                t0 = clock()
                convs[i % CONVERSATIONS_PER_THREAD].append_user(text)
                latencies.append(clock() - t0)
            return start, clock(), latencies

        # the database's commit count; no public equivalent
        db = self.memory._runtime.services.storage
        before = db.commits
        results = list(self._pool.map(one, range(THREADS)))
        self.batches += db.commits - before
        elapsed = max(end for _, end, _ in results) - min(start for start, _, _ in results)
        latencies = [ns for _, _, lat in results for ns in lat]
        return Run(len(latencies), elapsed, latencies)


@dataclass(frozen=True)
class Throughput:
    """Sections (a) and (b) with their raw baseline."""

    raw: Run
    sequential: Run
    concurrent: Run
    batches: int
    langchain: Run | None
    langchain_wal: Run | None


def timed_round(append: Append, rounds: Sequence[Sequence[str]], r: int) -> Run:
    """:func:`timed` on the texts of round ``r``."""
    return timed(append, rounds[r])


def throughput(sizes: Sizes, pool_of_texts: Sequence[str]) -> Throughput:
    """(a), (b) and (e) with their baselines, in interleaved rounds of rotating order."""
    warm, body = pool_of_texts[: sizes.warmup], pool_of_texts[sizes.warmup :]
    seq_rounds = chunks(body[: sizes.sequential], ROUNDS)
    conc_rounds = chunks(body[: sizes.concurrent], ROUNDS)
    lc_rounds = chunks(body[: sizes.langchain], ROUNDS)
    runs: dict[str, list[Run]] = {"raw": [], "seq": [], "conc": [], "lc": [], "lc_wal": []}
    with contextlib.ExitStack() as stack:
        raw_append = stack.enter_context(raw_writer("seq"))
        lc_append = stack.enter_context(langchain_writer(fermix_settings=False))
        lc_wal_append = stack.enter_context(langchain_writer(fermix_settings=True))
        seq_memory = stack.enter_context(fermix_memory("fermix-bench-seq-"))
        conc_memory = stack.enter_context(fermix_memory("fermix-bench-conc-"))
        pool = stack.enter_context(ThreadPoolExecutor(THREADS, thread_name_prefix="bench-feed"))
        seq_append = seq_memory.conversation(AGENT, CHANNEL, "seq", owner_id=OWNER).append_user
        feeder = Feeder(conc_memory, pool)
        for text in warm:
            raw_append(text)
            seq_append(text)
        feeder.warm(warm)
        measures: list[tuple[str, Callable[[int], Run]]] = [
            ("raw", functools.partial(timed_round, raw_append, seq_rounds)),
            ("seq", functools.partial(timed_round, seq_append, seq_rounds)),
            ("conc", lambda r: feeder.feed(conc_rounds[r])),
        ]
        for name, lc in (("lc", lc_append), ("lc_wal", lc_wal_append)):
            if lc is not None:
                for text in warm[: sizes.warmup // 10]:
                    lc(text)
                measures.append((name, functools.partial(timed_round, lc, lc_rounds)))
        for r in range(ROUNDS):
            shift = r % len(measures)
            for name, measure in measures[shift:] + measures[:shift]:
                runs[name].append(measure(r))
                settle(seq_memory, conc_memory)
    return Throughput(
        raw=Run.merge(runs["raw"]),
        sequential=Run.merge(runs["seq"]),
        concurrent=Run.merge(runs["conc"]),
        batches=feeder.batches,
        langchain=Run.merge(runs["lc"]) if runs["lc"] else None,
        langchain_wal=Run.merge(runs["lc_wal"]) if runs["lc_wal"] else None,
    )


@dataclass(frozen=True)
class Overhead:
    """(f): the appends of the instrumented path and of the bare one, timed in turn."""

    instrumented: Run
    bare: Run

    @property
    def median_pct(self) -> float:
        """How much longer the median instrumented append takes, in per cent."""
        return (self.instrumented.percentile_us(50) / self.bare.percentile_us(50) - 1) * 100

    @property
    def trimmed_mean_pct(self) -> float:
        """The same over the mean of each side's fastest 90 % of appends."""

        def trimmed(run: Run) -> float:
            fastest = sorted(run.latencies_ns)[: max(1, len(run.latencies_ns) * 9 // 10)]
            return sum(fastest) / len(fastest)

        return (trimmed(self.instrumented) / trimmed(self.bare) - 1) * 100


def overhead(sizes: Sizes, pool_of_texts: Sequence[str]) -> Overhead:
    """(f): tracing off against no instrumentation, one append each in turn."""
    warm, body = pool_of_texts[: sizes.warmup], pool_of_texts[sizes.warmup :]
    measured = body[: sizes.sequential]
    with (
        fermix_memory("fermix-bench-traced-") as traced,
        fermix_memory("fermix-bench-bare-", instrumented=False) as bare,
    ):
        appends = [
            m.conversation(AGENT, CHANNEL, "seq", owner_id=OWNER).append_user
            for m in (traced, bare)
        ]
        for text in warm:
            for append in appends:
                append(text)
        settle(traced, bare)
        latencies: tuple[list[int], list[int]] = ([], [])
        clock = time.perf_counter_ns
        start = clock()
        for i, text in enumerate(measured):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                t0 = clock()
                appends[side](text)
                latencies[side].append(clock() - t0)
        elapsed = clock() - start
    return Overhead(
        Run(len(measured), elapsed // 2, latencies[0]),
        Run(len(measured), elapsed // 2, latencies[1]),
    )


def touch_conversations(count: int, text: str) -> Footprint:
    """(d): one append and one read of each of ``count`` distinct conversations.

    The read starts the conversation's actor (an append alone does not: it is committed on
    the caller's thread and only a live actor's cache is told), so every conversation has
    had a live actor and the cap is what bounds the threads.
    """
    with fermix_memory("fermix-bench-many-") as memory:
        threads_before, rss_before = threading.active_count(), rss_mb()
        start = time.perf_counter_ns()
        for i in range(count):
            conv = memory.conversation(AGENT, CHANNEL, f"c{i}", owner_id=OWNER)
            conv.append_user(text)
            conv.history()
        elapsed = time.perf_counter_ns() - start
        return Footprint(
            conversations=count,
            cap=memory._runtime.services.registry.cap,
            threads_before=threads_before,
            threads_after=threading.active_count(),
            live_actors=memory._runtime.live_conversations(),
            rss_mb_before=rss_before,
            rss_mb_after=rss_mb(),
            elapsed_ns=elapsed,
        )


def langchain_peer() -> tuple[Any, Any, Any] | None:
    """``(SQLChatMessageHistory, HumanMessage, sqlalchemy)``, or None if not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # langchain-community announces its sunset
            histories = importlib.import_module("langchain_community.chat_message_histories")
            history_class = histories.SQLChatMessageHistory
            messages = importlib.import_module("langchain_core.messages")
            sqlalchemy = importlib.import_module("sqlalchemy")
    except (ImportError, AttributeError):
        return None
    return history_class, messages.HumanMessage, sqlalchemy


@contextlib.contextmanager
def langchain_writer(*, fermix_settings: bool) -> Iterator[Append | None]:
    """(e): ``SQLChatMessageHistory.add_message`` on a SQLite file; None without LangChain."""
    peer = langchain_peer()
    if peer is None:
        yield None
        return
    history_class, human_message, sqlalchemy = peer
    with tempfile.TemporaryDirectory(prefix="fermix-bench-lc-") as tmp:
        engine = sqlalchemy.create_engine(f"sqlite:///{Path(tmp) / 'history.db'}")
        if fermix_settings:

            def pragmas(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.execute("PRAGMA journal_mode = WAL")
                dbapi_conn.execute("PRAGMA synchronous = NORMAL")

            sqlalchemy.event.listen(engine, "connect", pragmas)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                history = history_class(session_id="seq", connection=engine)

            def append(text: str) -> None:
                history.add_message(human_message(content=text))

            yield append
        finally:
            engine.dispose()


def verdict(value: float | None, target: float) -> str:
    """The table's mark for a ratio against its target."""
    if value is None:
        return f"≥ {target:g}x [dim]n/a[/]"
    return f"≥ {target:g}x " + ("[green]met[/]" if value >= target else "[red]missed[/]")


def render(console: Console, r: dict[str, Any], footprint: Footprint) -> None:
    """Print the throughput and latency table, then the footprint table."""

    def fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
        return "null" if value is None else format(value, spec) + suffix

    table = Table(title="fermix appends: msgs/s, latency in µs")
    for column in ("measure", "fermix", "baseline", "ratio", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    table.add_row(
        "(a) 1 conversation vs raw",
        fmt(r["fermix_seq_msgs_s"]),
        fmt(r["raw_seq_msgs_s"]),
        fmt(r["seq_ratio_vs_raw"], ".2f", "x"),
        verdict(r["seq_ratio_vs_raw"], TARGET_SEQ),
    )
    table.add_row(
        "(b) 8 threads, 64 convs vs raw",
        fmt(r["fermix_concurrent_msgs_s"]),
        fmt(r["raw_seq_msgs_s"]),
        fmt(r["concurrent_ratio_vs_raw"], ".2f", "x"),
        verdict(r["concurrent_ratio_vs_raw"], TARGET_CONCURRENT),
    )
    table.add_row(
        "(c) p50 / p99 of (a) vs raw",
        f"{r['p50_append_us']:,.0f} / {r['p99_append_us']:,.0f}",
        f"{r['raw_p50_append_us']:,.0f} / {r['raw_p99_append_us']:,.0f}",
    )
    table.add_row(
        "(c) p50 / p99 of (b)",
        f"{r['p50_append_us_concurrent']:,.0f} / {r['p99_append_us_concurrent']:,.0f}",
    )
    table.add_row(
        "(e) vs LangChain, defaults",
        fmt(r["fermix_seq_msgs_s"]),
        fmt(r["langchain_msgs_s"]),
        fmt(r["ratio_vs_langchain"], ".1f", "x"),
        verdict(r["ratio_vs_langchain"], TARGET_LANGCHAIN),
    )
    table.add_row(
        "(e) vs LangChain, WAL+NORMAL",
        fmt(r["fermix_seq_msgs_s"]),
        fmt(r["langchain_wal_msgs_s"]),
        fmt(r["ratio_vs_langchain_wal"], ".1f", "x"),
    )
    overhead_pct = r["tracing_off_overhead_pct"]
    table.add_row(
        "(f) p50, tracing off vs bare",
        f"{r['p50_append_us_traced_off']:,.1f}",
        f"{r['p50_append_us_bare']:,.1f}",
        f"{overhead_pct:+.1f} %",
        f"≤ {TARGET_OVERHEAD_PCT:g} % "
        + ("[green]met[/]" if overhead_pct <= TARGET_OVERHEAD_PCT else "[red]missed[/]"),
    )
    table.caption = (
        f"(b) committed {r['concurrent_n']:,} appends in {r['concurrent_batches']:,} "
        f"transactions ({r['concurrent_mean_batch']:.1f} per commit); "
        f"load average {r['loadavg_start']:.1f} → {r['loadavg_end']:.1f}"
    )
    console.print(table)

    f = footprint
    table = Table(title=f"(d) after {f.conversations:,} conversations touched once each")
    for column in ("", "before", "after"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("threads", str(f.threads_before), str(f.threads_after))
    table.add_row("live conversation actors", "0", str(f.live_actors))
    table.add_row("RSS (MB)", f"{f.rss_mb_before:.1f}", f"{f.rss_mb_after:.1f}")
    mark = "[green]met[/]" if f.bounded else "[red]missed[/]"
    table.caption = (
        f"cap {f.cap}; threads ≤ cap + {THREAD_SLACK}: {mark}; "
        f"{f.conversations / (f.elapsed_ns / 1e9):,.0f} first appends/s"
    )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Run every section, print the tables and the JSON line."""
    parser = argparse.ArgumentParser(description="fermix append benchmark (see its docstring)")
    parser.add_argument("--quick", action="store_true", help="small sizes, under 20 s")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    load_start = os.getloadavg()[0]
    pool_of_texts = texts(sizes.warmup + max(sizes.sequential, sizes.concurrent))

    # (d) first, so its RSS is fermix's alone and not the peer's imports.
    footprint = touch_conversations(sizes.conversations, pool_of_texts[0])
    tp = throughput(sizes, pool_of_texts)
    cost = overhead(sizes, pool_of_texts)
    seq, conc, raw = tp.sequential, tp.concurrent, tp.raw
    langchain, langchain_wal = tp.langchain, tp.langchain_wal

    results: dict[str, Any] = {
        "seq_ratio_vs_raw": seq.rate / raw.rate,
        "concurrent_ratio_vs_raw": conc.rate / raw.rate,
        "p50_append_us": seq.percentile_us(50),
        "p99_append_us": seq.percentile_us(99),
        "p50_append_us_concurrent": conc.percentile_us(50),
        "p99_append_us_concurrent": conc.percentile_us(99),
        "raw_p50_append_us": raw.percentile_us(50),
        "raw_p99_append_us": raw.percentile_us(99),
        "threads_after_10k": footprint.threads_after,
        "threads_before_10k": footprint.threads_before,
        "thread_cap": footprint.cap,
        "threads_bounded": footprint.bounded,
        "conversations_touched": footprint.conversations,
        "rss_mb_before_10k": footprint.rss_mb_before,
        "rss_mb_after_10k": footprint.rss_mb_after,
        "ratio_vs_langchain": seq.rate / langchain.rate if langchain else None,
        "ratio_vs_langchain_wal": seq.rate / langchain_wal.rate if langchain_wal else None,
        "fermix_seq_msgs_s": seq.rate,
        "raw_seq_msgs_s": raw.rate,
        "tracing_off_overhead_pct": cost.median_pct,
        "tracing_off_overhead_pct_mean": cost.trimmed_mean_pct,
        "p50_append_us_traced_off": cost.instrumented.percentile_us(50),
        "p50_append_us_bare": cost.bare.percentile_us(50),
        "fermix_concurrent_msgs_s": conc.rate,
        "langchain_msgs_s": langchain.rate if langchain else None,
        "langchain_wal_msgs_s": langchain_wal.rate if langchain_wal else None,
        "concurrent_batches": tp.batches,
        "concurrent_mean_batch": conc.count / tp.batches if tp.batches else 0.0,
        "first_appends_s_10k": footprint.conversations / (footprint.elapsed_ns / 1e9),
        "sequential_n": seq.count,
        "concurrent_n": conc.count,
        "langchain_n": langchain.count if langchain else None,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg()[0],
        "quick": args.quick,
    }
    render(Console(), results, footprint)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
