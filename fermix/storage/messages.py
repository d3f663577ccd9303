"""The ``messages`` table: conversation history with its FTS5 mirror (S3, S4)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import apsw

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError
from fermix.storage import fts
from fermix.storage.connection import fetch_value

ROLES = frozenset({"user", "assistant", "system", "tool"})
MAX_CONTENT_CHARS = 1_000_000
MAX_METADATA_CHARS = 100_000
_COLUMNS = (
    "id, agent_id, owner_id, channel, chat_id, thread_scope, sender, role, kind, content, "
    "metadata_json, created_at"
)


@dataclass(frozen=True, slots=True, order=True)
class ConversationKey:
    """Identifies one conversation: ``{agent_id, channel, chat_id, thread_scope}`` (A1)."""

    agent_id: str
    channel: str
    chat_id: str
    thread_scope: str = ""

    def __post_init__(self) -> None:
        validate.identifier("agent_id", self.agent_id)
        validate.identifier("channel", self.channel)
        validate.identifier("chat_id", self.chat_id)
        validate.identifier("thread_scope", self.thread_scope, allow_empty=True)

    @property
    def scope_id(self) -> str:
        """The conversation scope id (SC1), unambiguous however the parts are spelled."""
        parts = [self.channel, self.chat_id] + ([self.thread_scope] if self.thread_scope else [])
        return ":".join(quote(part, safe="") for part in parts)

    def as_tuple(self) -> tuple[str, str, str, str]:
        """The key as the four column values, in index order."""
        return (self.agent_id, self.channel, self.chat_id, self.thread_scope)


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message."""

    id: int
    agent_id: str
    owner_id: str
    channel: str
    chat_id: str
    thread_scope: str
    sender: str
    role: str
    kind: str
    content: str
    metadata_json: str
    created_at: int

    @property
    def key(self) -> ConversationKey:
        """The conversation this message belongs to."""
        return ConversationKey(self.agent_id, self.channel, self.chat_id, self.thread_scope)

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata as a dict."""
        value: dict[str, Any] = json.loads(self.metadata_json)
        return value


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to be inserted; validated on construction so a bad one changes nothing."""

    key: ConversationKey
    role: str
    content: str
    owner_id: str = ""
    sender: str = ""
    kind: str = "chat"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidInputError(f"role must be one of {sorted(ROLES)}, not {self.role!r}")
        validate.text("content", self.content, max_chars=MAX_CONTENT_CHARS)
        validate.identifier("owner_id", self.owner_id, allow_empty=True)
        validate.identifier("sender", self.sender, allow_empty=True)
        validate.identifier("kind", self.kind)
        if not isinstance(self.metadata, dict):
            raise InvalidInputError("metadata must be a dict")

    def metadata_json(self) -> str:
        """The metadata serialised, refusing values JSON cannot hold."""
        if not self.metadata:
            return "{}"
        try:
            encoded = json.dumps(self.metadata, ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidInputError(f"metadata is not JSON-serialisable: {exc}") from None
        validate.text("metadata", encoded, max_chars=MAX_METADATA_CHARS)
        return encoded


def _row(values: tuple[Any, ...]) -> Message:
    return Message(*values)


def insert(conn: apsw.Connection, new: NewMessage, *, created_at: int | None = None) -> Message:
    """Insert ``new`` in the caller's transaction and return the stored row."""
    metadata_json = new.metadata_json()
    ts = now_ms() if created_at is None else created_at
    row = conn.execute(
        "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
        " kind, content, metadata_json, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
        f" RETURNING {_COLUMNS}",
        (
            new.key.agent_id,
            new.owner_id,
            new.key.channel,
            new.key.chat_id,
            new.key.thread_scope,
            new.sender,
            new.role,
            new.kind,
            new.content,
            metadata_json,
            ts,
        ),
    ).fetchall()[0]
    return _row(row)


def get(conn: apsw.Connection, message_id: int) -> Message | None:
    """The message with ``message_id``, or None."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchall()
    return _row(rows[0]) if rows else None


def conversation(
    conn: apsw.Connection,
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
    where = "agent_id = ? AND channel = ? AND chat_id = ? AND thread_scope = ? AND id > ?"
    params: list[Any] = [*key.as_tuple(), after_id]
    if role is not None:
        where += " AND role = ?"
        params.append(role)
    order = "DESC" if newest else "ASC"
    sql = f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY created_at {order}, id {order}"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    rows = [_row(r) for r in conn.execute(sql, params)]
    if newest:
        rows.reverse()
    return rows


def count(conn: apsw.Connection, key: ConversationKey, *, after_id: int = 0) -> int:
    """How many messages ``key`` has with id > ``after_id``."""
    return int(
        fetch_value(
            conn,
            "SELECT count(*) FROM messages WHERE agent_id = ? AND channel = ? AND chat_id = ?"
            " AND thread_scope = ? AND id > ?",
            (*key.as_tuple(), after_id),
        )
    )


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message found by full-text search, with its bm25 rank (lower is better)."""

    message: Message
    rank: float


def search(
    conn: apsw.Connection,
    text: str,
    *,
    agent_id: str | None = None,
    key: ConversationKey | None = None,
    owner_id: str | None = None,
    limit: int = 10,
) -> list[SearchHit]:
    """Messages matching any text, best first; filters narrow to an agent, owner or key.

    ``text`` is whatever a user or model typed: it goes through :func:`fts.build_query`, so
    FTS5 syntax in it is inert and it never raises on content. The best
    :data:`fts.CANDIDATES` matches by FTS5's bm25 are re-ranked by :func:`fts.rank` with
    statistics of the filtered rows (one conversation, not the whole table); a hit's
    ``rank`` is minus that score, so lower is still better.
    """
    match = fts.build_query(text)
    if match is None or limit <= 0:
        return []
    where: list[str] = []
    params: list[Any] = []
    if key is not None:
        where.append("m.agent_id = ? AND m.channel = ? AND m.chat_id = ? AND m.thread_scope = ?")
        params.extend(key.as_tuple())
    elif agent_id is not None:
        where.append("m.agent_id = ?")
        params.append(agent_id)
    if owner_id is not None:
        where.append("m.owner_id = ?")
        params.append(owner_id)
    sql = (
        "SELECT m.id, m.content FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid"
        f" WHERE {' AND '.join(['messages_fts MATCH ?', *where])}"
        " ORDER BY bm25(messages_fts) LIMIT ?"
    )
    candidates = max(fts.CANDIDATES, limit)
    found: list[tuple[Any, ...]] = conn.execute(sql, [match, *params, candidates]).fetchall()
    if not found:
        return []
    scope_sql = "SELECT count(*) FROM messages AS m"
    if where:
        scope_sql += f" WHERE {' AND '.join(where)}"
    scope_rows: Any = conn.execute(scope_sql, params).fetchall()[0][0]
    scores = fts.rank(
        text, [row[1] for row in found], scope_rows=int(scope_rows), tokenize=fts.tokenizer(conn)
    )
    best = sorted(range(len(found)), key=lambda i: -scores[i])[:limit]
    ids = json.dumps([found[i][0] for i in best])
    sql = f"SELECT {_COLUMNS} FROM messages WHERE id IN (SELECT value FROM json_each(?))"
    rows = conn.execute(sql, (ids,))
    by_id = {message.id: message for message in map(_row, rows)}
    # A row deleted since the match is left out rather than failing the search.
    return [SearchHit(by_id[found[i][0]], -scores[i]) for i in best if found[i][0] in by_id]
