"""A real PostgreSQL for the tests (tests/pg_server.py), started by the suite itself.

- ``pg_server`` (session): the running :class:`~pg_server.PgServer`, started on first use
  in a temporary directory on a Unix socket, stopped and removed at the session's end;
- ``postgres`` (session): the ``postgresql://`` URL of a fresh database made for the
  session, empty when the session starts;
- ``postgres_db`` (each test): the URL of a database of the test's own, dropped after it.

Where no PostgreSQL can be had (no psycopg, no binaries, none would start) the tests that
ask for one are skipped, each with the reason; with ``FERMIX_REQUIRE_POSTGRES=1`` (set by
``.ci/run``) they fail instead, so CI cannot go green on skipped Postgres tests. With
``FERMIX_REQUIRE_PGVECTOR=1`` (also set by ``.ci/run``) a server without the ``vector``
extension fails them too, naming the server, so CI cannot go green on a PostgreSQL that
never ran the approximate index. The session's last lines name the server used, whether it
has pgvector, and how long it took to start.

Registered in ``tests/conftest.py`` through ``pytest_plugins``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pg_server as pgs
import pytest

_started: list[pgs.PgServer] = []
_unavailable: list[str] = []
_pgvector: dict[Path, str | None] = {}
"""Each started server's :meth:`~pg_server.PgServer.pgvector_trouble` (``None``: works)."""


def _required(switch: str = "FERMIX_REQUIRE_POSTGRES") -> bool:
    return os.environ.get(switch, "") not in ("", "0")


def _unavailable_now(reason: str) -> None:
    _unavailable.append(reason)
    if _required():
        pytest.fail(f"PostgreSQL required (FERMIX_REQUIRE_POSTGRES) but: {reason}", False)
    pytest.skip(f"no PostgreSQL: {reason}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgs.PgServer]:
    """A running PostgreSQL for the whole session (Unix socket only, temporary directory)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable_now("psycopg is not installed (pip install -e '.[postgres]' or '.[dev]')")
    try:
        server = pgs.start()
    except pgs.PostgresUnavailable as exc:
        _unavailable_now(str(exc))
    _started.append(server)
    try:
        trouble = _pgvector[server.root] = server.pgvector_trouble()
        if trouble is not None and _required("FERMIX_REQUIRE_PGVECTOR"):
            pytest.fail(
                f"pgvector required (FERMIX_REQUIRE_PGVECTOR) but on PostgreSQL {server.version} "
                f"from {server.candidate.origin} ({server.bindir}): {trouble}",
                False,
            )
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres(pg_server: pgs.PgServer) -> str:
    """The URL of a database made empty for this session (as the superuser, trust auth)."""
    return pg_server.create_database("fermix_session")


@pytest.fixture
def postgres_db(pg_server: pgs.PgServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a new, empty database for this test alone, dropped after it."""
    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + f"_{os.getpid()}"
    pg_server.drop_database(name)
    url = pg_server.create_database(name)
    try:
        yield url
    finally:
        pg_server.drop_database(name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for server in _started:
        ran = "" if server.bindir == server.candidate.bindir else f" (run from {server.bindir})"
        trouble = _pgvector.get(server.root)
        terminalreporter.write_line(
            f"postgres: {server.version} from {server.candidate.origin}{ran}, "
            + ("with pgvector" if trouble is None else f"pgvector unusable: {trouble}")
            + f", started in {server.startup_s:.2f} s"
            + (f" (as user {server.user.pw_name})" if server.user else "")
        )
    for reason in _unavailable[:1]:
        terminalreporter.write_line(f"postgres: unavailable, Postgres tests skipped: {reason}")
