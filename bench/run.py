"""Run every benchmark and write one report, ``bench/RESULTS.md`` (issue 8, item 6).

Usage: ``python bench/run.py [--quick] [--timeout S] [--only NAME ...] [--output PATH]
[--note TEXT]``

Each script of ``bench/`` runs as its own process (``python bench/NAME.py [--quick]``),
one after another so that they do not load the machine for each other, with a time limit
each. A script's figures are the JSON object it prints last. The report gives, for each
benchmark, every figure of :data:`FIGURES` beside its baseline from the same run, their
ratio and the target from the issues, whether it was met, and the machine it ran on; the
JSON lines themselves go in an appendix. A baseline does the same work as its figure (each
script's docstring says how) and gets a ratio; one that is only there for scale (a bare
interpreter's start, say) is marked so and gets none.

``--quick`` passes ``--quick`` to every script: small sizes, a few minutes in all, for CI.
Its report goes to a temporary file (its path is printed), never over ``bench/RESULTS.md``,
unless ``--output`` names a path. Without it each script runs its full size, to be run by
hand, and the report is ``bench/RESULTS.md``.

The report says at which commit the run ran and whether the working tree was clean, at the
start and at the end of the run (``git status --porcelain``; RESULTS.md itself counts), and
names every ``.py`` file of ``bench/`` that was not run, and why: nothing is skipped
silently. A name given to ``--only`` that has no script is a failed benchmark, not a
silent omission.

A missed target is a finding, not a failure: the exit code is 0 when every script gave its
figures, 1 when one crashed, timed out, printed no JSON or is missing. The last line
printed is one JSON object: ``{benchmark: {"ok", "targets_met", "targets", "not_measured"}}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import operator
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import apsw

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DEFAULT_OUTPUT = BENCH / "RESULTS.md"
QUICK_OUTPUT = Path(tempfile.gettempdir()) / "fermix-bench-RESULTS-quick.md"
HELPER_REASON = "a helper module the scripts import (its name starts with `_`), not a benchmark"
QUICK_TIMEOUT_S = 600.0
FULL_TIMEOUT_S = 3600.0
STDERR_TAIL_LINES = 25
MEM0_NULL = "mem0's venv could not be made: `mem0_error` in its JSON says why"

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
}
_SHOWN_OPS = {"<": "<", "<=": "≤", ">=": "≥", "==": "="}


@dataclass(frozen=True)
class Target:
    """A bound one figure must meet, from the issue that set it."""

    op: str
    bound: float | bool
    on_ratio: bool = False  # the bound applies to the ratio column, not to fermix's figure
    plus: str | None = None  # the bound is added to this figure of the same run
    source: str = ""

    def threshold(self, figures: Mapping[str, Any]) -> float | bool | None:
        """The bound for this run, or None when a figure it depends on is missing."""
        if self.plus is None:
            return self.bound
        base = figures.get(self.plus)
        return None if base is None else base + self.bound

    def describe(self, figures: Mapping[str, Any]) -> str:
        """The target as the report shows it."""
        subject = "ratio " if self.on_ratio else ""
        if self.plus is None:
            return f"{subject}{_SHOWN_OPS[self.op]} {bound_text(self.bound)}"
        return (
            f"{subject}{_SHOWN_OPS[self.op]} {self.plus} + {bound_text(self.bound)}"
            f" = {fmt(self.threshold(figures))}"
        )


def bound_text(bound: float | bool) -> str:
    """A target's bound as the issues write it: 58.8, 0.5, 500, false."""
    return str(bound).lower() if isinstance(bound, bool) else f"{bound:g}"


@dataclass(frozen=True)
class Figure:
    """One row of a benchmark's table: JSON keys of fermix's figure and of its baseline."""

    label: str
    fermix: str
    baseline: str | None = None
    baseline_label: str = ""
    ratio: str | None = None  # the script's own ratio key; otherwise fermix / baseline
    same_work: bool = True  # False: the baseline is shown for scale only, with no ratio
    target: Target | None = None
    if_null: str = ""  # why the script may print null for this row's figures


@dataclass(frozen=True)
class Benchmark:
    """One script of ``bench/`` and what its report section says."""

    title: str
    figures: tuple[Figure, ...]
    quick_note: str = ""


# Every figure the report shows and every target, in one place. Targets come from the
# issues: recall from 2, 14 and 25, append from 3, prompt from 4, review from 5, compact from 6, the
# CLI's start from 2 (item 7) and 25, the server from 13, search at scale from 14, backends from 15,
# the peers (mem0, LangChain) from 25.
FIGURES: dict[str, Benchmark] = {
    "recall": Benchmark(
        "turn-level recall of history search on LoCoMo: hybrid (shipped) vs full-text",
        (
            Figure(
                "turn R@10 (%)",
                "turn_r10",
                "lexical_r10",
                "fermix full-text search (before)",
                target=Target(">=", 75, source="issue 14"),
            ),
            Figure(
                "turn R@5 (%)",
                "turn_r5",
                "lexical_r5",
                "fermix full-text search (before)",
                target=Target(">=", 66, source="issue 14"),
            ),
            Figure(
                "turn R@10 (%), porter baseline",
                "turn_r10",
                "baseline_porter_r10",
                "porter, minus stopwords",
                target=Target(">=", 58.8, source="issue 2"),
            ),
            Figure(
                "turn R@10 (%), unicode61 baseline",
                "turn_r10",
                "baseline_unicode_r10",
                "words OR-ed, unicode61",
            ),
            Figure(
                "turn R@10 (%), same index",
                "turn_r10",
                "plain_fts5_r10",
                "its words, FTS5 bm25 alone",
            ),
            Figure("turn R@20 (%)", "turn_r20", "lexical_r20", "fermix full-text search (before)"),
            Figure(
                "turn R@10 (%), tuning conversations 1-3",
                "tune_r10",
                "lexical_tune_r10",
                "fermix full-text search (before)",
            ),
            Figure(
                "turn R@10 (%), held-out conversations 4-5",
                "held_r10",
                "lexical_held_r10",
                "fermix full-text search (before)",
                if_null="quick mode asks conversation 1 only",
            ),
            Figure(
                "query p50 (ms)",
                "p50_ms",
                "plain_fts5_p50_ms",
                "its words, bm25 alone, same index",
                ratio="p50_ratio_vs_plain_fts5",
            ),
            Figure(
                "query p99 (ms)",
                "p99_ms",
                "lexical_p99_ms",
                "fermix full-text search (before)",
            ),
            Figure(
                "turn R@10 (%), PostgreSQL",
                "turn_r10_pg",
                "turn_r10",
                "SQLite, same run",
                if_null="no PostgreSQL could be started (pg_error says why)",
            ),
            Figure(
                "turn R@10, PostgreSQL minus SQLite, absolute (points)",
                "recall_r10_pg_abs_gap",
                target=Target("<=", 0.5, source="issue 15"),
                if_null="no PostgreSQL could be started (pg_error says why)",
            ),
            Figure(
                "questions with the same top 10 on PostgreSQL and SQLite (share)",
                "same_top10_share_pg",
                if_null="no PostgreSQL could be started (pg_error says why)",
            ),
            Figure("scale case: messages", "scale_messages"),
            Figure(
                "scale: one conversation's search p99 (ms), hybrid",
                "scale_conversation_p99_ms",
                "scale_lexical_conversation_p99_ms",
                "full-text search",
                target=Target("<", 15, source="issue 25"),
            ),
            Figure(
                "scale: owner-scope search p99 (ms), hybrid",
                "scale_owner_p99_ms",
                "scale_lexical_owner_p99_ms",
                "full-text search",
                target=Target("<", 25, source="issue 25"),
            ),
            Figure(
                "scale: one conversation's search p99 (ms), full-text",
                "scale_lexical_conversation_p99_ms",
                target=Target("<", 25, source="issue 14"),
            ),
            Figure(
                "scale: owner-scope search p99 (ms), full-text",
                "scale_lexical_owner_p99_ms",
                target=Target("<", 50, source="issue 14"),
            ),
            Figure("scale: memory_recall p99 (ms), hybrid", "scale_memory_recall_p99_ms"),
            Figure(
                "scale: database bytes per message",
                "scale_bytes_per_message",
                "scale_bytes_per_message_before",
                "without vectors",
            ),
        ),
        "only the first LoCoMo conversation (a tuning one: no held-out figure), not the whole"
        " file the targets are set on; a scale case of 100,000 messages, not the 1,000,000"
        " the issue-14 targets are set on",
    ),
    "append": Benchmark(
        "append throughput, latency and footprint",
        (
            Figure(
                "the append path with tracing off, over no instrumentation at all (%)",
                "tracing_off_overhead_pct",
                target=Target("<=", 3, source="issue 24"),
            ),
            Figure(
                "sequential appends (msg/s)",
                "fermix_seq_msgs_s",
                "raw_seq_msgs_s",
                "raw apsw, one commit each",
                ratio="seq_ratio_vs_raw",
                target=Target(">=", 0.8, on_ratio=True, source="issue 11"),
            ),
            Figure(
                "64 conversations, 8 threads (msg/s)",
                "fermix_concurrent_msgs_s",
                "raw_seq_msgs_s",
                "raw apsw, one commit each",
                ratio="concurrent_ratio_vs_raw",
                target=Target(">=", 1.0, on_ratio=True, source="issue 11"),
            ),
            Figure(
                "sequential vs LangChain (msg/s)",
                "fermix_seq_msgs_s",
                "langchain_msgs_s",
                "SQLChatMessageHistory",
                ratio="ratio_vs_langchain",
                target=Target(">=", 10.0, on_ratio=True, source="issue 3"),
                if_null="LangChain not installed: `pip install -e '.[bench]'`",
            ),
            Figure(
                "sequential vs LangChain on WAL (msg/s)",
                "fermix_seq_msgs_s",
                "langchain_wal_msgs_s",
                "SQLChatMessageHistory, WAL",
                ratio="ratio_vs_langchain_wal",
                if_null="LangChain not installed: `pip install -e '.[bench]'`",
            ),
            Figure(
                "threads after touching N conversations",
                "threads_after_10k",
                "thread_cap",
                "conversation cap",
                target=Target("<=", 16, plus="thread_cap", source="issue 3"),
            ),
            Figure("append p50 (µs)", "p50_append_us", "raw_p50_append_us", "raw apsw"),
            Figure("append p99 (µs)", "p99_append_us", "raw_p99_append_us", "raw apsw"),
            Figure("append p50, concurrent (µs)", "p50_append_us_concurrent"),
            Figure("append p99, concurrent (µs)", "p99_append_us_concurrent"),
            Figure(
                "RSS after N conversations (MB)",
                "rss_mb_after_10k",
                "rss_mb_before_10k",
                "RSS before",
            ),
            Figure("conversations touched (N)", "conversations_touched"),
        ),
        "1,000 conversations instead of 10,000, 60 LangChain messages instead of 1,000",
    ),
    "prompt": Benchmark(
        "prompt-file rebuild and prompt composition",
        (
            Figure(
                "rebuild after one change, 10k rows (ms)",
                "rebuild_ms",
                "rebuild_by_hand_ms",
                "the same rebuild by hand, raw apsw",
                ratio="rebuild_ratio_vs_by_hand",
                target=Target("<", 50.0, source="issue 4"),
            ),
            Figure(
                "rebuild, unchanged rows (ms)",
                "rebuild_unchanged_ms",
                "rebuild_unchanged_by_hand_ms",
                "the same rebuild by hand, raw apsw",
                ratio="rebuild_unchanged_ratio_vs_by_hand",
            ),
            Figure(
                "render both files, pure (ms)",
                "render_ms",
            ),
            Figure(
                "read all 10k live rows (ms)",
                "read_rows_ms",
                "read_rows_raw_ms",
                "the same SELECT, raw apsw tuples",
                ratio="read_rows_ratio_vs_raw",
            ),
            Figure(
                "compose a 200-message conversation (ms)",
                "compose_ms",
                "compose_by_hand_ms",
                "the same messages by hand from SQLite",
                ratio="compose_ratio_vs_by_hand",
                target=Target("<=", 2.0, on_ratio=True, source="issue 4"),
            ),
            Figure(
                "compose, pure part (ms)",
                "compose_pure_ms",
            ),
        ),
        "15 repetitions instead of 30",
    ),
    "review": Benchmark(
        "fermix's own time in one memory review (model on loopback)",
        (
            Figure(
                "fermix's own work, p50 (ms)",
                "fermix_ms",
                "model_roundtrip_ms",
                "model round trip, p50",
                same_work=False,
                target=Target("<", 50.0, source="issue 5"),
            ),
            Figure(
                "fermix's own work, p99 (ms)",
                "fermix_ms_p99",
                "model_roundtrip_ms_p99",
                "model round trip, p99",
                same_work=False,
            ),
            Figure("prompt files rebuilt, p50 (ms)", "rebuild_ms_p50"),
            Figure("claim + transaction, p50 (ms)", "writes_ms_p50"),
            Figure("rest (reads, pack, parse, admit), p50 (ms)", "rest_ms_p50"),
            Figure(
                "1,000 owners sharing an agent: own work, p50 (ms)",
                "shared_fermix_ms",
                "eager_fermix_ms",
                "every owner rebuilt inside the review",
                target=Target("<", 50.0, source="issue 12"),
            ),
            Figure(
                "append delay during a review, p99 over idle (ms)",
                "append_delay_p99_review_ms",
                "rebuild_one_ms_p99",
                "one prompt-file rebuild, p99",
                same_work=False,
                target=Target("<=", 0.0, plus="rebuild_one_ms_p99", source="issue 12"),
            ),
        ),
        "5 reviews instead of 30",
    ),
    "compact": Benchmark(
        "fermix's own time in one compaction of a 100k-token window (model on loopback)",
        (
            Figure(
                "fermix's own work, p50 (ms)",
                "fermix_ms",
                "model_roundtrip_ms",
                "model round trip, p50",
                same_work=False,
                target=Target("<", 100.0, source="issue 6"),
            ),
            Figure(
                "fermix's own work, p99 (ms)",
                "fermix_p99_ms",
                "model_roundtrip_p99_ms",
                "model round trip, p99",
                same_work=False,
            ),
            Figure(
                "plan: token counts (ms)",
                "fermix_plan_ms",
                "tiktoken_window_ms",
                "one bare tiktoken pass",
            ),
            Figure(
                "second compaction, p50 (ms)",
                "fermix_again_ms",
                "model_roundtrip_ms",
                "model round trip, p50",
                same_work=False,
            ),
        ),
        "5 rounds after 1 warm-up instead of 20 after 3",
    ),
    "cli_start": Benchmark(
        "`fermix memory list` on an empty home, and `fermix chat`'s first reply, as processes",
        (
            Figure(
                "memory list, p50 (ms)",
                "memory_list_ms_p50",
                "memory_list_by_hand_ms_p50",
                "the same by hand, apsw script, p50",
                ratio="memory_list_ratio_vs_by_hand",
                target=Target("<", 300.0, source="issue 25"),
            ),
            Figure(
                "memory list, p95 (ms)",
                "memory_list_ms_p95",
                "memory_list_by_hand_ms_p95",
                "the same by hand, apsw script, p95",
            ),
            Figure(
                "memory list on a new directory, p50 (ms)",
                "memory_list_fresh_ms_p50",
                "memory_list_fresh_by_hand_ms_p50",
                "the same by hand, with the migrations, p50",
                ratio="memory_list_fresh_ratio_vs_by_hand",
            ),
            Figure(
                "memory list, p50, beside the bare interpreter (ms)",
                "memory_list_ms_p50",
                "python_start_ms_p50",
                "`python -c pass`, p50",
                same_work=False,
            ),
            Figure(
                "litellm imported",
                "litellm_imported",
                target=Target("==", False, source="issue 2"),
            ),
            Figure(
                "chat: first reply from Enter, message typed at 8 characters/s, p50 (ms)",
                "chat_first_reply_ms",
                "litellm_import_ms_p50",
                "`import litellm` alone, p50: what the reply waited for before",
                same_work=False,
                target=Target("<", 1000.0, source="issue 25"),
            ),
            Figure(
                "chat: first reply from Enter, message typed at 8 characters/s, max (ms)",
                "chat_first_reply_ms_max",
            ),
            Figure(
                "chat: first reply from Enter, typed ahead of the prompt, p50 (ms)",
                "chat_first_reply_typed_ahead_ms_p50",
                "litellm_import_ms_p50",
                "`import litellm` alone, p50",
                same_work=False,
            ),
            Figure("chat: spawn to prompt, p50 (ms)", "chat_prompt_ms_p50"),
            Figure("chat: resident memory after one turn (MB)", "chat_rss_mb_after_one_turn"),
        ),
        "7 runs of each instead of 30, 2 chats of each kind instead of 7",
    ),
    "server": Benchmark(
        "appends over HTTP to the memory server, 32 clients",
        (
            Figure(
                "appends over HTTP, aiohttp load (req/s)",
                "fermix_appends_s",
                "bare_appends_s",
                "bare FastAPI + uvicorn, one apsw insert",
                ratio="ratio_vs_bare",
                target=Target(">=", 0.7, on_ratio=True, source="issue 13"),
            ),
            Figure(
                "appends over HTTP vs embedded (msg/s)",
                "fermix_appends_s",
                "embedded_appends_s",
                "embedded Memory, 32 threads",
                ratio="ratio_vs_embedded",
            ),
            Figure(
                "fermix.Client, urllib3, 32 threads (req/s)",
                "client_appends_s",
                "fermix_appends_s",
                "the same server under aiohttp",
                ratio="client_vs_aiohttp",
            ),
            Figure("append p50 over HTTP (ms)", "fermix_p50_ms", "bare_p50_ms", "bare stack"),
            Figure("append p99 over HTTP (ms)", "fermix_p99_ms", "bare_p99_ms", "bare stack"),
            Figure("cold start to first /v1/health (ms)", "cold_start_health_ms"),
            Figure("cold start to first append (ms)", "cold_start_first_append_ms"),
            Figure(
                "load generator's ceiling, GET /v1/health (req/s)",
                "aiohttp_ceiling_rps",
                "bare_appends_s",
                "bare appends",
                same_work=False,
            ),
        ),
        "600 requests a round instead of 6,000, 2 cold starts instead of 5",
    ),
    "backends": Benchmark(
        "the storage port's two adapters: PostgreSQL (durable: fsync, synchronous_commit on)"
        " against SQLite (fermix's settings: WAL, synchronous=NORMAL)",
        (
            Figure(
                "sequential append p50 (µs)",
                "append_seq_p50_us_pg",
                "append_seq_p50_us_sqlite",
                "SQLite",
                ratio="append_p50_ratio",
            ),
            Figure(
                "sequential append p50 (µs), durable baseline",
                "append_seq_p50_us_pg",
                "append_seq_p50_us_sqlite_full",
                "SQLite, synchronous=FULL",
                ratio="append_p50_ratio_vs_sqlite_full",
            ),
            Figure(
                "sequential append p99 (µs)",
                "append_seq_p99_us_pg",
                "append_seq_p99_us_sqlite",
                "SQLite",
            ),
            Figure(
                "8 threads, 64 conversations (msg/s)",
                "append_conc_msgs_s_pg",
                "append_conc_msgs_s_sqlite",
                "SQLite",
                ratio="append_conc_rate_ratio",
            ),
            Figure(
                "8 threads, 64 conversations (msg/s), against plain psycopg",
                "append_conc_msgs_s_pg",
                "append_conc_msgs_s_psycopg",
                "psycopg, fermix's INSERT, a commit per row, a connection per thread",
                ratio="append_conc_ratio_vs_psycopg",
                target=Target(">=", 1.0, on_ratio=True, source="issue 25"),
            ),
            Figure(
                "8 threads, 64 conversations, append p99 (µs)",
                "append_conc_p99_us_pg",
                "append_conc_p99_us_sqlite",
                "SQLite",
            ),
            Figure(
                "4 writer processes (msg/s)", "procs_msgs_s_pg_4", "procs_msgs_s_sqlite_4", "SQLite"
            ),
            Figure(
                "writer processes, 4 over 1",
                "process_scaling_pg",
                "process_scaling_sqlite",
                "SQLite, 4 over 1",
                same_work=False,
                target=Target(">=", 1.5, source="issue 15"),
            ),
            Figure(
                "search p99, largest size over 20,000 (worse scope)",
                "search_growth_pg",
                "search_growth_sqlite",
                "SQLite, the same",
                same_work=False,
                target=Target("<=", 2.0, source="issue 15"),
            ),
            Figure(
                "one conversation's search p99 at the largest size (ms)",
                "search_conversation_p99_ms_pg_largest",
                "search_conversation_p99_ms_sqlite_largest",
                "SQLite",
            ),
            Figure(
                "owner-scope search p99 at the largest size (ms)",
                "search_owner_p99_ms_pg_largest",
                "search_owner_p99_ms_sqlite_largest",
                "SQLite",
            ),
            Figure(
                "searches with the same hits, same order, on both (share)",
                "search_same_hits_share",
            ),
            Figure(
                "bytes per message at the largest size",
                "bytes_per_message_pg",
                "bytes_per_message_sqlite",
                "SQLite",
                ratio="bytes_per_message_ratio",
            ),
            Figure(
                "review, fermix's own work p50 (ms)",
                "memory_review_own_ms_pg",
                "memory_review_own_ms_sqlite",
                "SQLite",
                ratio="memory_review_own_ratio",
                if_null="that backend could not run fermix.Memory: see memory_error_*",
            ),
            Figure(
                "compaction, fermix's own work p50 (ms)",
                "memory_compact_own_ms_pg",
                "memory_compact_own_ms_sqlite",
                "SQLite",
                ratio="memory_compact_own_ratio",
                if_null="that backend could not run fermix.Memory: see memory_error_*",
            ),
        ),
        "1,000 and 2,000 appends instead of 5,000 and 20,000; 3 s per writer-process run, one"
        " round, instead of 10 s and two; search at 20,000 and 100,000 messages with 100"
        " questions, not 1,000,000 with 300 (the target is set on 1,000,000); 3 reviews and"
        " compactions instead of 10",
    ),
    "forget": Benchmark(
        "forgetting an owner (10,000 messages, 500 rows) in a home of 1,000,000 messages, and"
        " exporting one of 100,000: SQLite, then PostgreSQL",
        (
            Figure("forget, wall time (s)", "forget_s"),
            Figure(
                "another owner's append p99 during the forget (ms)",
                "other_append_p99_ms",
                "idle_append_p99_ms",
                "the same appends, idle",
                target=Target("<", 50, source="issue 22"),
            ),
            Figure(
                "idle append p99 (ms)",
                "idle_append_p99_ms",
                target=Target("<", 50, source="issue 22"),
            ),
            Figure(
                "no marker left in any file of the home",
                "bytes_clean",
                target=Target("==", True, source="issue 22"),
            ),
            Figure("export of 100,000 messages (s)", "export_s"),
            Figure(
                "export, peak RSS (MB)",
                "export_peak_rss_mb",
                "idle_peak_rss_mb",
                "exporting one message",
            ),
            Figure("PostgreSQL: forget, wall time (s)", "pg_forget_s"),
            Figure(
                "PostgreSQL: another owner's append p99 during the forget (ms)",
                "pg_other_append_p99_ms",
                "pg_idle_append_p99_ms",
                "the same appends, idle",
                target=Target("<", 50, source="issue 22"),
            ),
            Figure(
                "PostgreSQL: no live or dead tuple holds a marker",
                "pg_bytes_clean",
                target=Target("==", True, source="issue 22"),
            ),
            Figure("PostgreSQL: export of 100,000 messages (s)", "pg_export_s"),
            Figure(
                "PostgreSQL: export, peak RSS (MB)",
                "pg_export_peak_rss_mb",
                "pg_idle_peak_rss_mb",
                "exporting one message",
            ),
        ),
        "100,000 messages in the home, an owner of 1,000 messages and 50 rows forgotten, one of"
        " 10,000 exported (the targets are set on the full size)",
    ),
    "integrations": Benchmark(
        "a turn through each framework adapter: the time inside the adapter's entry points"
        " (fermix's calls included) against the README's hand-written turn, the model"
        " answering at once in the process",
        (
            Figure(
                "OpenAI Agents SDK: FermixSession + instructions, per turn (ms)",
                "openai_agents_cost_ms",
                "api_async_turn_ms",
                "hand-written asyncio turn",
                ratio="openai_agents_ratio_vs_api",
                target=Target("<=", 1.2, on_ratio=True, source="issue 23"),
            ),
            Figure(
                "Pydantic AI: FermixHistory + instructions, per turn (ms)",
                "pydantic_ai_cost_ms",
                "api_async_turn_ms",
                "hand-written asyncio turn",
                ratio="pydantic_ai_ratio_vs_api",
                target=Target("<=", 1.2, on_ratio=True, source="issue 23"),
            ),
            Figure(
                "LangChain: FermixChatMessageHistory, per turn (ms)",
                "langchain_cost_ms",
                "api_turn_ms",
                "hand-written turn",
                ratio="langchain_ratio_vs_api",
                target=Target("<=", 1.2, on_ratio=True, source="issue 23"),
            ),
            Figure(
                "LangGraph: FermixStore search + put (ms)",
                "langgraph_store_ms",
                "langgraph_api_ms",
                "recall_rows + put_row",
                ratio="langgraph_ratio_vs_api",
                target=Target("<=", 1.2, on_ratio=True, source="issue 23"),
            ),
            Figure(
                "the framework's own loop around the Agents SDK turn (ms)",
                "openai_agents_turn_ms",
                "openai_agents_alone_ms",
                "the same loop with no memory",
                same_work=False,
            ),
        ),
        "40 turns of each system instead of 400",
    ),
    "peers": Benchmark(
        "fermix beside mem0 OSS and LangChain's SQLChatMessageHistory on LoCoMo (same data,"
        " same embedder, models on loopback)",
        (
            Figure(
                "turns/s until searchable (every vector stored), medians of interleaved rounds",
                "fermix_searchable_turns_s_rounds",
                "mem0_fastest_turns_s_rounds",
                "mem0 infer=False, its faster variant's add rate (searchable on return)",
                if_null=MEM0_NULL,
                ratio="ingest_ratio_vs_mem0",
                target=Target(">=", 10.0, on_ratio=True, source="issue 25"),
            ),
            Figure(
                "turn R@10 (%)",
                "fermix_r10",
                "mem0_best_r10",
                "mem0 infer=False, its better variant",
                if_null=MEM0_NULL,
                target=Target(">=", 30, plus="mem0_best_r10", source="issue 25"),
            ),
            Figure(
                "search p99 (ms)",
                "fermix_search_p99_ms",
                "mem0_best_search_p99_ms",
                "mem0, its better variant",
                if_null=MEM0_NULL,
                ratio="search_p99_ratio_vs_mem0",
                target=Target("<=", 0.3, on_ratio=True, source="issue 25"),
            ),
            Figure(
                "model prompt tokens per 1,000 user messages",
                "fermix_prompt_tokens_per_1k",
                "mem0_infer_prompt_tokens_per_1k",
                "mem0 infer=True",
                if_null=MEM0_NULL,
                ratio="model_tokens_ratio_vs_mem0",
                target=Target("<=", 0.1, on_ratio=True, source="issue 25"),
            ),
            Figure(
                "model calls per 1,000 user messages",
                "fermix_model_calls_per_1k",
                "mem0_infer_model_calls_per_1k",
                "mem0 infer=True",
                if_null=MEM0_NULL,
            ),
            Figure(
                "turn R@5 (%)",
                "fermix_r5",
                "mem0_best_r5",
                "mem0, its better variant",
                if_null=MEM0_NULL,
            ),
            Figure(
                "turn R@20 (%)",
                "fermix_r20",
                "mem0_best_r20",
                "mem0, its better variant",
                if_null=MEM0_NULL,
            ),
            *(
                Figure(
                    f"turn R@10 (%), category {c} ({name})",
                    f"fermix_r10_cat{c}",
                    f"mem0_best_r10_cat{c}",
                    "mem0, its better variant",
                    if_null=MEM0_NULL,
                )
                for c, name in (
                    (1, "multi-hop"),
                    (2, "temporal"),
                    (3, "open-domain"),
                    (4, "single-hop"),
                )
            ),
            Figure(
                "turn R@10 (%), turns stored at wall-clock times",
                "fermix_wallclock_r10",
                "mem0_best_r10",
                "mem0, its better variant",
                if_null=MEM0_NULL,
            ),
            Figure(
                "search p50 (ms)",
                "fermix_search_p50_ms",
                "mem0_best_search_p50_ms",
                "mem0, its better variant",
                if_null=MEM0_NULL,
            ),
            Figure(
                "appends/adds per second",
                "fermix_turns_s",
                "mem0_fastest_turns_s",
                "mem0 infer=False, its faster variant",
                if_null=MEM0_NULL,
            ),
            Figure(
                "turns/s until searchable, the first measurement (each side once, minutes apart)",
                "fermix_searchable_turns_s",
                "mem0_fastest_turns_s",
                "mem0 infer=False, its faster variant",
                if_null=MEM0_NULL,
                ratio="ingest_ratio_vs_mem0_single",
            ),
            Figure(
                "appends per second vs LangChain",
                "fermix_turns_s",
                "langchain_turns_s",
                "SQLChatMessageHistory",
                if_null="LangChain not installed: `pip install -e '.[bench]'`",
            ),
            Figure(
                "append p50 (ms)",
                "fermix_add_p50_ms",
                "mem0_best_add_p50_ms",
                "mem0 add, same variant",
                if_null=MEM0_NULL,
            ),
            Figure(
                "append p99 (ms)",
                "fermix_add_p99_ms",
                "mem0_best_add_p99_ms",
                "mem0 add, same variant",
                if_null=MEM0_NULL,
            ),
            Figure(
                "append p99 (ms) vs LangChain",
                "fermix_add_p99_ms",
                "langchain_add_p99_ms",
                "SQLChatMessageHistory",
                if_null="LangChain not installed: `pip install -e '.[bench]'`",
            ),
            Figure(
                "bytes on disk per turn",
                "fermix_bytes_per_turn",
                "mem0_best_bytes_per_turn",
                "mem0, Qdrant local + its history",
                if_null=MEM0_NULL,
            ),
            Figure(
                "bytes on disk per turn vs LangChain",
                "fermix_bytes_per_turn",
                "langchain_bytes_per_turn",
                "SQLChatMessageHistory (no search)",
                if_null="LangChain not installed: `pip install -e '.[bench]'`",
            ),
        ),
        "the first LoCoMo conversation (419 turns) instead of all five (2,760)",
    ),
    "doctor": Benchmark(
        "`fermix doctor` on a large home (no same-work baseline: its per-check times are in"
        " the JSON)",
        (
            Figure("doctor, p50 (ms)", "doctor_ms_p50"),
            Figure("doctor --full, p50 (ms)", "doctor_full_ms_p50"),
            Figure("messages in the home", "messages"),
        ),
        "50,000 messages instead of 1,000,000, 1 run instead of 3",
    ),
}


@dataclass
class Outcome:
    """What one script's run gave: its figures, or why there are none."""

    name: str
    script: Path
    figures: dict[str, Any] | None = None
    error: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    stderr_tail: list[str] = field(default_factory=list)
    raw_line: str = ""

    @property
    def ok(self) -> bool:
        """The script printed its figures."""
        return self.figures is not None


@dataclass(frozen=True)
class Row:
    """One evaluated row of a benchmark's table."""

    figure: Figure
    value: Any
    baseline: Any
    ratio: float | None
    target: str
    verdict: str  # "met", "missed", "not measured" or "" when the row has no target
    absent: tuple[str, ...]  # keys the row reads that the script's JSON does not have


def scripts(only: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Benchmark names to run, and every ``.py`` file of bench/ not run with the reason.

    To run: those of FIGURES, then any other script found in bench/; with ``only``, exactly
    those names, in that order (a name with no script fails when run, it is not dropped).
    """
    found = sorted(p.name for p in BENCH.glob("*.py") if p.name != Path(__file__).name)
    helpers = [n for n in found if n.startswith("_")]
    benches = [n.removesuffix(".py") for n in found if not n.startswith("_")]
    names = [*FIGURES, *(n for n in benches if n not in FIGURES)]
    skipped = [(n, HELPER_REASON) for n in helpers]
    if only:
        chosen = list(dict.fromkeys(only))
        skipped += [(f"{n}.py", "not named by --only") for n in names if n not in chosen]
        names = chosen
    return names, skipped


def last_json(stdout: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object on the last non-empty line of ``stdout``, and that line."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None, ""
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None, lines[-1]
    return (value if isinstance(value, dict) else None), lines[-1]


def run_script(name: str, quick: bool, timeout: float) -> Outcome:
    """Run ``bench/NAME.py`` in its own process group and collect its last JSON line."""
    script = BENCH / f"{name}.py"
    outcome = Outcome(name, script)
    load_start = os.getloadavg()[0]
    if not script.is_file():
        outcome.error = f"bench/{name}.py does not exist"
        outcome.load = (load_start, load_start)
        return outcome
    command = [sys.executable, str(script), *(["--quick"] if quick else [])]
    start = time.monotonic()
    # Its own session, so a timeout ends the script and anything it started.
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        outcome.error = f"timed out after {timeout:g} s"
    outcome.seconds = time.monotonic() - start
    outcome.load = (load_start, os.getloadavg()[0])
    outcome.returncode = process.returncode
    outcome.stderr_tail = stderr.splitlines()[-STDERR_TAIL_LINES:]
    if outcome.error:
        return outcome
    figures, line = last_json(stdout)
    outcome.raw_line = line
    if process.returncode < 0:
        outcome.error = f"killed by signal {-process.returncode}"
    elif figures is None:
        outcome.error = f"exited {process.returncode} without a JSON object as its last line"
    else:
        outcome.figures = figures
    return outcome


def fmt(value: Any) -> str:
    """A figure as the report shows it."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        size = abs(value)
        if size >= 1000:
            return f"{value:,.0f}"
        if size >= 10:
            return f"{value:.1f}"
        if size >= 0.1 or size == 0:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def evaluate(figure: Figure, figures: Mapping[str, Any]) -> Row:
    """Read one row's figures from a script's JSON and judge its target."""
    target = figure.target
    keys = (figure.fermix, figure.baseline, figure.ratio, target.plus if target else None)
    absent = tuple(k for k in keys if k is not None and k not in figures)
    value = figures.get(figure.fermix)
    baseline = figures.get(figure.baseline) if figure.baseline else None
    ratio: float | None = None
    if figure.ratio is not None:
        ratio = figures.get(figure.ratio)
    elif figure.same_work and _is_number(value) and _is_number(baseline) and baseline != 0:
        ratio = value / baseline
    if target is None:
        return Row(figure, value, baseline, ratio, "", "", absent)
    subject = ratio if target.on_ratio else value
    bound = target.threshold(figures)
    measured = subject is not None and bound is not None
    verdict = "not measured"
    if measured:
        verdict = "met" if _OPS[target.op](subject, bound) else "missed"
    return Row(figure, value, baseline, ratio, target.describe(figures), verdict, absent)


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def rows_of(outcome: Outcome) -> list[Row]:
    """The evaluated rows of one benchmark; none when it gave no figures."""
    bench = FIGURES.get(outcome.name)
    if outcome.figures is None or bench is None:
        return []
    return [evaluate(figure, outcome.figures) for figure in bench.figures]


def tally(outcome: Outcome) -> dict[str, Any]:
    """One benchmark's entry in the summary line."""
    bench = FIGURES.get(outcome.name)
    defined = sum(1 for f in bench.figures if f.target) if bench else 0
    verdicts = [row.verdict for row in rows_of(outcome) if row.verdict]
    return {
        "ok": outcome.ok,
        "targets_met": verdicts.count("met"),
        "targets": defined,
        "not_measured": verdicts.count("not measured") if outcome.ok else defined,
    }


def machine() -> dict[str, str]:
    """What the run ran on, for the report's header."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return {
        "CPU": cpu_model(),
        "cores": f"{os.cpu_count()} ({usable} usable by this process)",
        "memory": memory(),
        "OS": platform.platform(),
        "Python": f"{platform.python_version()} ({platform.python_implementation()})",
        "SQLite": f"{apsw.sqlite_lib_version()} (apsw {apsw.apsw_version()})",
    }


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what the platform module knows."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def memory() -> str:
    """Total memory, and what was available at the start, from /proc/meminfo."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return "unknown"
    kib = {
        name: int(rest.split()[0])
        for name, _, rest in (line.partition(":") for line in meminfo.splitlines())
        if rest.split() and rest.split()[0].isdigit()
    }
    if "MemTotal" not in kib:
        return "unknown"
    total = f"{kib['MemTotal'] / 2**20:.1f} GiB total"
    if "MemAvailable" not in kib:
        return total
    return f"{total}, {kib['MemAvailable'] / 2**20:.1f} GiB available at start"


@dataclass(frozen=True)
class Checkout:
    """The commit a run ran at, and the working tree's uncommitted changes then."""

    commit: str  # the full hash, or "" when this is not a git checkout
    changes: tuple[str, ...]  # `git status --porcelain` lines; empty when the tree is clean

    @property
    def known(self) -> bool:
        return bool(self.commit)

    @property
    def clean(self) -> bool:
        return self.known and not self.changes

    def describe(self) -> str:
        """The tree as the report shows it."""
        if not self.known:
            return "unknown (not a git checkout, or git failed)"
        if self.clean:
            return "clean"
        shown = ", ".join(f"`{line[3:]}`" for line in self.changes[:CHANGES_SHOWN])
        more = len(self.changes) - CHANGES_SHOWN
        return f"**{len(self.changes)} uncommitted changes**: {shown}" + (
            f" and {more} more" if more > 0 else ""
        )


CHANGES_SHOWN = 12


def checkout() -> Checkout:
    """The checkout's commit, and its uncommitted changes (read only: no git state changes)."""
    try:
        head = _git("rev-parse", "HEAD").strip()
        status = _git("status", "--porcelain", "--untracked-files=all")
    except (OSError, subprocess.CalledProcessError):
        return Checkout("", ())
    return Checkout(head, tuple(line for line in status.splitlines() if line.strip()))


def _git(*args: str) -> str:
    # --no-optional-locks: `git status` must not refresh (write) the index behind the back
    # of someone committing in this checkout.
    return subprocess.run(
        ["git", "--no-optional-locks", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


VERDICTS = {"met": "yes", "missed": "**MISSED**", "not measured": "not measured", "": ""}


@dataclass(frozen=True)
class Context:
    """The run as a whole: its mode, the machine, when, and how loaded."""

    quick: bool
    note: str
    header: Mapping[str, str]
    started: datetime.datetime
    load_start: str
    load_end: str
    tree_start: Checkout
    tree_end: Checkout
    not_run: Sequence[tuple[str, str]]
    command: str


def tree_sentence(start: Checkout, end: Checkout) -> str:
    """Where the run ran, in one sentence for the report's first paragraph."""
    if not start.known:
        return "outside a git checkout (no commit recorded)."
    where = f"at commit `{start.commit[:12]}`"
    if end.commit != start.commit:
        return f"{where}; HEAD moved to `{end.commit[:12] or 'unknown'}` during the run."
    if start.clean and end.clean:
        return f"{where}, on a clean working tree (at the start and at the end)."
    if start.clean:
        return f"{where}, on a tree that was clean at the start but not at the end."
    return f"{where}, with uncommitted changes in the working tree."


def report(outcomes: Sequence[Outcome], run: Context) -> str:
    """The whole of RESULTS.md."""
    quick, started = run.quick, run.started
    mode = "quick" if quick else "full"
    start, end = run.tree_start, run.tree_end
    lines = [
        "# Benchmark results",
        "",
        f"A **{mode}** run of `{run.command}`, started {started:%Y-%m-%d %H:%M} UTC,"
        f" {tree_sentence(start, end)} This file is written by that command; do not edit"
        " it by hand.",
        "",
    ]
    if not (start.clean and end.clean):
        lines += [
            "**These figures are not those of a commit alone: the working tree was not clean"
            " (or could not be read) during the run. Regenerate from a clean checkout.**",
            "",
        ]
    if quick:
        lines += [
            "Quick mode gives every script its small sizes and few repetitions (each section"
            " says which), so CI can run it in a few minutes: it shows where each figure"
            " stands, not its settled value, and a few targets are set on the full sizes."
            " For a full run, by hand: `.venv/bin/python bench/run.py` (no `--quick`), which"
            " writes `bench/RESULTS.md`.",
            "",
        ]
    if run.note:
        lines += [f"**{run.note}**", ""]
    lines += [
        f"Load: {os.cpu_count()} cores; 1-minute load average {run.load_start.split()[0]} at"
        f" the start and {run.load_end.split()[0]} at the end (each script's is in the"
        " summary). Whatever else runs on the machine moves every absolute time; ratios"
        " against a baseline measured in the same run, in the same process, are steadier."
        " The scripts ran one after another, never two at once.",
        "",
        "How to read a table: *baseline* is measured in the same run and, unless marked"
        " *for scale*, does the same work as fermix's figure (each script's docstring says"
        " how); *ratio* is fermix's figure divided by the baseline's (for rates above 1 is"
        " faster, for times below 1 is faster; where a script computes its own ratio, its"
        " figure is shown). A baseline marked *for scale* gets no ratio. A missed target is"
        " shown as **MISSED**, never left out.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in run.header.items()),
        f"| commit | {start.commit or 'unknown'} |",
        f"| working tree at start | {start.describe()} |",
        f"| working tree at end | {end.describe()} |",
        f"| load average (1 / 5 / 15 min) | {run.load_start} at start, {run.load_end} at end |",
        f"| date | {started:%Y-%m-%d %H:%M:%S} UTC |",
        f"| mode | {mode} |",
        "",
        "## Summary",
        "",
        "| benchmark | script | status | targets met | time (s) | load 1 min, start → end |",
        "|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        entry = tally(outcome)
        status = "ok" if outcome.ok else f"**FAILED**: {outcome.error}"
        met = f"{entry['targets_met']} / {entry['targets']}"
        if entry["not_measured"]:
            met += f" ({entry['not_measured']} not measured)"
        lines.append(
            f"| {outcome.name} | `bench/{outcome.name}.py` | {status} | {met}"
            f" | {outcome.seconds:.1f} | {outcome.load[0]:.2f} → {outcome.load[1]:.2f} |"
        )
    if run.not_run:
        lines += ["", "Not run:", ""]
        lines += [f"- `bench/{name}`: {why}." for name, why in run.not_run]
    for outcome in outcomes:
        lines += ["", *section(outcome, quick)]
    lines += [
        "",
        "## Raw JSON lines",
        "",
        "<details><summary>The last line each script printed</summary>",
        "",
    ]
    for outcome in outcomes:
        lines += [
            f"`bench/{outcome.name}.py`:",
            "",
            "```json",
            outcome.raw_line or "(none)",
            "```",
            "",
        ]
    lines += ["</details>", ""]
    return "\n".join(lines)


def section(outcome: Outcome, quick: bool) -> list[str]:
    """One benchmark's part of the report."""
    bench = FIGURES.get(outcome.name)
    title = bench.title if bench else "no figures or targets defined in bench/run.py"
    lines = [f"## {outcome.name}: {title}", "", f"`bench/{outcome.name}.py`"]
    if quick and bench and bench.quick_note:
        lines[-1] += f"; quick mode: {bench.quick_note}."
    lines.append("")
    if not outcome.ok:
        lines += [f"**FAILED**: {outcome.error}."]
        if outcome.stderr_tail:
            lines += ["", "Last lines of its stderr:", "", "```", *outcome.stderr_tail, "```"]
        return lines
    if outcome.returncode:
        lines += [f"It exited {outcome.returncode} after printing its figures.", ""]
    if bench is None:
        lines += ["Its figures are in the appendix."]
        return lines
    lines += [
        "| figure | fermix | baseline | ratio | target | met? |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows_of(outcome):
        baseline = ""
        if row.figure.baseline:
            baseline = f"{fmt(row.baseline)} ({row.figure.baseline_label})"
            if not row.figure.same_work:
                baseline += ", for scale: not the same work"
        source = row.figure.target.source if row.figure.target else ""
        target = f"{row.target} ({source})" if source else row.target
        verdict = VERDICTS[row.verdict]
        if row.absent:
            keys = ", ".join(f"`{k}`" for k in row.absent)
            verdict = f"{verdict} (not in its JSON: {keys})".lstrip()
        elif row.figure.if_null and (
            row.value is None or (row.figure.baseline is not None and row.baseline is None)
        ):
            verdict = f"{verdict} ({row.figure.if_null})".lstrip()
        lines.append(
            f"| {row.figure.label} | {fmt(row.value)} | {baseline}"
            f" | {fmt(row.ratio) if row.ratio is not None else ''} | {target}"
            f" | {verdict} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks, write the report, print the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="every script's quick mode (CI)")
    parser.add_argument("--timeout", type=float, help="seconds per script (600 quick, 3600 full)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="these only")
    parser.add_argument(
        "--output",
        type=Path,
        help=f"the report (default: bench/RESULTS.md; with --quick, {QUICK_OUTPUT})",
    )
    parser.add_argument("--note", default="", help="what to know about the machine, in bold")
    args = parser.parse_args(argv)
    output = args.output or (QUICK_OUTPUT if args.quick else DEFAULT_OUTPUT)
    timeout = args.timeout or (QUICK_TIMEOUT_S if args.quick else FULL_TIMEOUT_S)
    started = datetime.datetime.now(datetime.UTC)
    header = machine()
    tree_start = checkout()
    load_start = loadavg()
    names, not_run = scripts(args.only)
    for name, why in not_run:
        print(f"bench/{name}: not run: {why}", file=sys.stderr)
    outcomes = []
    for name in names:
        print(f"bench/{name}.py ...", end=" ", file=sys.stderr, flush=True)
        outcome = run_script(name, args.quick, timeout)
        print(
            f"{'ok' if outcome.ok else 'FAILED: ' + outcome.error} ({outcome.seconds:.1f} s)",
            file=sys.stderr,
        )
        outcomes.append(outcome)
    tree_end = checkout()
    command = " ".join(["python bench/run.py", *(argv if argv is not None else sys.argv[1:])])
    run = Context(
        args.quick,
        args.note,
        header,
        started,
        load_start,
        loadavg(),
        tree_start,
        tree_end,
        not_run,
        command,
    )
    output.write_text(report(outcomes, run))
    print(
        f"wrote {output} (commit {tree_start.commit[:12] or 'unknown'},"
        f" tree {'clean' if tree_start.clean and tree_end.clean else 'NOT clean'})",
        file=sys.stderr,
    )
    print(json.dumps({o.name: tally(o) for o in outcomes}))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
