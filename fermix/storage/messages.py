"""The ``messages`` table: conversation history (S3, S4), its reads written once for both
adapters (:class:`~fermix.storage.sql.Sql`), and what both adapters' searches share: the
search scopes' filters and tokens (H3, SC1) and the ranking of the candidates found.

What stays in each adapter is what differs: the insert (PostgreSQL stores the search stems
and keeps times in id order across services) and how a search finds its candidates (FTS5's
``MATCH`` against the stems' GIN index).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from fermix.model import ConversationKey, Message, SearchHit
from fermix.storage import fulltext as fts
from fermix.storage.port import CANDIDATES, SearchHits
from fermix.storage.sql import Sql

COLUMNS = (
    "id, agent_id, owner_id, channel, chat_id, thread_scope, sender, role, kind, content, "
    "metadata_json, created_at, trust, client_key"
)
"""The columns of a message, in :class:`~fermix.model.Message`'s order."""

_WHERE_KEY = "agent_id = ? AND channel = ? AND chat_id = ? AND thread_scope = ?"


def get(sql: Sql, message_id: int) -> Message | None:
    """The message with ``message_id``, or None."""
    rows = sql.rows(f"SELECT {COLUMNS} FROM messages WHERE id = ?", (message_id,))
    return Message(*rows[0]) if rows else None


def by_owner(
    sql: Sql, owner_id: str, *, agent_id: str | None = None, after_id: int = 0, limit: int = 1000
) -> list[Message]:
    """The messages ``owner_id`` is the author of (of ``agent_id``, or every agent), in id
    order after ``after_id``, at most ``limit``: one page of an export (F6)."""
    only = "" if agent_id is None else " AND agent_id = ?"
    rows = sql.rows(
        f"SELECT {COLUMNS} FROM messages WHERE owner_id = ?{only} AND id > ? ORDER BY id LIMIT ?",
        (owner_id, *(() if agent_id is None else (agent_id,)), after_id, limit),
    )
    return [Message(*r) for r in rows]


def by_client_key(sql: Sql, key: ConversationKey, client_key: str) -> Message | None:
    """The message of conversation ``key`` stored under ``client_key``, or None (N3)."""
    rows = sql.rows(
        f"SELECT {COLUMNS} FROM messages WHERE {_WHERE_KEY} AND client_key = ?",
        (*key.as_tuple(), client_key),
    )
    return Message(*rows[0]) if rows else None


def conversation(
    sql: Sql,
    key: ConversationKey,
    *,
    after_id: int = 0,
    limit: int | None = None,
    newest: bool = False,
    role: str | None = None,
) -> list[Message]:
    """Messages of ``key`` with id > ``after_id``, oldest first.

    With ``limit``, the first ``limit`` such messages, or the last ``limit`` when ``newest``
    (still returned oldest first).
    """
    where = f"{_WHERE_KEY} AND id > ?"
    params: list[Any] = [*key.as_tuple(), after_id]
    if role is not None:
        where += " AND role = ?"
        params.append(role)
    order = "DESC" if newest else "ASC"
    select = f"SELECT {COLUMNS} FROM messages WHERE {where} ORDER BY created_at {order}, id {order}"
    if limit is not None:
        select += " LIMIT ?"
        params.append(limit)
    rows = [Message(*r) for r in sql.rows(select, params)]
    if newest:
        rows.reverse()
    return rows


def count(sql: Sql, key: ConversationKey, *, after_id: int = 0) -> int:
    """How many messages ``key`` has with id > ``after_id``."""
    return int(
        sql.value(
            f"SELECT count(*) FROM messages WHERE {_WHERE_KEY} AND id > ?",
            (*key.as_tuple(), after_id),
        )
    )


def stored_after(
    sql: Sql,
    key: ConversationKey,
    *,
    after_id: int,
    stored_from: int = 0,
    limit: int | None = None,
) -> list[Message]:
    """Messages of ``key`` with id > ``after_id`` stored at or after ``stored_from`` (epoch
    ms), oldest first; the newest ``limit`` of them when given.

    The time bound is a range of the conversation's index, so a read of the few messages
    after a known one costs the same in a conversation of ten messages or of a million.
    """
    select = f"SELECT {COLUMNS} FROM messages WHERE {_WHERE_KEY} AND created_at >= ? AND id > ?"
    params: list[Any] = [*key.as_tuple(), stored_from, after_id]
    if limit is None:
        return [Message(*r) for r in sql.rows(select + " ORDER BY created_at, id", params)]
    rows = [
        Message(*r)
        for r in sql.rows(select + " ORDER BY created_at DESC, id DESC LIMIT ?", [*params, limit])
    ]
    rows.reverse()
    return rows


# -- search ----------------------------------------------------------------------------
#
# A search names its scope: one conversation (``key``), one owner's messages of an agent
# (``agent_id`` and ``owner_id``), an agent, or the whole table. A scope has two faces: the
# SQL filter on the row's own columns, which is the rule (every query of a search carries
# it), and the scope tokens that let the index walk only the scope's rows (schema migration
# 7: ``messages.search_scope`` beside the text on SQLite, lexemes in the stems on
# PostgreSQL). A vector search of messages (issue 14) takes its rows from the same filter.

MAX_SCOPED_MATCHES = 5_000
"""The most matching rows a search re-orders itself; a scope with more asks FTS5's bm25."""


def conversation_token(key: ConversationKey) -> str:
    """The FTS5 token of conversation ``key``'s messages (schema.sql, migration 7)."""
    return "c" + "x".join(_hex(part) for part in key.as_tuple()) + "z"


def owner_token(agent_id: str, owner_id: str) -> str:
    """The FTS5 token of the messages written by ``owner_id`` to ``agent_id``."""
    return "o" + _hex(agent_id) + "x" + _hex(owner_id) + "z"


def _hex(text: str) -> str:
    # SQLite's hex() of a TEXT value: its UTF-8 bytes, upper case.
    return text.encode("utf-8").hex().upper()


@dataclass(frozen=True, slots=True)
class SearchScope:
    """The messages one search covers: a SQL filter on ``messages AS m`` and the scope
    tokens every one of those messages is indexed with (none for an agent or the whole
    table, which have no token). Each adapter's subclass adds how its index is asked."""

    mark: ClassVar[str] = "?"
    """The parameter mark of the adapter's statements that carry the filter."""

    where: tuple[str, ...]
    params: tuple[Any, ...]
    tokens: tuple[str, ...]
    indexed: bool = False
    """Whether the filter is a range of an index of ``messages`` (a conversation's)."""

    @classmethod
    def of(
        cls,
        *,
        agent_id: str | None = None,
        key: ConversationKey | None = None,
        owner_id: str | None = None,
    ) -> Self:
        """The scope of a search's filters (``key`` wins over ``agent_id``; an owner's token
        needs its agent)."""
        mark = cls.mark
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
        return cls(tuple(where), tuple(params), tuple(tokens), key is not None)

    def clause(self) -> str:
        """The filter as one SQL condition on ``m`` (``true`` for the whole table)."""
        return " AND ".join(self.where) or "true"


def candidate_count(*, limit: int, ranked: int) -> int:
    """How many candidates a search with ``limit`` and ``ranked`` ranks."""
    return max(CANDIDATES, limit, ranked)


def ranked_hits(
    sql: Sql,
    text: str,
    found: Sequence[Sequence[Any]],
    *,
    scope_rows: int,
    tokenize: fts.Tokenize,
    limit: int,
    ranked: int,
) -> SearchHits:
    """The hits of a search for ``text`` among ``found`` (the ids and contents of the
    scope's matching rows, in the index's order), best first: the best
    :func:`candidate_count` by :func:`fts.preselect`, re-ranked by :func:`fts.rank` with
    statistics of the scope's ``scope_rows`` rows; a hit's ``rank`` is minus that score, so
    lower is still better, and rows that tie stay in the preselection's order.

    The best ``limit`` are read whole; with ``ranked``, the ids and ranks of the best
    ``ranked`` too (:class:`~fermix.storage.port.SearchHits`), without reading their rows.
    """
    keep = candidate_count(limit=limit, ranked=ranked)
    matched = fts.tokenize_matches(
        [row[1] for row in found], fts.query_tokens(text, tokenize), tokenize
    )
    chosen = fts.preselect(matched, scope_rows=scope_rows, keep=keep)
    found = [found[i] for i in chosen]
    scores = fts.rank(
        text,
        [row[1] for row in found],
        scope_rows=scope_rows,
        tokenize=tokenize,
        matched=matched.take(chosen),
    )
    order = sorted(range(len(found)), key=lambda i: -scores[i])
    best = order[:limit]
    ids = [int(found[i][0]) for i in best]
    rows = sql.rows(
        f"SELECT {COLUMNS} FROM messages"
        f" WHERE id IN (SELECT CAST(value AS BIGINT) FROM {sql.dialect.json_items})",
        (json.dumps(ids),),
    )
    by_id = {message.id: message for message in (Message(*r) for r in rows)}
    # A row deleted since the match is left out rather than failing the search.
    hits = [SearchHit(by_id[ids[n]], -scores[i]) for n, i in enumerate(best) if ids[n] in by_id]
    if not ranked:
        return SearchHits(hits)
    top = order[:ranked]
    return SearchHits(hits, [int(found[i][0]) for i in top], [-scores[i] for i in top])
