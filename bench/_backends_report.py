"""The figures and tables of bench/backends.py: the JSON line's keys and the rich tables.

A helper module (its name starts with ``_``): bench/run.py does not run it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _backends_memory import OwnWork
from _backends_work import Run, Searches, same_hits
from rich.console import Console
from rich.table import Table

from fermix.storage.postgres.database import WRITERS

ADAPTERS = ("sqlite", "pg")
PROCESS_COUNTS = (1, 2, 4)
TARGET_PROCESS_SCALING, TARGET_SEARCH_GROWTH = 1.5, 2.0
TARGET_VS_PSYCOPG = 1.0
"""fermix's 8-thread appends on PostgreSQL over plain psycopg's commit per row (issue 25)."""


@dataclass
class SizeResult:
    """Search times on both adapters at one size, and each store's footprint there."""

    messages: int
    searches: dict[str, Searches]
    sqlite_bytes: float
    sqlite_fts_bytes: float
    pg_bytes: float
    pg_gin_bytes: float
    pg_heap_bytes: float
    sqlite_build_s: float | None
    pg_build_s: float | None
    pg_restore_s: float


# -- the figures ------------------------------------------------------------------------


def figures(
    quick: bool,
    runs: dict[str, Run],
    procs: dict[str, float],
    scale: Sequence[SizeResult],
    own: dict[str, OwnWork],
    server_settings: dict[str, str],
    sqlite_conf: dict[str, str],
    load: tuple[float, float],
) -> dict[str, Any]:
    """Every figure of the JSON line (bench/backends.py's doc says what each is)."""
    r: dict[str, Any] = {}
    for name in ("sqlite", "sqlite_full", "pg"):
        run = runs[f"seq_{name}"]
        r[f"append_seq_p50_us_{name}"] = run.percentile_us(50)
        r[f"append_seq_p99_us_{name}"] = run.percentile_us(99)
        r[f"append_seq_msgs_s_{name}"] = run.rate
    for name in ADAPTERS:
        run = runs[f"conc_{name}"]
        r[f"append_conc_p50_us_{name}"] = run.percentile_us(50)
        r[f"append_conc_p99_us_{name}"] = run.percentile_us(99)
        r[f"append_conc_msgs_s_{name}"] = run.rate
        r[f"append_conc_per_commit_{name}"] = run.count / run.commits if run.commits else None
    r["append_p50_ratio"] = r["append_seq_p50_us_pg"] / r["append_seq_p50_us_sqlite"]
    r["append_p50_ratio_vs_sqlite_full"] = (
        r["append_seq_p50_us_pg"] / r["append_seq_p50_us_sqlite_full"]
    )
    r["append_conc_rate_ratio"] = r["append_conc_msgs_s_pg"] / r["append_conc_msgs_s_sqlite"]
    for name in ("psycopg", "psycopg_pool"):
        plain = runs[f"conc_{name}"]
        r[f"append_conc_msgs_s_{name}"] = plain.rate
        r[f"append_conc_p50_us_{name}"] = plain.percentile_us(50)
        r[f"append_conc_p99_us_{name}"] = plain.percentile_us(99)
        r[f"append_conc_ratio_vs_{name}"] = r["append_conc_msgs_s_pg"] / plain.rate
    for key, rate in procs.items():
        r[f"procs_msgs_s_{key}"] = rate
    r["process_scaling_pg"] = procs["pg_4"] / procs["pg_1"]
    r["process_scaling_sqlite"] = procs["sqlite_4"] / procs["sqlite_1"]
    for size in scale:
        for name in ADAPTERS:
            for scope in ("conversation", "owner"):
                for q in (50, 99):
                    r[f"search_{scope}_p{q}_ms_{name}_{size.messages}"] = size.searches[name].p(
                        scope, q
                    )
    base, top = scale[0], scale[-1]
    for name in ADAPTERS:
        growth = {
            scope: top.searches[name].p(scope, 99) / base.searches[name].p(scope, 99)
            for scope in ("conversation", "owner")
        }
        r[f"search_growth_{name}_conversation"] = growth["conversation"]
        r[f"search_growth_{name}_owner"] = growth["owner"]
        r[f"search_growth_{name}"] = max(growth.values())
    for name in ADAPTERS:  # the largest size again, under names that do not carry it
        for scope in ("conversation", "owner"):
            for q in (50, 99):
                r[f"search_{scope}_p{q}_ms_{name}_largest"] = top.searches[name].p(scope, q)
    same = [same_hits(size.searches["sqlite"], size.searches["pg"]) for size in scale]
    r["search_same_hits_share"] = sum(n for n, _ in same) / max(1, sum(total for _, total in same))
    r["search_sizes"] = [size.messages for size in scale]
    r["search_questions"] = len(top.searches["pg"].conversation_ms)
    r["search_p99_ratio_owner"] = top.searches["pg"].p("owner", 99) / top.searches["sqlite"].p(
        "owner", 99
    )
    r["search_p99_ratio_conversation"] = top.searches["pg"].p("conversation", 99) / top.searches[
        "sqlite"
    ].p("conversation", 99)
    r["bytes_per_message_sqlite"] = top.sqlite_bytes
    r["bytes_per_message_pg"] = top.pg_bytes
    r["bytes_per_message_ratio"] = top.pg_bytes / top.sqlite_bytes
    r["fts_bytes_per_message_sqlite"] = top.sqlite_fts_bytes
    r["gin_bytes_per_message_pg"] = top.pg_gin_bytes
    r["heap_bytes_per_message_pg"] = top.pg_heap_bytes
    r["pg_restore_s"] = top.pg_restore_s
    r["pg_build_s"] = top.pg_build_s
    r["sqlite_build_s"] = top.sqlite_build_s
    for name in ADAPTERS:
        r.update(own[name].figures(name))
    r["memory_review_own_ratio"] = _ratio(
        r["memory_review_own_ms_pg"], r["memory_review_own_ms_sqlite"]
    )
    r["memory_compact_own_ratio"] = _ratio(
        r["memory_compact_own_ms_pg"], r["memory_compact_own_ms_sqlite"]
    )
    r["settings_pg"] = server_settings
    r["fermix_pg_writers"] = WRITERS  # the lanes of group commits fermix's appends run on
    r["settings_sqlite"] = sqlite_conf
    r["loadavg_start"], r["loadavg_end"] = load
    r["quick"] = quick
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def render(console: Console, r: dict[str, Any]) -> None:
    """The tables: appends, writer processes, search, footprint."""

    def ratio(value: float) -> str:
        return f"{value:.2f}x"

    table = Table(title="(a) appends through the port (µs, msgs/s); ratio = PostgreSQL / SQLite")
    for column in ("measure", "SQLite", "SQLite FULL", "PostgreSQL", "ratio"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for q in (50, 99):
        table.add_row(
            f"sequential p{q}",
            f"{r[f'append_seq_p{q}_us_sqlite']:,.0f}",
            f"{r[f'append_seq_p{q}_us_sqlite_full']:,.0f}",
            f"{r[f'append_seq_p{q}_us_pg']:,.0f}",
            ratio(r[f"append_seq_p{q}_us_pg"] / r[f"append_seq_p{q}_us_sqlite"]),
        )
    table.add_row(
        "sequential msgs/s",
        f"{r['append_seq_msgs_s_sqlite']:,.0f}",
        f"{r['append_seq_msgs_s_sqlite_full']:,.0f}",
        f"{r['append_seq_msgs_s_pg']:,.0f}",
        ratio(r["append_seq_msgs_s_pg"] / r["append_seq_msgs_s_sqlite"]),
    )
    for q in (50, 99):
        table.add_row(
            f"8 threads, 64 conversations p{q}",
            f"{r[f'append_conc_p{q}_us_sqlite']:,.0f}",
            "",
            f"{r[f'append_conc_p{q}_us_pg']:,.0f}",
            ratio(r[f"append_conc_p{q}_us_pg"] / r[f"append_conc_p{q}_us_sqlite"]),
        )
    table.add_row(
        "8 threads msgs/s (appends per commit)",
        f"{r['append_conc_msgs_s_sqlite']:,.0f} ({r['append_conc_per_commit_sqlite'] or 0:.1f})",
        "",
        f"{r['append_conc_msgs_s_pg']:,.0f} ({r['append_conc_per_commit_pg'] or 0:.1f})",
        ratio(r["append_conc_rate_ratio"]),
    )
    mark = "met" if r["append_conc_ratio_vs_psycopg"] >= TARGET_VS_PSYCOPG else "MISSED"
    table.add_row(
        "8 threads msgs/s, plain psycopg (a commit per row); ratio = fermix / it",
        "",
        "",
        f"{r['append_conc_msgs_s_psycopg']:,.0f}",
        f"{ratio(r['append_conc_ratio_vs_psycopg'])} (≥ {TARGET_VS_PSYCOPG:g}: {mark})",
    )
    table.add_row(
        f"the same on a pool of {r['fermix_pg_writers']} connections (as many as fermix's lanes)",
        "",
        "",
        f"{r['append_conc_msgs_s_psycopg_pool']:,.0f}",
        ratio(r["append_conc_ratio_vs_psycopg_pool"]),
    )
    console.print(table)

    table = Table(title="(b) writer processes, one thread each: total appends/s")
    for column in ("processes", "SQLite", "PostgreSQL"):
        table.add_column(column, justify="right")
    for n in PROCESS_COUNTS:
        table.add_row(
            str(n), f"{r[f'procs_msgs_s_sqlite_{n}']:,.0f}", f"{r[f'procs_msgs_s_pg_{n}']:,.0f}"
        )
    mark = "met" if r["process_scaling_pg"] >= TARGET_PROCESS_SCALING else "MISSED"
    table.add_row(
        "4 over 1",
        ratio(r["process_scaling_sqlite"]),
        f"{ratio(r['process_scaling_pg'])} (≥ {TARGET_PROCESS_SCALING:g}: {mark})",
    )
    console.print(table)

    sizes = r["search_sizes"]
    table = Table(title=f"(c) search_messages p50 / p99 (ms), {r['search_questions']} questions")
    table.add_column("scope")
    for size in sizes:
        for name in ("SQLite", "PostgreSQL"):
            table.add_column(f"{name} {size:,}", justify="right")
    table.add_column("p99 growth SQLite / PostgreSQL", justify="right")
    for scope in ("conversation", "owner"):
        cells = [
            f"{r[f'search_{scope}_p50_ms_{name}_{size}']:.2f} / "
            f"{r[f'search_{scope}_p99_ms_{name}_{size}']:.2f}"
            for size in sizes
            for name in ADAPTERS
        ]
        growth = (
            f"{ratio(r[f'search_growth_sqlite_{scope}'])} / {ratio(r[f'search_growth_pg_{scope}'])}"
        )
        table.add_row(scope, *cells, growth)
    mark = "met" if r["search_growth_pg"] <= TARGET_SEARCH_GROWTH else "MISSED"
    table.caption = (
        f"search_growth_pg {r['search_growth_pg']:.2f} (≤ {TARGET_SEARCH_GROWTH:g}: {mark});"
        f" same hits, same order on both: {100 * r['search_same_hits_share']:.1f} % of searches"
    )
    console.print(table)
    console.print(
        f"(d) bytes per message at {sizes[-1]:,}: SQLite {r['bytes_per_message_sqlite']:,.0f}"
        f" (FTS index {r['fts_bytes_per_message_sqlite']:,.0f}), PostgreSQL"
        f" {r['bytes_per_message_pg']:,.0f} (heap and TOAST {r['heap_bytes_per_message_pg']:,.0f},"
        f" GIN {r['gin_bytes_per_message_pg']:,.0f}): {ratio(r['bytes_per_message_ratio'])}",
        highlight=False,
    )
    table = Table(title="(e) fermix.Memory: own work, whole call minus the model's (ms)")
    for column in ("measure", "SQLite", "PostgreSQL", "ratio"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for what in ("review", "compact"):
        for label, key in (
            (f"{what} p50", f"memory_{what}_own_ms"),
            (f"{what} p99", f"memory_{what}_own_p99_ms"),
        ):
            values = [r[f"{key}_{name}"] for name in ADAPTERS]
            shown = ["—" if v is None else f"{v:.1f}" for v in values]
            both = _ratio(values[1], values[0])
            table.add_row(label, *shown, "" if both is None else ratio(both))
    errors = [
        f"{name}: {r[f'memory_error_{name}']}" for name in ADAPTERS if r[f"memory_error_{name}"]
    ]
    if errors:
        table.caption = "not measured: " + "; ".join(errors)
    console.print(table)
    pg = r["settings_pg"]
    lite = r["settings_sqlite"]
    console.print(
        f"PostgreSQL {pg['server_version']}: fsync={pg['fsync']}, synchronous_commit="
        f"{pg['synchronous_commit']}, full_page_writes={pg['full_page_writes']},"
        f" wal_sync_method={pg['wal_sync_method']}, commit_delay={pg['commit_delay']},"
        f" shared_buffers={pg['shared_buffers']}; Unix socket; fermix appends on"
        f" {r['fermix_pg_writers']} lanes of group commits. SQLite {lite['sqlite_version']}:"
        f" journal_mode={lite['journal_mode']}, synchronous={lite['synchronous']} (the FULL"
        f" column: synchronous=FULL). Load average {r['loadavg_start']:.2f} →"
        f" {r['loadavg_end']:.2f}",
        highlight=False,
    )
