"""The ``messages`` table's rules both adapters share: the search scopes' filters and tokens (H3,
SC1)."""

from __future__ import annotations

from typing import Any

from fermix.model import ConversationKey


def conversation_token(key: ConversationKey) -> str:
    """The FTS5 token of conversation ``key``'s messages (schema.sql, migration 7)."""
    return "c" + "x".join(_hex(part) for part in key.as_tuple()) + "z"


def owner_token(agent_id: str, owner_id: str) -> str:
    """The FTS5 token of the messages written by ``owner_id`` to ``agent_id``."""
    return "o" + _hex(agent_id) + "x" + _hex(owner_id) + "z"


def scope_filter(
    *,
    agent_id: str | None,
    key: ConversationKey | None,
    owner_id: str | None,
    mark: str,
) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[str, ...], bool]:
    """A search scope's parts, for either adapter's ``SearchScope`` (``mark``: the driver's
    parameter mark): its SQL conditions on ``messages AS m``, their parameters, the scope
    tokens its messages are indexed with, and whether the filter is a conversation's index
    range. ``key`` wins over ``agent_id``; an owner's token needs its agent."""
    where: list[str] = []
    params: list[Any] = []
    tokens: list[str] = []
    if key is not None:
        where.append(
            f"m.agent_id = {mark} AND m.channel = {mark} AND m.chat_id = {mark}"
            f" AND m.thread_scope = {mark}"
        )
        params.extend(key.as_tuple())
        tokens.append(conversation_token(key))
        agent_id = key.agent_id
    elif agent_id is not None:
        where.append(f"m.agent_id = {mark}")
        params.append(agent_id)
    if owner_id is not None:
        where.append(f"m.owner_id = {mark}")
        params.append(owner_id)
        if agent_id is not None:
            tokens.append(owner_token(agent_id, owner_id))
    return tuple(where), tuple(params), tuple(tokens), key is not None


MAX_SCOPED_MATCHES = 5_000
"""The most matching rows a search re-orders itself; a scope with more asks FTS5's bm25."""


def _hex(text: str) -> str:
    # SQLite's hex() of a TEXT value: its UTF-8 bytes, upper case.
    return text.encode("utf-8").hex().upper()
