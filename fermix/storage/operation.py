"""``Op``: a table-family function of a connection, offered as a method of a session.

Each adapter's sessions (:mod:`fermix.storage.sqlite.session`,
:mod:`fermix.storage.postgres.session`) are lists of these bindings: the table-family
modules stay the single place each query is written, and the session is what the port's
Protocols (:mod:`fermix.storage.port`) describe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from fermix.model import ConversationKey
    from fermix.storage.sql import Sql

_KNOWN_ROWS = 4096
"""Conversation rows a write session remembers at most (then it starts over)."""


class Session:
    """A unit's session: the connection its adapter's operations are bound to, and the same
    connection as the shared statements see it (:class:`~fermix.storage.sql.Sql`)."""

    def __init__(self, conn: Any) -> None:
        self._conn: Any = conn
        self._sql: Sql = self.shared_sql(conn)

    def shared_sql(self, conn: Any) -> Sql:
        """``conn`` as the shared statements see it (each adapter's own wrapper)."""
        raise NotImplementedError


class Op(Generic[P, R]):
    """A table-family function of a connection, offered as a method of a session.

    The function bound to the session's connection is a :func:`functools.partial` (no
    Python frame of its own per call), made at the first access and kept on the session:
    this is a non-data descriptor, so later accesses find it in the instance's dict.
    """

    via: str = "_conn"
    """The session's attribute the function is bound to: the adapter's own connection."""

    def __init__(self, fn: Callable[Concatenate[Any, P], R]) -> None:
        self._fn = fn
        self._name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @property
    def function(self) -> Callable[Concatenate[Any, P], R]:
        """The table-family function this operation binds."""
        return self._fn

    @overload
    def __get__(self, session: None, owner: type[Any]) -> Op[P, R]: ...

    @overload
    def __get__(self, session: Session, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, session: Session | None, owner: type[Any]) -> Op[P, R] | Callable[P, R]:
        if session is None:
            return self
        bound: Callable[P, R] = functools.partial(self._fn, getattr(session, self.via))
        session.__dict__[self._name] = bound
        return bound


class SqlOp(Op[P, R]):
    """An operation written once for both adapters: a function of a
    :class:`~fermix.storage.sql.Sql`, bound to the session's."""

    via = "_sql"


class WriteSession(Session):
    """A write unit's session: it remembers the owner and trust it last gave each
    conversation row (:meth:`touch_known`), as long as nothing else may have changed them.

    Its adapter's group commit calls :meth:`drop_known` whenever that may no longer hold (after
    a rollback; on SQLite when another connection committed, on PostgreSQL at the start of
    every transaction).
    """

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self._known: dict[ConversationKey, tuple[str, str]] = {}

    def touch_conversation(self, key: ConversationKey, *, owner_id: str, trust: str) -> None:
        raise NotImplementedError  # each adapter binds its own (an Op of its table family)

    def touch_known(self, key: ConversationKey, owner_id: str, trust: str) -> None:
        """:meth:`touch_conversation`, skipped when this session gave the row this owner
        and trust and nothing can have changed it since (one statement less per append)."""
        known = self._known
        mark = (owner_id, trust)
        if known.get(key) == mark:
            return
        self.touch_conversation(key, owner_id=owner_id, trust=trust)
        if len(known) >= _KNOWN_ROWS:
            known.clear()
        known[key] = mark

    def drop_known(self) -> None:
        """Drop the conversation rows known: the next touch of each writes again."""
        self._known.clear()
