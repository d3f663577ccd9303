"""The permissions check (M10): the home and what holds personal data in it are owner-only,
and the repair (``--fix``) that makes a looser path so.

The paths looked at are the home itself, ``memory.db`` and its ``-wal``, ``-shm`` and
``-journal`` files, ``config.toml``, and the whole ``memory/`` tree (prompt files, their
folders, lock and temporary files). A path is loose when any group or other permission bit
is set. fermix creates each of them owner-only whatever the umask, but never changes an
existing one by itself: a home made by hand, by an older fermix or copied under another
umask keeps its modes until the operator runs ``fermix doctor --fix``, which removes the
group and other bits (``chmod go-rwx``) and keeps the owner's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fermix.cli.doctor_checks.outcome import Check
from fermix.home import OTHERS_BITS, Home

DATABASE_SIDE_FILES = ("-wal", "-shm", "-journal")
NAMED_IN_SUMMARY = 3


@dataclass(frozen=True)
class LoosePath:
    """A path in the home that other accounts may read, write or enter."""

    path: Path
    mode: int
    """Its permission bits (``0o644``)."""

    @property
    def tightened(self) -> int:
        """Its mode without any group or other bit."""
        return self.mode & ~OTHERS_BITS


def private_paths(home: Home, *, database: bool = True) -> Iterator[Path]:
    """Every path of ``home`` that must be owner-only, whether it exists or not; the
    ``memory/`` tree is walked without following symbolic links. ``database`` False leaves
    out ``memory.db`` and its side files (the memory is in PostgreSQL)."""
    yield home.root
    if database:
        db = home.db_path
        yield db
        for suffix in DATABASE_SIDE_FILES:
            yield db.with_name(db.name + suffix)
    yield home.config_path
    tree = home.root / "memory"
    yield tree
    for folder, dirs, names in os.walk(tree):
        dirs.sort()
        base = Path(folder)
        for name in [*dirs, *sorted(names)]:
            yield base / name


def _mode(path: Path, *, follow: bool) -> int | None:
    """The permission bits of ``path``; None when it is missing or is a symbolic link."""
    try:
        found = os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return None if stat.S_ISLNK(found.st_mode) else stat.S_IMODE(found.st_mode)


def scan(home: Home, *, database: bool = True) -> tuple[int, list[LoosePath]]:
    """How many paths of ``home`` exist, and those with a group or other bit set.

    The home itself may be a symbolic link (its target is judged); a link inside it is
    skipped, so ``--fix`` never changes a file outside the home through one.
    """
    seen = 0
    loose = []
    for path in private_paths(home, database=database):
        mode = _mode(path, follow=path == home.root)
        if mode is None:
            continue
        seen += 1
        if mode & OTHERS_BITS:
            loose.append(LoosePath(path, mode))
    return seen, loose


def _shown(home: Home, found: LoosePath) -> str:
    """``memory.db (0644)``; ``the home (0755)`` for the home itself."""
    name = "the home" if found.path == home.root else str(found.path.relative_to(home.root))
    return f"{name} ({found.mode:04o})"


def check_permissions(home: Home, *, database: bool = True) -> Check:
    """The home, its database and WAL/SHM (unless ``database`` is False: the memory is in
    PostgreSQL), config.toml and prompt files are owner-only (M10)."""
    if not home.root.exists():
        return Check("permissions", "pass", "no home yet; fermix creates it owner-only")
    seen, loose = scan(home, database=database)
    if not loose:
        return Check("permissions", "pass", f"{seen} path(s) in the home are owner-only")
    named = ", ".join(_shown(home, found) for found in loose[:NAMED_IN_SUMMARY])
    more = f" and {len(loose) - NAMED_IN_SUMMARY} more" if len(loose) > NAMED_IN_SUMMARY else ""
    summary = f"{len(loose)} path(s) open to other accounts: {named}{more}"
    hint = (
        "they hold conversations and facts about people; `fermix doctor --fix` removes the"
        " group and other permission bits (chmod go-rwx)"
    )
    details = [{"path": str(found.path), "mode": f"{found.mode:04o}"} for found in loose]
    return Check("permissions", "warn", summary, hint, "permissions", details)


def tighten(home: Home, *, database: bool = True) -> list[str]:
    """Remove the group and other bits of every loose path found now; say what was done.

    Paths are found again rather than taken from the check: a WAL file may have gone or
    come since. A path whose mode cannot be changed (another account owns it) is named.
    """
    _, loose = scan(home, database=database)
    done = []
    changed = 0
    for found in loose:
        try:
            os.chmod(found.path, found.tightened)
        except FileNotFoundError:
            continue
        except OSError as exc:
            done.append(f"could not make {_shown(home, found)} owner-only: {exc.strerror}")
            continue
        changed += 1
    if changed:
        done.insert(0, f"made {changed} path(s) owner-only (removed group and other bits)")
    return done
