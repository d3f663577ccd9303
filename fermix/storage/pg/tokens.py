"""The ``api_tokens`` table on PostgreSQL: the operations of :mod:`fermix.storage.tokens`."""

from __future__ import annotations

import json

from fermix.clock import now_ms
from fermix.model import ApiToken
from fermix.storage.pg.connection import Conn, fetch_rows
from fermix.storage.tokens import COLUMNS, row_of


def insert(
    conn: Conn,
    *,
    name: str,
    prefix: str,
    secret_sha256: str,
    agents: tuple[str, ...],
    operator: bool,
) -> ApiToken:
    """Store a new token (its secret's hash only) and return it."""
    rows = fetch_rows(
        conn,
        "INSERT INTO api_tokens (name, prefix, secret_sha256, agents_json, operator, created_at)"
        f" VALUES (%s, %s, %s, %s, %s, %s) RETURNING {COLUMNS}",
        (name, prefix, secret_sha256, json.dumps(list(agents)), int(operator), now_ms()),
    )
    return row_of(rows[0])


def get(conn: Conn, token_id: int) -> ApiToken | None:
    """The token ``token_id``, revoked or not, or None."""
    rows = fetch_rows(conn, f"SELECT {COLUMNS} FROM api_tokens WHERE id = %s", (token_id,))
    return row_of(rows[0]) if rows else None


def by_secret(conn: Conn, secret_sha256: str) -> ApiToken | None:
    """The live (unrevoked) token whose secret hashes to ``secret_sha256``, or None."""
    rows = fetch_rows(
        conn,
        f"SELECT {COLUMNS} FROM api_tokens WHERE secret_sha256 = %s AND revoked_at IS NULL",
        (secret_sha256,),
    )
    return row_of(rows[0]) if rows else None


def list_tokens(conn: Conn, *, include_revoked: bool = False) -> list[ApiToken]:
    """Every token, oldest first; revoked ones only with ``include_revoked``."""
    where = "" if include_revoked else " WHERE revoked_at IS NULL"
    return [
        row_of(r) for r in fetch_rows(conn, f"SELECT {COLUMNS} FROM api_tokens{where} ORDER BY id")
    ]


def revoke(conn: Conn, token_id: int) -> ApiToken | None:
    """Revoke token ``token_id`` (once: a revoked token keeps its first time); or None."""
    rows = fetch_rows(
        conn,
        "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, %s) WHERE id = %s"
        f" RETURNING {COLUMNS}",
        (now_ms(), token_id),
    )
    return row_of(rows[0]) if rows else None
