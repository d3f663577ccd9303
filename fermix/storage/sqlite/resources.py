"""``resources`` and ``resource_revisions``: versioned prompt files per agent (P2)."""

from __future__ import annotations

from typing import Any

import apsw

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import NotFoundError
from fermix.model import Resource, Revision
from fermix.model import check_resource_name as check_name
from fermix.storage.resources import RESOURCE_SELECT, REVISION_SELECT, sha1
from fermix.storage.sqlite.connection import fetch_rows, fetch_value


def get_resource(
    conn: apsw.Connection, agent_id: str, name: str, *, owner_id: str = ""
) -> Resource | None:
    """The resource ``name`` of ``agent_id`` and ``owner_id``, or None."""
    rows = fetch_rows(
        conn,
        f"{RESOURCE_SELECT} WHERE agent_id = ? AND owner_id = ? AND name = ?",
        (agent_id, owner_id, check_name(name)),
    )
    return Resource(*rows[0]) if rows else None


def list_resources(conn: apsw.Connection, agent_id: str | None = None) -> list[Resource]:
    """Every resource, or those of one agent, ordered by agent and name."""
    sql = RESOURCE_SELECT
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = ?"
        params = (agent_id,)
    return [
        Resource(*r) for r in fetch_rows(conn, sql + " ORDER BY agent_id, owner_id, name", params)
    ]


def current(
    conn: apsw.Connection, agent_id: str, name: str, *, owner_id: str = ""
) -> Revision | None:
    """The current revision of a resource, or None when it has none."""
    resource = get_resource(conn, agent_id, name, owner_id=owner_id)
    if resource is None or resource.current_revision == 0:
        return None
    return get_revision(conn, agent_id, name, resource.current_revision, owner_id=owner_id)


def get_revision(
    conn: apsw.Connection, agent_id: str, name: str, revision: int, *, owner_id: str = ""
) -> Revision:
    """Revision ``revision`` of a resource, or :class:`NotFoundError`."""
    rows = fetch_rows(
        conn,
        REVISION_SELECT + " WHERE s.agent_id = ? AND s.owner_id = ? AND s.name = ?"
        " AND r.revision = ?",
        (agent_id, owner_id, check_name(name), revision),
    )
    if not rows:
        raise NotFoundError(f"{name} of agent {agent_id!r} has no revision {revision}")
    return Revision(*rows[0])


def history(
    conn: apsw.Connection,
    agent_id: str,
    name: str,
    *,
    owner_id: str = "",
    limit: int | None = None,
) -> list[Revision]:
    """Revisions of a resource, newest first."""
    sql = (
        REVISION_SELECT
        + " WHERE s.agent_id = ? AND s.owner_id = ? AND s.name = ? ORDER BY r.revision DESC"
    )
    params: list[Any] = [agent_id, owner_id, check_name(name)]
    if limit is not None:
        validate.positive_int("limit", limit)
        sql += " LIMIT ?"
        params.append(limit)
    return [Revision(*r) for r in fetch_rows(conn, sql, params)]


def record(
    conn: apsw.Connection,
    agent_id: str,
    name: str,
    content: str,
    *,
    reason: str,
    owner_id: str = "",
    now: int | None = None,
) -> Revision | None:
    """Record ``content`` as the next revision, in the caller's transaction.

    Returns None, recording nothing, when ``content`` equals the current revision.
    """
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    check_name(name)
    ts = now_ms() if now is None else now
    digest = sha1(content)
    conn.execute(
        "INSERT INTO resources (agent_id, owner_id, name, current_revision, updated_at)"
        " VALUES (?, ?, ?, 0, ?) ON CONFLICT (agent_id, owner_id, name) DO NOTHING",
        (agent_id, owner_id, name, ts),
    )
    resource = get_resource(conn, agent_id, name, owner_id=owner_id)
    assert resource is not None
    latest = current(conn, agent_id, name, owner_id=owner_id)
    if latest is not None and latest.content_sha1 == digest and latest.content == content:
        return None
    number = int(
        fetch_value(
            conn,
            "SELECT coalesce(max(revision), 0) + 1 FROM resource_revisions WHERE resource_id = ?",
            (resource.id,),
        )
    )
    conn.execute(
        "INSERT INTO resource_revisions (resource_id, revision, content, content_sha1, reason,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (resource.id, number, content, digest, reason, ts),
    )
    conn.execute(
        "UPDATE resources SET current_revision = ?, updated_at = ? WHERE id = ?",
        (number, ts, resource.id),
    )
    return Revision(resource.id, agent_id, owner_id, name, number, content, digest, reason, ts)


def lock_owner(conn: apsw.Connection, agent_id: str, owner_id: str) -> None:
    """Hold the lock of (``agent_id``, ``owner_id``) until the transaction ends: one unit at
    a time per pair (a prompt-file rebuild). Nothing to take on SQLite, whose single writer
    already runs one write transaction at a time; the ids are checked as on PostgreSQL."""
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
