"""What both adapters' databases share: write units through the process's group commit
(:class:`~fermix.storage.leaders.GroupCommit`), refused when the database was opened only to
be inspected (S1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from fermix.errors import StorageError
from fermix.storage.leaders import SIZE_SLOTS, CommitObserver, CommitStats, GroupCommit
from fermix.storage.port import Repair, Storage, Writes

T = TypeVar("T")
W = TypeVar("W", bound=Writes)


class _Pool(Protocol):
    def close(self) -> None: ...


class GroupCommitted(Storage):
    """A database whose writes run through one group commit, and none when it was opened
    by ``inspect`` (``fermix doctor``). Each adapter opens it and gives its read units."""

    name: str
    """The database in messages (a file's name, a server's database without its password)."""
    _committer: GroupCommit | None
    _readers: _Pool

    def write(self, unit: Callable[[Writes], T], *, label: str = "write") -> T:
        """Run ``unit`` in a write transaction; return its result once committed.

        Concurrent units share commits. A unit's own error reaches only its caller and
        leaves nothing of that unit; a database error is a
        :class:`~fermix.errors.WriteFailedError` after the writer's retries.
        """
        return self._writer(label).run(unknowing(unit), label=label)

    def write_aside(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write`; an adapter whose database takes concurrent writers runs it apart."""
        return self.write(unit, label=label)

    def append(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """:meth:`write` for a unit that changes no conversation's owner or trust but through
        :meth:`Writes.touch_known` (an append): what this process knows of those stays."""
        return self._writer(label).run(unit, label=label)

    def write_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """Run each ``(unit, label)`` as :meth:`write` would, in order, sharing commits;
        return each outcome, ``(True, result)`` or ``(False, error)``, once committed.

        One caller, many independent writes: a server batching its concurrent requests.
        """
        return self._writer("writes").run_many([(unknowing(unit), label) for unit, label in units])

    def append_each(
        self, units: Sequence[tuple[Callable[[Writes], T], str]]
    ) -> list[tuple[bool, T | BaseException]]:
        """:meth:`write_each` for appends, as :meth:`append` is :meth:`write` for one."""
        return self._writer("writes").run_many(list(units))

    def repair(self, unit: Callable[[Repair], T], *, label: str = "repair") -> T:
        """:meth:`write` for ``fermix doctor --fix``: the unit may rebuild a full-text index
        (an FTS mirror, search stems)."""
        return self._writer(label).run(unknowing(unit), label=label)

    def _writer(self, label: str) -> GroupCommit:
        """The group commit; a :class:`StorageError` when opened by ``inspect``."""
        if self._committer is None:
            raise StorageError(f"{self.name} is open for inspection only: {label} refused")
        return self._committer

    @property
    def commits(self) -> int:
        """Write transactions committed so far (for benchmarks and tests)."""
        return 0 if self._committer is None else self._committer.batches

    def observe(self, observer: CommitObserver) -> None:
        """Tell ``observer`` of the group commit's retries and failures from now on (O1)."""
        if self._committer is not None:
            self._committer.observer = observer

    def commit_stats(self) -> CommitStats:
        """What the group commit did so far, and the writes queued behind it (O1)."""
        if self._committer is None:
            return CommitStats(0, 0, (0,) * (SIZE_SLOTS + 1), 0)
        return self._committer.stats()

    def close(self) -> None:
        """Finish the queued writes, then close every connection."""
        try:
            if self._committer is not None:
                self._committer.close()
        finally:
            self._readers.close()


def unknowing(unit: Callable[[W], T]) -> Callable[[W], T]:
    """``unit``, first making its session drop the conversation rows it knows: any unit
    but an append may change an owner or a trust."""

    def run(writes: W) -> T:
        writes.drop_known()
        return unit(writes)

    return run
