"""Wall time of ``fermix doctor`` on a large home, and of each of its database checks.

Usage: ``python bench/doctor.py [--quick] [--messages N] [--home DIR] [--runs N]``

The home is built once and kept (default ``$TMPDIR/fermix-doctor-bench-<N>``, outside the
repository; ``--home`` names another): ``N`` messages (1,000,000 by default, 50,000 with
``--quick``) over 1,000 conversations, inserted through
:func:`fermix.storage.sqlite.messages.insert`
in one transaction, plus a few memory rows and their prompt files. A home already built at
that path is reused.

Then, on a warm page cache (one untimed run first):

- ``doctor_ms_p50``: the whole ``fermix doctor --json`` in this process, by default;
- ``doctor_full_ms_p50``: the same with ``--full`` (``PRAGMA integrity_check`` and the FTS
  mirrors compared with their content, row by row);
- ``steps_ms``, ``steps_full_ms``: each step of one in-process run, default and full, as
  its progress calls mark them, so the check that dominates is named;
- ``check_ms``: each database check on its own, in each of its forms (``PRAGMA
  quick_check`` vs ``integrity_check``; an FTS mirror's rowid sets, with or without its
  index structure, vs its ``integrity-check`` of every row against the content).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fermix.model import ConversationKey, NewMessage

FULL_MESSAGES = 1_000_000
QUICK_MESSAGES = 50_000
CONVERSATIONS = 1_000
AGENT = "assistant"
WORDS = [
    "espresso",
    "porto",
    "lisbon",
    "meeting",
    "deadline",
    "review",
    "invoice",
    "garden",
    "bicycle",
    "weather",
    "train",
    "ticket",
    "dinner",
    "recipe",
    "python",
    "sqlite",
    "memory",
    "backup",
    "holiday",
    "birthday",
    "doctor",
    "dentist",
    "project",
    "fermix",
    "release",
    "budget",
    "coffee",
    "tea",
    "running",
    "marathon",
    "book",
    "novel",
    "concert",
    "jazz",
    "flight",
    "hotel",
    "passport",
    "museum",
    "beach",
    "mountain",
    "winter",
    "summer",
    "report",
    "slides",
    "client",
]


def build(home: Path, messages_count: int) -> None:
    """Fill ``home`` with ``messages_count`` messages, a few rows and their prompt files."""
    from fermix.core import categories
    from fermix.home import Home
    from fermix.runtime.prompt_files import PromptFiles
    from fermix.storage import conversations
    from fermix.storage.sqlite import messages
    from fermix.storage.sqlite.connection import transaction
    from fermix.storage.sqlite.database import Database
    from fermix.storage.sqlite.migrations import open_database
    from fermix.storage.sqlite.session import SqliteWrites
    from fermix.storage.sqlite.sql import SqliteSql

    rng = random.Random(11)
    conn = open_database(home / "memory.db")
    try:
        with transaction(conn):
            for i in range(messages_count):
                key = ConversationKey(AGENT, "telegram", str(i % CONVERSATIONS))
                words = " ".join(rng.choices(WORDS, k=rng.randint(6, 30)))
                role = "user" if i % 2 == 0 else "assistant"
                messages.insert(conn, NewMessage(key, role, words), created_at=i)
            for n in range(CONVERSATIONS):
                key = ConversationKey(AGENT, "telegram", str(n))
                conversations.touch(SqliteSql(conn), key, owner_id="", trust="operator")
            for n in range(20):
                SqliteWrites(conn).upsert_row(
                    agent_id=AGENT,
                    owner_id="",
                    scope=categories.owner_scope(""),
                    category="preference",
                    key=f"likes-{n}",
                    value=f"likes {WORDS[n]}",
                    promote_target="user_md",
                )
    finally:
        conn.close()
    db = Database(home / "memory.db")
    try:
        PromptFiles(Home(home), db).rebuild_agent(AGENT, reason="bench")
    finally:
        db.close()


def timed_ms(fn: Callable[[], object]) -> float:
    """Wall milliseconds of one call."""
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


def doctor(home: Path, *extra: str) -> Callable[[], object]:
    """A call of ``fermix doctor --json`` on ``home`` in this process, output discarded."""
    from fermix.cli import main

    def run() -> object:
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["--home", str(home), "doctor", "--json", *extra])
        if code != 0:
            raise SystemExit(f"fermix doctor {' '.join(extra)} exited {code}")
        return code

    return run


def step_times(home: Path, *, full: bool) -> dict[str, float]:
    """Milliseconds of each step of one in-process ``diagnose``, told by its progress calls."""
    from fermix.cli.doctor_checks import diagnosis
    from fermix.clock import now_ms
    from fermix.home import Home

    marks: list[tuple[str, int]] = []

    def mark(step: str) -> None:
        marks.append((step.removeprefix("checking "), time.perf_counter_ns()))

    diagnosis.diagnose(Home(home), now=now_ms(), full=full, progress=mark)
    marks.append(("end", time.perf_counter_ns()))
    return {
        step: round((marks[i + 1][1] - start) / 1e6, 1)
        for i, (step, start) in enumerate(marks[:-1])
    }


def check_times(home: Path) -> dict[str, float]:
    """Each database check alone, through the inspection port: SQLite's two integrity
    checks, and each FTS mirror's three forms (rowid sets only, as the default doctor runs
    it after quick_check; rowid sets and the index structure; every row's terms)."""
    from fermix.storage import Reads
    from fermix.storage.integrity import FTS_TABLES
    from fermix.storage.sqlite.database import Database

    db = Database.inspect(home / "memory.db")
    checks: dict[str, Callable[[Reads], object]] = {
        "quick_check": lambda r: r.integrity_problems(full=False),
        "integrity_check": lambda r: r.integrity_problems(full=True),
    }
    for table in FTS_TABLES:
        checks[f"{table}_rowids"] = lambda r, t=table: r.fts_problem(t, structure_checked=True)
        checks[f"{table}_rowids_structure"] = lambda r, t=table: r.fts_problem(t)
        checks[f"{table}_full"] = lambda r, t=table: r.fts_problem(t, full=True)
    try:
        found = {}
        for name, check in checks.items():
            with db.read() as reads:
                found[name] = round(timed_ms(lambda check=check, reads=reads: check(reads)), 1)
        return found
    finally:
        db.close()


def main() -> None:
    """Build (or reuse) the home, time the doctor and its checks, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 messages, 1 run")
    parser.add_argument("--messages", type=int, help="messages in the home")
    parser.add_argument("--home", type=Path, help="where to build (or find) the home")
    parser.add_argument("--runs", type=int, help="timed runs of each doctor variant")
    parser.add_argument("--build-only", action="store_true", help="build the home and stop")
    args = parser.parse_args()
    count = args.messages or (QUICK_MESSAGES if args.quick else FULL_MESSAGES)
    runs = args.runs or (1 if args.quick else 3)
    home = args.home or Path(tempfile.gettempdir()) / f"fermix-doctor-bench-{count}"
    built_s = None
    if not (home / "memory.db").exists():
        home.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        build(home, count)
        built_s = round(time.perf_counter() - start, 1)
        print(f"built {home} with {count} messages in {built_s} s", file=sys.stderr)
    if args.build_only:
        print(json.dumps({"messages": count, "built_s": built_s}))
        return
    os.environ.pop("COLUMNS", None)
    # built_s is None when the home of an earlier run was found and timed again (its path
    # is on stderr when built, never in the report: it is this machine's).
    figures: dict[str, object] = {"messages": count, "built_s": built_s}
    for name, extra in (("doctor_ms", ()), ("doctor_full_ms", ("--full",))):
        doctor(home, *extra)()  # warm-up: page cache, imports
        times = [timed_ms(doctor(home, *extra)) for _ in range(runs)]
        figures[f"{name}_p50"] = round(statistics.median(times), 1)
    figures["steps_ms"] = step_times(home, full=False)
    figures["steps_full_ms"] = step_times(home, full=True)
    figures["check_ms"] = check_times(home)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
