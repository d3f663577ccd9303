"""PostgreSQL's :meth:`~fermix.storage.port.Storage.purge` (F3): the dead tuples of what was
deleted vacuumed away, once no transaction can still see them.

A deleted row stays in its table's pages as a dead tuple until ``VACUUM`` prunes it, and
``VACUUM`` prunes only the tuples no snapshot may still need. So the purge first waits, a
little (:data:`WAIT_S`), for every transaction that started before it to end (a reader of
another service, a replication slot's horizon), then vacuums the tables an erasure touches.
A transaction or slot that holds the horizon longer makes the purge not clean: the erasure
stays ``pending`` and is settled by a later purge. What PostgreSQL keeps outside the tables
(its write-ahead log, standbys, base backups) is ``docs/forgetting.md``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg

from fermix.clock import now_ms
from fermix.storage.port import Purge
from fermix.storage.postgres.connection import Conn

TABLES = (
    "messages",
    "message_vectors",
    "memories",
    "memory_vectors",
    "memory_versions",
    "conversations",
    "memory_sources",
    "scheduled_jobs",
    "job_runs",
    "resources",
    "resource_revisions",
    "embedding_scopes",
    "embedding_tokens",
    "erasures",
)
"""The tables an erasure deletes from (``message_ann`` too, where pgvector made it)."""

WAIT_S = 2.0
"""How long the purge waits for older transactions to end."""

_POLL_S = 0.05

VACUUM_COST_DELAY_MS = 2
"""The purge's vacuum pauses this long each time its cost limit is spent, as autovacuum does
(PostgreSQL's default for it), instead of running at full speed as a manual VACUUM does."""

_HOLDERS = (
    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
    " AND backend_xmin IS NOT NULL AND xact_start < %s),"
    " (SELECT count(*) FROM pg_replication_slots WHERE xmin IS NOT NULL"
    " OR catalog_xmin IS NOT NULL)"
)


def purge(connect: Callable[[], Conn]) -> Purge:
    """Vacuum what erasures touch, once no older snapshot can see what they deleted."""
    try:
        conn = connect()
    except psycopg.Error as exc:
        return Purge(False, f"no connection to vacuum: {type(exc).__name__}")
    pause = threading.Event()  # never set: a timed pause between two looks
    try:
        started = conn.execute("SELECT clock_timestamp()").fetchone()
        assert started is not None
        waited = 0.0
        while True:
            found = conn.execute(_HOLDERS, (started[0],)).fetchone()
            assert found is not None
            transactions, slots = int(found[0]), int(found[1])
            if not transactions and not slots:
                break
            if waited >= WAIT_S:
                held = (
                    f"{transactions} older transaction(s)" if transactions else "a replication slot"
                )
                return Purge(False, f"{held} may still see the deleted rows")
            pause.wait(_POLL_S)
            waited += _POLL_S
        tables = list(TABLES)
        if conn.execute("SELECT to_regclass('message_ann')").fetchone() not in (None, (None,)):
            tables.append("message_ann")
        # Throttled as autovacuum is, so the appends beside it keep their pace (F3).
        conn.execute(f"SET vacuum_cost_delay = '{VACUUM_COST_DELAY_MS}ms'")
        conn.execute(f"VACUUM {', '.join(tables)}")
        return Purge(True, log_clean_at=now_ms())
    except psycopg.Error as exc:
        return Purge(False, f"vacuum failed: {type(exc).__name__}: {exc}")
    finally:
        conn.close()
