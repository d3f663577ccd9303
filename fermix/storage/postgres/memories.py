"""The ``memories`` table's own on PostgreSQL: a row's search stems and the change counters
(S5, A3); the rows themselves are written once for both adapters
(:mod:`fermix.storage.memories`), their search by text is
:mod:`fermix.storage.postgres.memory_relevance`.

A row is stored with its search stems (:func:`document`, this adapter's ``memory_search``
in its :class:`~fermix.storage.sql.Dialect`): the SQLite FTS5 tokenizer's tokens of its
key, then of its value, one position apart so that no phrase spans the two
(FTS5 matches a phrase within one column), and how many tokens the two hold (FTS5's column
sizes, for its ``bm25()``: :mod:`fermix.storage.postgres.memory_relevance`). Memory rows carry
no scope lexemes: SQLite's ``memories_fts`` has none.

Change counters are per (agent, owner) (``memory_versions``, moved by a trigger), not one
row every memory write of every service would queue on: :func:`change_counter`.
"""

from __future__ import annotations

from fermix.errors import InvalidInputError
from fermix.storage.postgres import stems
from fermix.storage.postgres.connection import Conn, fetch_value


def document(key: str, value: str) -> tuple[str, int]:
    """The ``tsvector`` literal of a row's key and value, and how many tokens they hold.

    The key's tokens take positions 1 to k, the value's k + 2 onwards; the limits of
    :mod:`fermix.storage.postgres.stems` apply (a memory row within fermix's caps never meets
    them). The count is every token of both, as FTS5 counts a row's size.
    """
    tokenize = stems.tokenizer()
    key_tokens = tokenize(key)
    value_tokens = tokenize(value)
    positions: dict[str, list[int]] = {}
    late: dict[str, None] = {}
    numbered = [
        *enumerate(key_tokens, 1),
        *enumerate(value_tokens, len(key_tokens) + 2),
    ]
    for position, token in numbered:
        if position <= stems.MAX_POSITION:
            found = positions.setdefault(token, [])
            if len(found) < stems.MAX_POSITIONS_PER_LEXEME:
                found.append(position)
        elif token not in positions:
            late[token] = None
    parts = []
    budget = stems.MAX_VECTOR_BYTES
    for token, at in [*positions.items(), *((t, []) for t in late)]:
        size = len(token.encode("utf-8"))
        cost = size + 8 + 2 * len(at)
        if size > stems.MAX_LEXEME_BYTES or cost > budget:
            continue
        budget -= cost
        parts.append(stems.lexeme(token) + (":" + ",".join(map(str, at)) if at else ""))
    return " ".join(parts), len(key_tokens) + len(value_tokens)


def change_counter(conn: Conn, agent_id: str | None = None, owner_id: str | None = None) -> int:
    """A number that changes whenever a memory row is written, by any service (A3).

    With ``agent_id`` and ``owner_id``: whenever a row that shows in that owner's prompt
    files is written (the owner's rows and the agent's shared rows, owner ``''``); with
    ``agent_id`` alone, any row of the agent; without, any row. The counters are per
    (agent, owner), moved by the ``memories_count`` trigger, and only ever grow.
    """
    params: tuple[str, ...]
    if agent_id is None:
        if owner_id is not None:
            raise InvalidInputError("memory_version: owner_id needs agent_id")
        sql, params = "SELECT coalesce(sum(version), 0) FROM memory_versions", ()
    elif owner_id is None:
        sql = "SELECT coalesce(sum(version), 0) FROM memory_versions WHERE agent_id = %s"
        params = (agent_id,)
    else:
        sql = (
            "SELECT coalesce(sum(version), 0) FROM memory_versions"
            " WHERE agent_id = %s AND owner_id IN (%s, '')"
        )
        params = (agent_id, owner_id)
    return int(fetch_value(conn, sql, params))
