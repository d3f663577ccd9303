"""The SQL both adapters share: statements written once, run through each adapter's
:class:`Sql` with its :class:`Dialect` (B1).

A shared table-family function takes a :class:`Sql` instead of a driver's connection and
writes its statements with ``?`` marks; each adapter runs them on its own driver (SQLite's
``?`` as they are, PostgreSQL's as ``%s``). Where the two dialects really differ, the
statement asks the :class:`Dialect` for the fragment (an upsert's conflict target, how a
JSON array is read, the collation that orders keys), so what differs is named, not copied.
A statement that cannot be written once (FTS5 against search stems, an advisory lock
against the write lock) stays in its adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

Params = Sequence[Any]


def _nothing(key: str, value: str) -> tuple[Any, ...]:
    return ()


@dataclass(frozen=True, slots=True)
class SearchColumns:
    """The columns a memory row stores beside its own for its adapter's search, their values
    computed in Python from the row's key and value (none where the database keeps its
    search itself, as SQLite's FTS5 mirror by triggers)."""

    names: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()
    """Each column's mark: ``?``, or ``?`` with a cast."""
    values: Callable[[str, str], tuple[Any, ...]] = _nothing
    """The columns' values for a row's key and value, in the order of :attr:`names`."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """The fragments of SQL in which SQLite and PostgreSQL differ, for shared statements."""

    name: str
    """``sqlite`` or ``postgresql``."""
    binary_order: str
    """What makes a text column sort by its bytes (SQLite's default; PostgreSQL's ``"C"``
    collation), appended to a column in an ``ORDER BY``: keys then sort the same on both."""
    json_items: str
    """A table function of one JSON array parameter, giving its items as ``value``."""

    # memory rows and prompt-file resources (memories.py, resources.py)
    for_update: str
    """What makes a ``SELECT`` lock the rows it reads until the transaction ends, appended
    to it (PostgreSQL's ``FOR UPDATE``); nothing on SQLite, whose single writer holds them
    all already."""
    owner_lock: str
    """The statement that waits for, then holds until the transaction ends, the lock of one
    (agent id, owner id) given as its two marks (PostgreSQL's advisory lock); none (``""``)
    on SQLite, whose write transactions already run one at a time."""
    memory_search: SearchColumns
    """The columns a memory row stores for this adapter's search (PostgreSQL's stems)."""

    retire_counters: str
    """The statement that renames an erased owner's change counters so they name nobody
    (PostgreSQL's ``memory_versions``; its marks: the erasure's id, the owner, the agent
    twice, None for every agent); none (``""``) on SQLite, whose counter is one for all."""

    # conversations
    skip_locked: str
    """What makes a ``SELECT`` lock the rows it returns and pass over those another
    transaction holds (PostgreSQL's ``FOR UPDATE SKIP LOCKED``; nothing on SQLite, whose
    one writer holds them all), appended after its ``LIMIT``."""


class Sql(Protocol):
    """A connection as a shared statement sees it: ``?`` marks, rows as plain tuples.

    A parameter the store cannot hold (a lone surrogate on SQLite, a NUL on PostgreSQL) is
    an :class:`~fermix.errors.InvalidInputError` on both.
    """

    @property
    def dialect(self) -> Dialect:
        """The fragments of this adapter's SQL."""
        ...

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Every row ``sql`` returns."""
        ...

    def value(self, sql: str, params: Params = ()) -> Any:
        """The first column of the first row ``sql`` returns (None when it returns none)."""
        ...

    def run(self, sql: str, params: Params = ()) -> int:
        """Run one statement; return how many rows it changed."""
        ...

    def snapshot(self) -> AbstractContextManager[None]:
        """A block whose reads see one snapshot: another connection's commit is in all of
        them or in none (inside a write transaction, the transaction's own view)."""
        ...

    def send(self, sql: str, params: Params = ()) -> None:
        """Run one statement whose result nobody reads (PostgreSQL may pipeline it: its
        error is then raised by the next statement read)."""
        ...
