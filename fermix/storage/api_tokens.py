"""The ``api_tokens`` table: the memory server's bearer tokens, stored as hashes (N2).

Written once for both adapters (:class:`~fermix.storage.sql.Sql`): no statement here
differs between SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fermix.clock import now_ms
from fermix.model import ApiToken
from fermix.storage.sql import Sql

COLUMNS = "id, name, prefix, agents_json, operator, created_at, revoked_at"
"""The columns of a token, in :class:`~fermix.model.ApiToken`'s order."""


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
    sql: Sql,
    *,
    name: str,
    prefix: str,
    secret_sha256: str,
    agents: tuple[str, ...],
    operator: bool,
) -> ApiToken:
    """Store a new token (its secret's hash only) and return it."""
    rows = sql.rows(
        "INSERT INTO api_tokens (name, prefix, secret_sha256, agents_json, operator, created_at)"
        f" VALUES (?, ?, ?, ?, ?, ?) RETURNING {COLUMNS}",
        (name, prefix, secret_sha256, json.dumps(list(agents)), int(operator), now_ms()),
    )
    return row_of(rows[0])


def get(sql: Sql, token_id: int) -> ApiToken | None:
    """The token ``token_id``, revoked or not, or None."""
    rows = sql.rows(f"SELECT {COLUMNS} FROM api_tokens WHERE id = ?", (token_id,))
    return row_of(rows[0]) if rows else None


def by_secret(sql: Sql, secret_sha256: str) -> ApiToken | None:
    """The live (unrevoked) token whose secret hashes to ``secret_sha256``, or None."""
    rows = sql.rows(
        f"SELECT {COLUMNS} FROM api_tokens WHERE secret_sha256 = ? AND revoked_at IS NULL",
        (secret_sha256,),
    )
    return row_of(rows[0]) if rows else None


def list_tokens(sql: Sql, *, include_revoked: bool = False) -> list[ApiToken]:
    """Every token, oldest first; revoked ones only with ``include_revoked``."""
    where = "" if include_revoked else " WHERE revoked_at IS NULL"
    return [row_of(r) for r in sql.rows(f"SELECT {COLUMNS} FROM api_tokens{where} ORDER BY id")]


def revoke(sql: Sql, token_id: int) -> ApiToken | None:
    """Revoke token ``token_id`` (once: a revoked token keeps its first time); or None."""
    rows = sql.rows(
        "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?"
        f" RETURNING {COLUMNS}",
        (now_ms(), token_id),
    )
    return row_of(rows[0]) if rows else None
