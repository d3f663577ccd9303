"""Forgetting and export at scale, on SQLite and on PostgreSQL (issue 22, F1, F3, F6).

Usage: ``python bench/forget.py [--quick] [--data PATH]``

The home is a copy of bench/recall.py's scale file (1,000,000 LoCoMo messages, ``--quick``
100,000; ``bench/_recall_scale.py``, built once and cached) and, on PostgreSQL, its copy in
the suite's server (``bench/_backends_pg.py``). Two owners are added through fermix's own
write path: one to forget, with 10,000 messages over 20 conversations and 500 memory rows
(``--quick``: 1,000 and 50), every text carrying a marker word; one to export, with 100,000
messages (``--quick``: 10,000).

- ``forget_s``: the wall time of ``Memory.forget_owner`` of the first owner, to ``done``;
- ``other_append_p99_ms``: another owner's appends, one after another on a thread of their
  own, while the forget runs; ``idle_append_p99_ms``: the same appends for as long, just
  before, with nothing else running (the baseline of the same run; target: both < 50 ms);
- ``export_s``, ``export_peak_rss_mb``: ``fermix owner export`` of the second owner to a
  file, in a process of its own, its peak resident memory beside ``idle_peak_rss_mb``, the
  same process opening the home and exporting an owner with one message;
- ``bytes_clean``: no file of the home (SQLite: the database, its WAL and SHM, the prompt
  files) holds the marker or its stem after the forget; on PostgreSQL, no live or dead
  tuple of any table holds it (read from the pages with pageinspect).

The same figures with a ``pg_`` prefix for PostgreSQL. The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from _backends_pg import durable_server, scale_database
from _recall_data import DEFAULT_DATA, load
from _recall_scale import build_scale, scale_path
from _timing import percentile
from rich.console import Console

from fermix.api import Memory
from fermix.config import Config, MemoryConfig, StorageConfig
from fermix.core import categories
from fermix.model import ConversationKey, NewMessage, PendingAppend
from fermix.storage import fulltext

AGENT = "assistant"
MARK = "fernblossomzq"
FORGOTTEN = "forgotten-owner"
EXPORTED = "exported-owner"
OTHER = "busy-owner"
BATCH = 1_000


def _config(url: str | None) -> Config:
    storage = StorageConfig(url=url)
    return Config(memory=MemoryConfig(review_interval_hours=0), storage=storage)


def _fill(memory: Memory, owner: str, count: int, *, chats: int, marked: bool) -> None:
    """``count`` messages of ``owner`` over ``chats`` conversations, through append_many."""
    word = f" {MARK}" if marked else ""
    for start in range(0, count, BATCH):
        pending = []
        for i in range(start, min(count, start + BATCH)):
            key = ConversationKey(AGENT, "bench", f"{owner}-{i % chats}")
            role = "user" if i % 2 == 0 else "assistant"
            text = f"message {i} of {owner} about the harbour and the trains{word}"
            new = NewMessage(key, role, text, owner_id=owner)
            pending.append(PendingAppend(new, "guest", None, owner))
        for outcome in memory.append_many(pending):
            if isinstance(outcome, BaseException):
                raise outcome


def _rows(memory: Memory, owner: str, count: int) -> None:
    def unit(writes: Any) -> list[Any]:
        return [
            writes.upsert_row(
                agent_id=AGENT,
                owner_id=owner,
                scope=categories.owner_scope(owner),
                category="context",
                key=f"fact-{n}",
                value=f"remembers {MARK} number {n}",
                promote_target="user_md",
            )
            for n in range(count)
        ]

    written = memory._runtime.write_rows(unit, label="bench rows", reason="bench")
    assert written.error is None, written.error


def _appends_while(
    memory: Memory, busy: Callable[[], object] | None, seconds: float
) -> list[float]:
    """Append latencies (ms) of the other owner, one after another, while ``busy`` runs (or
    for ``seconds`` when it is None)."""
    conv = memory.conversation(AGENT, "bench", "other", owner_id=OTHER)
    done = threading.Event()
    latencies: list[float] = []

    def append() -> None:
        i = 0
        while not done.is_set():
            start = time.perf_counter()
            conv.append_user(f"another owner's message {i}")
            latencies.append((time.perf_counter() - start) * 1000)
            i += 1

    thread = threading.Thread(target=append, name="bench-appender")
    thread.start()
    try:
        if busy is None:
            done.wait(seconds)
        else:
            busy()
    finally:
        done.set()
        thread.join()
    return latencies


def _stems() -> list[bytes]:
    return sorted({MARK.encode(), *(t.encode() for t in fulltext.standalone_tokenizer()(MARK))})


def _home_clean(home: Path) -> bool:
    needles = _stems()
    for root, _dirs, names in os.walk(home):
        for name in names:
            path = Path(root, name)
            with path.open("rb") as f:
                tail = b""
                while chunk := f.read(1 << 24):
                    data = tail + chunk
                    if any(n in data for n in needles):
                        return False
                    tail = data[-64:]
    return True


def _tuples_clean(url: str) -> bool:
    needles = [n.decode() for n in _stems()]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class AS c JOIN pg_namespace AS n"
                " ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 't')"
                " AND n.nspname IN ('public', 'pg_toast')"
            )
        ]
        for table in tables:
            for needle in needles:
                found = conn.execute(
                    "SELECT count(*) FROM generate_series(0, (pg_relation_size(%s::regclass)"
                    " / current_setting('block_size')::int) - 1) AS p,"
                    " heap_page_items(get_raw_page(%s, p::int)) AS t"
                    " WHERE t.t_data IS NOT NULL"
                    " AND position(convert_to(%s, 'UTF8') IN t.t_data) > 0",
                    (table, table, needle),
                ).fetchone()
                if found is not None and found[0]:
                    return False
    return True


_EXPORTER = """
import resource, sys
from fermix.api import Memory
from fermix.config import Config, MemoryConfig, StorageConfig
url = sys.argv[4] or None
config = Config(memory=MemoryConfig(review_interval_hours=0), storage=StorageConfig(url=url))
with Memory(sys.argv[1], config=config) as memory:
    memory.export_owner(sys.argv[2], sys.argv[3], agent_id="assistant")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _export(home: Path, owner: str, out: Path, url: str | None) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of exporting ``owner`` in a process of its own."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _EXPORTER, str(home), owner, str(out), url or ""],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the export failed: {done.stderr[-2000:]}")
    return seconds, int(done.stdout.split()[-1]) / 1024


def measure(home: Path, url: str | None, sizes: dict[str, int]) -> dict[str, Any]:
    """Every figure of one backend (see the module's docstring)."""
    with Memory(home, config=_config(url)) as memory:
        _fill(memory, FORGOTTEN, sizes["forget_messages"], chats=20, marked=True)
        _rows(memory, FORGOTTEN, sizes["forget_rows"])
        _fill(memory, EXPORTED, sizes["export_messages"], chats=50, marked=False)
        _fill(memory, "tiny-owner", 1, chats=1, marked=False)
        report: list[Any] = []
        timing: list[float] = []

        def forget() -> None:
            start = time.perf_counter()
            report.append(memory.forget_owner(FORGOTTEN, agent_id=AGENT))
            timing.append(time.perf_counter() - start)

        busy = _appends_while(memory, forget, 0)
        idle = _appends_while(memory, None, max(timing[0], 1.0))
    assert report[0].done, report[0]
    out = home.parent / "export.json"
    export_s, export_rss = _export(home, EXPORTED, out, url)
    exported = json.loads(out.read_text(encoding="utf-8"))
    assert len(exported["messages"]) == sizes["export_messages"]
    _, idle_rss = _export(home, "tiny-owner", home.parent / "tiny.json", url)
    clean = _home_clean(home) if url is None else _tuples_clean(url)
    return {
        "forget_s": round(timing[0], 2),
        "forgotten_messages": report[0].counts.get("messages", 0),
        "forgotten_rows": report[0].counts.get("memory_rows", 0),
        "other_append_p99_ms": round(percentile(busy, 99), 1),
        "other_appends": len(busy),
        "idle_append_p99_ms": round(percentile(idle, 99), 1),
        "export_s": round(export_s, 2),
        "export_peak_rss_mb": round(export_rss, 1),
        "idle_peak_rss_mb": round(idle_rss, 1),
        "export_bytes": out.stat().st_size,
        "bytes_clean": clean,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 messages; smaller owners")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo-dev.json")
    args = parser.parse_args()
    console = Console(stderr=True)
    messages = 100_000 if args.quick else 1_000_000
    sizes = {
        "forget_messages": 1_000 if args.quick else 10_000,
        "forget_rows": 50 if args.quick else 500,
        "export_messages": 10_000 if args.quick else 100_000,
    }
    path = scale_path(args.data, messages)
    if not path.exists():
        console.print(f"building the scale database ({messages:,} messages) in {path.parent}")
        build_scale(load(args.data), messages, path, console)
    figures: dict[str, Any] = {"messages": messages, **sizes}
    with tempfile.TemporaryDirectory(prefix="fermix-forget-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        shutil.copyfile(path, home / "memory.db")
        console.print("SQLite: filling, forgetting, exporting")
        figures.update(measure(home, None, sizes))
    with durable_server() as server, tempfile.TemporaryDirectory(prefix="fermix-forget-") as tmp:
        restored = scale_database(server, path, "bench_forget", console)
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        console.print("PostgreSQL: filling, forgetting, exporting")
        figures.update({f"pg_{k}": v for k, v in measure(home, restored.url, sizes).items()})
    figures["peak_rss_mb_this_process"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
