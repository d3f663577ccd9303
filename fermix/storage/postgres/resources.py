"""``resources`` and ``resource_revisions`` on PostgreSQL: the operations of
:mod:`fermix.storage.sqlite.resources`, with the same results (P2).

What SQLite's single writer gave for free is explicit here:

- :func:`record` numbers a revision under the resource's row lock (``SELECT ... FOR
  UPDATE``, the row inserted first when missing), and reads the current revision and the
  highest number only once the lock is granted: a statement of a READ COMMITTED
  transaction sees every commit made before it started, so two services never draw the
  same number, and content equal to the current revision records nothing.
- :func:`lock_owner` serialises whatever a unit does for one (agent, owner), such as a
  prompt-file rebuild, across services: a transaction-level advisory lock, released when
  the unit's transaction ends (it cannot leak, and survives a transaction-mode pooler).
"""

from __future__ import annotations

from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import NotFoundError
from fermix.model import Resource, Revision
from fermix.model import check_resource_name as check_name
from fermix.storage.postgres.connection import Conn, execute, fetch_rows
from fermix.storage.resources import RESOURCE_SELECT, REVISION_SELECT, sha1

_ORDER = 'agent_id COLLATE "C", owner_id COLLATE "C", name COLLATE "C"'


def get_resource(conn: Conn, agent_id: str, name: str, *, owner_id: str = "") -> Resource | None:
    """The resource ``name`` of ``agent_id`` and ``owner_id``, or None."""
    rows = fetch_rows(
        conn,
        f"{RESOURCE_SELECT} WHERE agent_id = %s AND owner_id = %s AND name = %s",
        (agent_id, owner_id, check_name(name)),
    )
    return Resource(*rows[0]) if rows else None


def list_resources(conn: Conn, agent_id: str | None = None) -> list[Resource]:
    """Every resource, or those of one agent, ordered by agent, owner and name (by code
    point, as SQLite compares text)."""
    sql = RESOURCE_SELECT
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        sql += " WHERE agent_id = %s"
        params = (agent_id,)
    return [Resource(*r) for r in fetch_rows(conn, f"{sql} ORDER BY {_ORDER}", params)]


def current(conn: Conn, agent_id: str, name: str, *, owner_id: str = "") -> Revision | None:
    """The current revision of a resource, or None when it has none."""
    resource = get_resource(conn, agent_id, name, owner_id=owner_id)
    if resource is None or resource.current_revision == 0:
        return None
    return get_revision(conn, agent_id, name, resource.current_revision, owner_id=owner_id)


def get_revision(
    conn: Conn, agent_id: str, name: str, revision: int, *, owner_id: str = ""
) -> Revision:
    """Revision ``revision`` of a resource, or :class:`NotFoundError`."""
    rows = fetch_rows(
        conn,
        REVISION_SELECT + " WHERE s.agent_id = %s AND s.owner_id = %s AND s.name = %s"
        " AND r.revision = %s",
        (agent_id, owner_id, check_name(name), revision),
    )
    if not rows:
        raise NotFoundError(f"{name} of agent {agent_id!r} has no revision {revision}")
    return Revision(*rows[0])


def history(
    conn: Conn,
    agent_id: str,
    name: str,
    *,
    owner_id: str = "",
    limit: int | None = None,
) -> list[Revision]:
    """Revisions of a resource, newest first."""
    sql = (
        REVISION_SELECT
        + " WHERE s.agent_id = %s AND s.owner_id = %s AND s.name = %s ORDER BY r.revision DESC"
    )
    params: list[Any] = [agent_id, owner_id, check_name(name)]
    if limit is not None:
        validate.positive_int("limit", limit)
        sql += " LIMIT %s"
        params.append(limit)
    return [Revision(*r) for r in fetch_rows(conn, sql, params)]


def _lock(conn: Conn, agent_id: str, owner_id: str, name: str, ts: int) -> tuple[int, int]:
    """The id and current revision of the resource, its row locked until the transaction
    ends (inserted first when missing: a concurrent insert of the same one waits, then
    finds it)."""
    key = (agent_id, owner_id, name)
    where = " WHERE agent_id = %s AND owner_id = %s AND name = %s FOR UPDATE"
    rows = fetch_rows(conn, "SELECT id, current_revision FROM resources" + where, key)
    if not rows:
        execute(
            conn,
            "INSERT INTO resources (agent_id, owner_id, name, current_revision, updated_at)"
            " VALUES (%s, %s, %s, 0, %s) ON CONFLICT (agent_id, owner_id, name) DO NOTHING",
            (*key, ts),
        )
        rows = fetch_rows(conn, "SELECT id, current_revision FROM resources" + where, key)
    return int(rows[0][0]), int(rows[0][1])


def record(
    conn: Conn,
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
    resource_id, current_number = _lock(conn, agent_id, owner_id, name, ts)
    # Read after the lock was granted: every revision committed before it is seen.
    same, highest = fetch_rows(
        conn,
        "SELECT (SELECT content_sha1 = %s AND content = %s FROM resource_revisions"
        "         WHERE resource_id = %s AND revision = %s),"
        " (SELECT coalesce(max(revision), 0) FROM resource_revisions WHERE resource_id = %s)",
        (digest, content, resource_id, current_number, resource_id),
    )[0]
    if current_number != 0 and same is None:
        raise NotFoundError(f"{name} of agent {agent_id!r} has no revision {current_number}")
    if same:
        return None
    number = int(highest) + 1
    execute(
        conn,
        "WITH added AS (INSERT INTO resource_revisions (resource_id, revision, content,"
        " content_sha1, reason, created_at) VALUES (%s, %s, %s, %s, %s, %s))"
        " UPDATE resources SET current_revision = %s, updated_at = %s WHERE id = %s",
        (resource_id, number, content, digest, reason, ts, number, ts, resource_id),
    )
    return Revision(resource_id, agent_id, owner_id, name, number, content, digest, reason, ts)


def lock_owner(conn: Conn, agent_id: str, owner_id: str) -> None:
    """Wait for, then hold until the transaction ends, the lock of (``agent_id``,
    ``owner_id``): one unit at a time per pair across every service (a prompt-file
    rebuild). A hash collision only makes two pairs wait for each other."""
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    execute(
        conn,
        "SELECT pg_advisory_xact_lock(hashtextextended(%s || chr(31) || %s, 0))",
        (agent_id, owner_id),
    )
