"""``fermix`` commands from a second process while hosts run on the same home (S8, A8).

:class:`CliLoop` runs one command after another on a thread of the test, each a fresh
``python -m fermix.cli`` process: ``memory restore`` of an archived row (which rebuilds
prompt files), ``memory list``, ``memory search`` and ``resource list``. A command fails the
test when it exits with anything but 0 (or 3: a restore of an id that does not exist yet),
or when its stderr shows an error that must never reach a caller (:data:`ERROR_MARKS`).
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from fermix.storage.sqlite.connection import fetch_rows
from fermix.storage.sqlite.migrations import open_database

ERROR_MARKS = ("Traceback", "locked", "BusyError", "StorageError", "WriteFailedError")
"""Text that must never appear in a host's or a command's stderr."""


class CliLoop:
    """Runs ``fermix`` commands one after another on a thread while it is resumed."""

    def __init__(self, home: Path, rng: random.Random) -> None:
        """Commands on ``home``, chosen by ``rng``; started and stopped as a context."""
        self.home = home
        self.rng = rng
        self.failures: list[str] = []
        self.ran: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._active = False
        self._busy = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="soak-cli", daemon=True)

    def __enter__(self) -> CliLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(180)

    def resume(self) -> None:
        """Start running commands (again)."""
        with self._cond:
            self._active = True
            self._cond.notify_all()

    def pause(self) -> None:
        """Stop starting commands and wait for the one running to end."""
        with self._cond:
            self._active = False
            assert self._cond.wait_for(lambda: not self._busy, timeout=180)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._active or self._stopped)
                if self._stopped:
                    return
                self._busy = True
            try:
                self._run_one()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _command(self) -> list[str]:
        pick = self.rng.random()
        if pick < 0.4:
            return ["memory", "restore", str(self._archived_id()), "--json"]
        if pick < 0.6:
            return ["memory", "list", "--json"]
        if pick < 0.8:
            return ["resource", "list", "--json"]
        return ["memory", "search", self.rng.choice(["fact", "tea", "now"])]

    def _archived_id(self) -> int:
        db = self.home / "memory.db"
        if db.exists():
            conn = open_database(db)
            try:
                ids = [
                    int(i)
                    for (i,) in fetch_rows(
                        conn, "SELECT id FROM memories WHERE archived_at IS NOT NULL"
                    )
                ]
            finally:
                conn.close()
            if ids:
                return self.rng.choice(ids)
        return self.rng.randint(1, 80)

    def _run_one(self) -> None:
        args = self._command()
        done = subprocess.run(
            [sys.executable, "-m", "fermix.cli", "--home", str(self.home), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.ran[" ".join(args[:2])] += 1
        # 3: restore of an id that does not exist (yet); anything else must succeed.
        if done.returncode not in (0, 3) or any(m in done.stderr for m in ERROR_MARKS):
            self.failures.append(f"{args}: exit {done.returncode}: {done.stderr.strip()}")
