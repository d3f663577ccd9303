"""The storage port's sessions on PostgreSQL: :class:`PgReads` and :class:`PgWrites`.

The same operation names, signatures and results as :class:`fermix.storage.Reads` and
:class:`fermix.storage.Writes`, for the table families of this slice (conversations,
messages, bearer tokens); each is one function of a PostgreSQL table-family module bound
to the session's connection, as on SQLite. ``tests/test_storage_contract.py`` checks the
signatures against the SQLite sessions and runs the same tests over both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from fermix.model import ConversationKey
from fermix.storage.pg import conversations as _conversations
from fermix.storage.pg import messages as _messages
from fermix.storage.pg import tokens as _tokens
from fermix.storage.pg.connection import Conn

P = ParamSpec("P")
R = TypeVar("R")


class _Op(Generic[P, R]):
    """A table-family function of a connection, offered as a method of a session (the
    :class:`fermix.storage.session._Op` of a psycopg connection)."""

    def __init__(self, fn: Callable[Concatenate[Conn, P], R]) -> None:
        self._fn = fn
        self._name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @property
    def function(self) -> Callable[Concatenate[Conn, P], R]:
        """The table-family function this operation binds."""
        return self._fn

    @overload
    def __get__(self, session: None, owner: type[Any]) -> _Op[P, R]: ...

    @overload
    def __get__(self, session: PgReads, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, session: PgReads | None, owner: type[Any]) -> _Op[P, R] | Callable[P, R]:
        if session is None:
            return self
        bound: Callable[P, R] = functools.partial(self._fn, session._conn)
        session.__dict__[self._name] = bound
        return bound


class PgReads:
    """The read operations, on one pooled connection for the length of one unit."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    # conversations: state, window, review gates
    conversation = _Op(_conversations.get)
    conversations = _Op(_conversations.list_states)
    window = _Op(_conversations.window)
    window_mark = _Op(_conversations.window_mark)
    window_snapshot = _Op(_conversations.window_snapshot)
    window_since = _Op(_conversations.window_since)
    newest_user_message_id = _Op(_conversations.newest_user_message_id)
    with_new_user_messages = _Op(_conversations.with_new_user_messages)
    review_backlog = _Op(_conversations.review_backlog)

    # messages
    message = _Op(_messages.get)
    message_by_client_key = _Op(_messages.by_client_key)
    messages = _Op(_messages.conversation)
    count_messages = _Op(_messages.count)
    search_messages = _Op(_messages.search)

    # the memory server's bearer tokens (N2)
    token = _Op(_tokens.get)
    token_by_secret = _Op(_tokens.by_secret)
    tokens = _Op(_tokens.list_tokens)


_KNOWN_ROWS = 4096


class PgWrites(PgReads):
    """The write operations (and every read), inside one write transaction.

    :meth:`touch_known` skips a touch only within one transaction: a touch locks the
    conversation's row until the commit, so no other service can change its owner or trust
    meanwhile. The committer calls :meth:`forget` at the start of every transaction and
    after every rollback (there is no cheap "did another connection commit" on PostgreSQL,
    as SQLite's data version).
    """

    def __init__(self, conn: Conn) -> None:
        super().__init__(conn)
        self._known: dict[ConversationKey, tuple[str, str]] = {}

    def touch_known(self, key: Any, owner_id: str, trust: str) -> None:
        """:meth:`touch_conversation`, skipped when this transaction already gave the row
        this owner and trust."""
        known = self._known
        mark = (owner_id, trust)
        if known.get(key) == mark:
            return
        _conversations.touch(self._conn, key, owner_id=owner_id, trust=trust)
        if len(known) >= _KNOWN_ROWS:
            known.clear()
        known[key] = mark

    def forget(self) -> None:
        """Forget the conversation rows known: the next touch of each writes again."""
        self._known.clear()

    # conversations
    touch_conversation = _Op(_conversations.touch)
    update_conversation = _Op(_conversations.update)
    claim_review = _Op(_conversations.claim_review)
    claim_due_reviews = _Op(_conversations.claim_due_reviews)
    finish_review = _Op(_conversations.finish_review)
    fail_review = _Op(_conversations.fail_review)
    release_expired_claims = _Op(_conversations.release_expired_claims)

    # messages
    insert_message = _Op(_messages.insert)

    # the memory server's bearer tokens (N2)
    insert_token = _Op(_tokens.insert)
    revoke_token = _Op(_tokens.revoke)
