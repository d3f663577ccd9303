"""Prompt-file rebuild and prompt composition times, each against a raw SQLite read (C4, P1).

Usage: ``python bench/prompt.py [--quick] [--rows N] [--messages N]``

A home in a temporary directory gets 10,000 memory rows of one agent and owner, spread
over the six categories at the scopes the reviewer uses (SC2), and a conversation of 200
messages. In the same run it measures (median of the repetitions):

- ``raw_read_ms_10k``: ``SELECT`` of every live row of that agent, fetched as tuples;
- ``list_rows_ms_10k``: the same rows through ``memories.list_rows`` (dataclasses);
- ``rebuild_ms_10k``: :func:`fermix.runtime.prompt_files.rebuild` after one row changed, so
  each rebuild renders, records a revision and replaces a file (fsync included);
- ``rebuild_unchanged_ms_10k``: a rebuild from unchanged rows (reads, renders, writes nothing);
- ``render_all_ms_10k``: rendering both files from all 10,000 rows already in memory
  (pure; the rebuild itself reads only each section's newest rows, not all 10,000);
- ``rebuild_ms_10k_with_render_index``: the changed rebuild again after creating
  :data:`PROPOSED_INDEX` in the benchmark's own database (not part of the schema yet): the
  rebuild reads each section's newest rows with ``LIMIT cap``, and without an index on
  ``category`` and ``updated_at`` each such read walks every row of its scope;
- ``compose_ms_200`` against ``raw_history_read_ms_200``: composing a hot conversation from
  its cached messages and the cached prompt files, against a ``SELECT`` of the same 200
  message rows; ``compose_ratio_vs_raw`` is the first divided by the second.

Targets: rebuild under 50 ms at 10,000 rows; compose within 2x of the raw read.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import apsw
from rich.console import Console
from rich.table import Table

from fermix import model
from fermix.core import categories, render
from fermix.core.composer import PromptComposer
from fermix.home import Home
from fermix.model import CATEGORIES, ConversationKey, NewMessage
from fermix.runtime import prompt_files
from fermix.storage import memories, messages, open_database, transaction

AGENT = "bench"
OWNER = ""
REBUILD_TARGET_MS = 50.0
COMPOSE_TARGET_RATIO = 2.0
PROPOSED_INDEX = (
    "CREATE INDEX IF NOT EXISTS memories_render ON memories"
    " (agent_id, owner_id, scope_type, scope_id, category, updated_at DESC, id DESC)"
    " WHERE archived_at IS NULL"
)
WORDS = [
    "tea",
    "coffee",
    "tides",
    "thesis",
    "porto",
    "lisbon",
    "marathon",
    "cello",
    "jazz",
    "python",
    "sqlite",
    "fermix",
]


def _ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds over ``repeats`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def seed_rows(conn: apsw.Connection, count: int) -> None:
    """``count`` rows of AGENT and OWNER over every category, where the reviewer puts them."""
    with transaction(conn):
        for i in range(count):
            category = CATEGORIES[i % len(CATEGORIES)]
            scope, owner = categories.reviewer_scope(
                category, agent_id=AGENT, owner_id=OWNER, trust="operator"
            )
            words = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(12))
            memories.upsert(
                conn,
                agent_id=AGENT,
                owner_id=owner,
                scope=scope,
                category=category,
                key=f"fact-{i}",
                value=f"Fact {i}: {words}",
                promote_target=model.TARGET_OF[category],
                now=1_700_000_000_000 + i,
            )


def seed_messages(conn: apsw.Connection, key: ConversationKey, count: int) -> None:
    """A conversation of ``count`` alternating user and assistant messages."""
    with transaction(conn):
        for i in range(count):
            role = "user" if i % 2 == 0 else "assistant"
            text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(40))
            messages.insert(conn, NewMessage(key, role, f"{i}: {text}"))


def _changed_rebuild_ms(conn: apsw.Connection, home: Home, repeats: int) -> float:
    """Median time of a rebuild that follows a write to the newest identity row."""
    newest = memories.list_rows(conn, agent_id=AGENT, category="identity", limit=1)[0]
    times = []
    for i in range(repeats):
        with transaction(conn):
            memories.replace_value(conn, newest.id, value=f"Changed fact {i} at {time.time()}")
        start = time.perf_counter()
        result = prompt_files.rebuild(conn, home, AGENT, OWNER)
        times.append((time.perf_counter() - start) * 1000)
        assert result.user_md.written and result.user_md.revision is not None
    return statistics.median(times)


def run(rows: int, history: int, repeats: int) -> dict[str, float | int | bool]:
    """Every figure of the benchmark, measured in one temporary home."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Home(Path(tmp))
        conn = open_database(home.db_path)
        try:
            seed_rows(conn, rows)
            key = ConversationKey(AGENT, "bench", "1")
            seed_messages(conn, key, history)
            prompt_files.rebuild(conn, home, AGENT, OWNER)

            raw_sql = "SELECT * FROM memories WHERE agent_id = ? AND archived_at IS NULL"
            raw_read = _ms(lambda: conn.execute(raw_sql, (AGENT,)).fetchall(), repeats)
            list_read = _ms(lambda: memories.list_rows(conn, agent_id=AGENT), repeats)
            every = memories.list_rows(conn, agent_id=AGENT)
            render_all = _ms(
                lambda: render.render_files(every, agent_id=AGENT, owner_id=OWNER), repeats
            )
            unchanged = _ms(lambda: prompt_files.rebuild(conn, home, AGENT, OWNER), repeats)

            changed = _changed_rebuild_ms(conn, home, repeats)
            conn.execute(PROPOSED_INDEX)
            indexed = _changed_rebuild_ms(conn, home, repeats)

            history_sql = (
                "SELECT id, agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
                " kind, content, metadata_json, created_at FROM messages WHERE agent_id = ?"
                " AND channel = ? AND chat_id = ? AND thread_scope = ?"
                " ORDER BY created_at DESC, id DESC LIMIT ?"
            )
            raw_history = _ms(
                lambda: conn.execute(history_sql, (*key.as_tuple(), history)).fetchall(), repeats
            )
            cached = messages.conversation(conn, key, limit=history, newest=True)
            composer = PromptComposer(home)
            system = "You are a helpful assistant."
            compose = _ms(lambda: composer.compose(system, AGENT, cached, owner_id=OWNER), repeats)
            composed = composer.compose(system, AGENT, cached, owner_id=OWNER)
            assert len(composed) == history + 2
        finally:
            conn.close()
    return {
        "rows": rows,
        "history_messages": history,
        "raw_read_ms_10k": round(raw_read, 3),
        "list_rows_ms_10k": round(list_read, 3),
        "render_all_ms_10k": round(render_all, 3),
        "rebuild_unchanged_ms_10k": round(unchanged, 3),
        "rebuild_ms_10k": round(changed, 3),
        "rebuild_ms_10k_with_render_index": round(indexed, 3),
        "raw_history_read_ms_200": round(raw_history, 4),
        "compose_ms_200": round(compose, 4),
        "compose_ratio_vs_raw": round(compose / raw_history, 3),
        "rebuild_target_met": changed < REBUILD_TARGET_MS,
        "compose_target_met": compose / raw_history <= COMPOSE_TARGET_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a table and, last, one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--rows", type=int, default=10_000, help="memory rows (10000)")
    parser.add_argument("--messages", type=int, default=200, help="history messages (200)")
    args = parser.parse_args(argv)
    figures = run(args.rows, args.messages, repeats=5 if args.quick else 30)

    table = Table(title=f"prompt files and composer ({args.rows} rows, {args.messages} messages)")
    table.add_column("measure")
    table.add_column("ms", justify="right")
    for name, value in figures.items():
        if "_ms_" in name:
            table.add_row(name, f"{value:.3f}")
    Console(stderr=True).print(table)
    print(json.dumps(figures))
    return 0 if figures["rebuild_target_met"] and figures["compose_target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
