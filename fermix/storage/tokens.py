"""The ``api_tokens`` table: the memory server's bearer tokens, stored as hashes (N2)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import apsw

from fermix.clock import now_ms
from fermix.model import ApiToken

COLUMNS = "id, name, prefix, agents_json, operator, created_at, revoked_at"
"""The columns of a token, in :class:`~fermix.stored.ApiToken`'s order."""


def row_of(values: Sequence[Any]) -> ApiToken:
    """The token of one ``SELECT`` of :data:`COLUMNS`."""
    token_id, name, prefix, agents_json, operator, created_at, revoked_at = values
    return ApiToken(
        token_id,
        name,
        prefix,
        tuple(json.loads(agents_json)),
        bool(operator),
        created_at,
        revoked_at,
    )


def insert(
    conn: apsw.Connection,
    *,
    name: str,
    prefix: str,
    secret_sha256: str,
    agents: tuple[str, ...],
    operator: bool,
) -> ApiToken:
    """Store a new token (its secret's hash only) and return it."""
    conn.execute(
        "INSERT INTO api_tokens (name, prefix, secret_sha256, agents_json, operator, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (name, prefix, secret_sha256, json.dumps(list(agents)), int(operator), now_ms()),
    )
    found = get(conn, conn.last_insert_rowid())
    assert found is not None  # just inserted, in this transaction
    return found


def get(conn: apsw.Connection, token_id: int) -> ApiToken | None:
    """The token ``token_id``, revoked or not, or None."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM api_tokens WHERE id = ?", (token_id,)).fetchall()
    return row_of(rows[0]) if rows else None


def by_secret(conn: apsw.Connection, secret_sha256: str) -> ApiToken | None:
    """The live (unrevoked) token whose secret hashes to ``secret_sha256``, or None."""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM api_tokens WHERE secret_sha256 = ? AND revoked_at IS NULL",
        (secret_sha256,),
    ).fetchall()
    return row_of(rows[0]) if rows else None


def list_tokens(conn: apsw.Connection, *, include_revoked: bool = False) -> list[ApiToken]:
    """Every token, oldest first; revoked ones only with ``include_revoked``."""
    where = "" if include_revoked else " WHERE revoked_at IS NULL"
    return [
        row_of(r)
        for r in conn.execute(f"SELECT {COLUMNS} FROM api_tokens{where} ORDER BY id").fetchall()
    ]


def revoke(conn: apsw.Connection, token_id: int) -> ApiToken | None:
    """Revoke token ``token_id`` (once: a revoked token keeps its first time); or None."""
    conn.execute(
        "UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (now_ms(), token_id),
    )
    return get(conn, token_id)
