"""An apsw VFS that wraps the default one and fails chosen operations, for fault tests.

Arm it with how many of the next matching operations fail and with which error:
``vfs.plan.fail("write", times=2, error=apsw.IOError)``. Operations are ``write``,
``sync`` and ``lock``; an optional ``suffix`` limits the fault to files whose name ends
with it (``-wal`` for the write-ahead log). ``times=None`` fails until ``clear()``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import apsw


@dataclass
class _Rule:
    op: str
    remaining: int | None
    error: type[apsw.Error]
    suffix: str


@dataclass
class FaultPlan:
    """Which operations fail next; thread-safe."""

    rules: list[_Rule] = field(default_factory=list)
    injected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(
        self,
        op: str,
        *,
        times: int | None = 1,
        error: type[apsw.Error] = apsw.IOError,
        suffix: str = "",
    ) -> None:
        """Make the next ``times`` ``op`` operations (None: all of them) raise ``error``."""
        with self.lock:
            self.rules.append(_Rule(op, times, error, suffix))

    def clear(self) -> None:
        """Stop injecting faults."""
        with self.lock:
            self.rules.clear()

    def check(self, op: str, filename: str) -> None:
        """Raise the planned error if a rule matches this operation."""
        with self.lock:
            for rule in self.rules:
                if rule.op == op and filename.endswith(rule.suffix):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                        if rule.remaining <= 0:
                            self.rules.remove(rule)
                    self.injected += 1
                    raise rule.error(f"injected {op} fault on {filename}")


class FaultFile(apsw.VFSFile):  # type: ignore[misc]
    """A file of the default VFS whose writes, syncs and locks can be made to fail."""

    def __init__(self, plan: FaultPlan, filename: object, flags: list[int]) -> None:
        self._plan = plan
        self._name = str(filename.filename() if hasattr(filename, "filename") else filename)
        super().__init__("", filename, flags)

    def xWrite(self, data: bytes, offset: int) -> None:
        self._plan.check("write", self._name)
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:
        self._plan.check("sync", self._name)
        super().xSync(flags)

    def xLock(self, level: int) -> None:
        self._plan.check("lock", self._name)
        super().xLock(level)


class FaultVFS(apsw.VFS):  # type: ignore[misc]
    """A VFS registered under ``name`` that opens :class:`FaultFile` files."""

    def __init__(self, name: str) -> None:
        self.plan = FaultPlan()
        self.vfs_name = name
        super().__init__(name, "")

    def xOpen(self, name: object, flags: list[int]) -> FaultFile:
        return FaultFile(self.plan, name, flags)
