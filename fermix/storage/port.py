"""``Storage``: the storage port, what every adapter offers the layers above (issue 15).

Two adapters implement it: :class:`fermix.storage.Database` (SQLite, one file in the home,
the default) and :class:`fermix.storage.pg.PgDatabase` (PostgreSQL, shared by several
services). The layers above annotate ``Storage`` and never learn which one runs; each
adapter's sessions subclass :class:`~fermix.storage.session.Reads` and
:class:`~fermix.storage.session.Writes` with operations of the same names and signatures
(checked by mypy through the shared ``_Op`` type, and by ``tests/test_storage_contract.py``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from fermix.storage.session import Reads, Writes

T = TypeVar("T")


class Storage(abc.ABC):
    """One process's way into the store: read units, and write units through its group
    commit."""

    name: str
    """What the store is, for messages and logs: a file name, or a database without its
    password."""

    @property
    @abc.abstractmethod
    def key(self) -> str:
        """One string per store, the same in every process that opens it (a registry key:
        the file's path, or the URL without its password)."""

    @property
    def shared(self) -> bool:
        """Whether services on other machines may write the same store (PostgreSQL): caches
        then check freshness per conversation and per (agent, owner), never a local file."""
        return False

    @abc.abstractmethod
    def read(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[Reads]:
        """A read unit: the block's reads run on one pooled read connection. A database error
        is a :class:`~fermix.errors.StorageError` naming the store."""

    @abc.abstractmethod
    def write(self, unit: Callable[[Writes], T], *, label: str = "write") -> T:
        """Run ``unit`` in a write transaction; return its result once committed."""

    @abc.abstractmethod
    def append(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write` for a unit that changes no conversation's owner or trust but through
        :meth:`Writes.touch_known` (an append)."""

    @abc.abstractmethod
    def write_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """Run each ``(unit, label)`` as :meth:`write` would, in order, sharing commits;
        return each outcome, ``(True, result)`` or ``(False, error)``, once committed."""

    @abc.abstractmethod
    def append_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """:meth:`write_each` for appends, as :meth:`append` is :meth:`write` for one."""

    @property
    @abc.abstractmethod
    def commits(self) -> int:
        """Write transactions committed so far (for benchmarks and tests)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finish the queued writes, then close every connection."""
