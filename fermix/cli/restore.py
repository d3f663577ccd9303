"""``fermix restore --from-replica``: rebuild memory.db from its Litestream replica (N9).

The replica is the one ``[fermix_core.replica] url`` names (see :mod:`fermix.server.replica`
and docs/replica.md). Restoring into a live home is refused while the server runs, and
over an existing database unless ``--force``, which moves the old files aside
(``memory.db.before-restore-<time>``, with its ``-wal`` and ``-shm``) and never deletes
them. The replica is first restored into a private folder beside the target, opened with
fermix's own migrations check and made owner-only; only then does it take the target's
place, so a failed restore leaves the old database where it was. A home whose memory is in
PostgreSQL has no Litestream replica: the command is refused, naming PostgreSQL's own tools.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fermix.cli.context import CommandContext
from fermix.cli.output import console
from fermix.config import ReplicaConfig, load_config
from fermix.errors import InvalidInputError, ServiceError
from fermix.home import PRIVATE_FILE_MODE, Home, make_private_dir
from fermix.server import replica, service
from fermix.storage import open_file

SIDE_FILES = ("-wal", "-shm")
META_DIR = ".{}-litestream"
"""Litestream's local state beside a database: stale once the database is replaced."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``restore`` command."""
    p = sub.add_parser("restore", help="restore memory.db from its Litestream replica (N9)")
    p.add_argument(
        "--from-replica",
        action="store_true",
        required=True,
        help="restore from the replica [fermix_core.replica] url names",
    )
    p.add_argument("--to", metavar="PATH", help="write the database there instead of memory.db")
    p.add_argument(
        "--force",
        action="store_true",
        help="move an existing database aside (memory.db.before-restore-<time>), never delete",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to allow (600)")
    p.set_defaults(handler=cmd_restore)


@dataclass(frozen=True)
class Restored:
    """What a restore put in place."""

    path: Path
    size: int
    conversations: int
    messages: int
    moved_aside: tuple[Path, ...]


def cmd_restore(ctx: CommandContext, args: argparse.Namespace) -> int:
    """``fermix restore --from-replica [--to PATH] [--force]``."""
    loaded = load_config(ctx.home.config_path)
    replica.refuse_postgres(loaded, "fermix restore --from-replica")
    config = loaded.replica
    if config.url is None:
        raise InvalidInputError(
            "no replica is configured: set [fermix_core.replica] url in "
            f"{ctx.home.config_path} (fermix config set fermix_core.replica.url file:///...)"
        )
    target = Path(args.to).expanduser().absolute() if args.to else ctx.home.db_path
    done = restore(ctx.home, config, target, force=args.force, timeout=args.timeout)
    lines = [
        f"restored {done.path} from {config.url}",
        f"{done.size} bytes, {done.conversations} conversation(s), {done.messages} message(s)",
        *(f"kept the previous file as {path}" for path in done.moved_aside),
    ]
    out = console()
    for line in lines:  # paths whole, whatever the width; a "[" in one is not markup
        out.print(line, soft_wrap=True, markup=False)
    return 0


def restore(
    home: Home, config: ReplicaConfig, target: Path, *, force: bool, timeout: float
) -> Restored:
    """Restore the replica of ``config`` into ``target`` (see the module docstring)."""
    live = target.resolve() == home.db_path.resolve()
    if live:
        pid = service.running_pid(service.ServicePaths.of(home))
        if pid is not None:
            raise ServiceError(
                f"the server runs (pid {pid}) on this home: stop it first"
                " (fermix server stop), then restore"
            )
    present = [p for p in _family(target) if p.exists()]
    if present and not force:
        raise InvalidInputError(
            f"{target} already exists: pass --force to move it aside (it is never deleted),"
            " or --to PATH to restore elsewhere"
        )
    make_private_dir(target.parent)
    staging = Path(tempfile.mkdtemp(prefix=".fermix-restore-", dir=target.parent))  # 0700
    try:
        fresh = staging / target.name
        fetch_replica(config, fresh, timeout=timeout)
        os.chmod(fresh, PRIVATE_FILE_MODE)
        conversations, messages = _check(fresh)
        moved = _move_aside(target, live=live) if present or live else ()
        for suffix in ("", *SIDE_FILES):
            made = fresh.with_name(fresh.name + suffix)
            if made.exists():
                os.chmod(made, PRIVATE_FILE_MODE)
                os.replace(made, target.with_name(target.name + suffix))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Restored(target, target.stat().st_size, conversations, messages, moved)


def _family(db: Path) -> list[Path]:
    """A database file and its WAL and shared-memory files: they only make sense together."""
    return [db, *(db.with_name(db.name + suffix) for suffix in SIDE_FILES)]


def _check(path: Path) -> tuple[int, int]:
    """Open ``path`` as fermix does (migrations included); its conversations and messages."""
    db = open_file(path)
    try:
        with db.read() as reads:
            states = reads.conversations()
            return len(states), sum(reads.count_messages(state.key) for state in states)
    finally:
        db.close()


def _move_aside(target: Path, *, live: bool) -> tuple[Path, ...]:
    """Rename the old database family (and Litestream's stale state) with a time suffix.

    A stale WAL left beside the restored file would be replayed into it, and Litestream's
    local state describes the old file's history; both go aside with the database.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = f"{target.name}.before-restore-{stamp}"
    while target.with_name(aside).exists():  # a second restore within the same second
        stamp += "x"
        aside = f"{target.name}.before-restore-{stamp}"
    moved = []
    for suffix, path in zip(("", *SIDE_FILES), _family(target), strict=True):
        if path.exists():
            os.replace(path, target.with_name(aside + suffix))
            moved.append(target.with_name(aside + suffix))
    meta = target.with_name(META_DIR.format(target.name))
    if live and meta.exists():
        os.replace(meta, target.with_name(META_DIR.format(aside)))
        moved.append(target.with_name(META_DIR.format(aside)))
    return tuple(moved)


def fetch_replica(config: ReplicaConfig, output: Path, *, timeout: float = 600.0) -> None:
    """Restore the newest database of ``config.url`` into the new file ``output`` (N9).

    ``litestream restore -o`` rebuilds it from the replica's snapshot and LTX files; the
    file's mode is Litestream's, so the caller makes it owner-only before use.
    """
    if config.url is None:
        raise ServiceError("no replica configured")
    command = [replica.litestream_binary(config), "restore", "-o", str(output), config.url]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"litestream restore did not finish within {timeout:g} s") from None
    if done.returncode != 0 or not output.is_file():
        said = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        raise ServiceError(f"cannot restore from {config.url}: {said}")
