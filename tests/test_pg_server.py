"""The suite's own PostgreSQL (tests/pg_fixtures.py): it starts, stores and reads back,
listens on its Unix socket only, and says whether pgvector is there."""

from __future__ import annotations

import os
from pathlib import Path

import pg_server as pgs
import pytest

if os.environ.get("FERMIX_REQUIRE_POSTGRES", "") in ("", "0"):
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")
else:
    import psycopg  # CI: a missing psycopg is an error, not a skip


def test_a_table_written_is_read_back(postgres: str) -> None:
    with psycopg.connect(postgres) as conn:
        conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text NOT NULL)")
        conn.execute(
            "INSERT INTO notes (id, body) VALUES (%s, %s), (%s, %s)",
            (1, "prefers tea", 2, "café über naïve"),
        )
        conn.commit()
    with psycopg.connect(postgres) as conn:
        rows = conn.execute("SELECT id, body FROM notes ORDER BY id").fetchall()
        conn.execute("DROP TABLE notes")
    assert rows == [(1, "prefers tea"), (2, "café über naïve")]


def test_the_server_says_its_version(postgres: str, pg_server: pgs.PgServer) -> None:
    with psycopg.connect(postgres) as conn:
        (version,) = conn.execute("SELECT version()").fetchone() or ("",)
        (number,) = conn.execute("SHOW server_version_num").fetchone() or ("0",)
        (encoding,) = conn.execute("SHOW server_encoding").fetchone() or ("",)
    assert version.startswith("PostgreSQL "), version
    assert int(number) >= 150000, version
    assert encoding == "UTF8"
    assert pg_server.version and pg_server.version in version


def test_it_listens_on_its_socket_only(postgres: str, pg_server: pgs.PgServer) -> None:
    with psycopg.connect(postgres) as conn:
        (listen,) = conn.execute("SHOW listen_addresses").fetchone() or (None,)
        (sockets,) = conn.execute("SHOW unix_socket_directories").fetchone() or (None,)
        (peer,) = conn.execute("SELECT inet_server_addr()").fetchone() or ("?",)
    assert listen == ""
    assert sockets == str(pg_server.socket_dir)
    assert peer is None  # a Unix-socket connection has no server address
    assert (pg_server.socket_dir / ".s.PGSQL.5432").is_socket()


def test_the_server_runs_as_an_unprivileged_user(pg_server: pgs.PgServer) -> None:
    pid = int((pg_server.data / "postmaster.pid").read_text().split()[0])
    uid = Path(f"/proc/{pid}").stat().st_uid if Path("/proc").is_dir() else os.geteuid()
    assert uid != 0
    if os.geteuid() == 0:
        assert pg_server.user is not None and uid == pg_server.user.pw_uid


def test_each_test_gets_an_empty_database_of_its_own(postgres_db: str, postgres: str) -> None:
    assert postgres_db != postgres
    with psycopg.connect(postgres_db) as conn:
        (tables,) = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone() or (-1,)
        (database,) = conn.execute("SELECT current_database()").fetchone() or ("",)
    assert tables == 0
    assert database.startswith("t_test_each_test_gets")


def test_text_search_keeps_non_ascii_letters_in_words(postgres: str) -> None:
    with psycopg.connect(postgres) as conn:
        (vector,) = conn.execute(
            "SELECT to_tsvector('english', 'Running runners ran; Café prefers Tea')::text"
        ).fetchone() or ("",)
    assert vector == "'café':4 'prefer':5 'ran':3 'run':1 'runner':2 'tea':6"


def test_pgvector_can_be_created_when_the_server_ships_it(postgres_db: str) -> None:
    with psycopg.connect(postgres_db) as conn:
        available = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
        if available is None:
            pytest.skip("this PostgreSQL has no pgvector (the vector extension is not installed)")
        conn.execute("CREATE EXTENSION vector")
        conn.execute("CREATE TABLE v (id int PRIMARY KEY, e vector(3) NOT NULL)")
        conn.execute("CREATE INDEX ON v USING hnsw (e vector_cosine_ops)")
        conn.execute("INSERT INTO v VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0.9,0.1,0]')")
        nearest = conn.execute("SELECT id FROM v ORDER BY e <=> '[1,0,0]' LIMIT 2").fetchall()
    assert [r[0] for r in nearest] == [1, 3]
