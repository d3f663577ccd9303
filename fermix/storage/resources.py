"""``resources`` and ``resource_revisions``: versioned prompt files per agent and owner (P1,
P2), written once for both adapters (:class:`~fermix.storage.sql.Sql`).

What SQLite's single writer gives for free is explicit, named in the
:class:`~fermix.storage.sql.Dialect` where the two differ:

- :func:`record` numbers a revision under the resource's row lock (``for_update``: a
  ``SELECT ... FOR UPDATE`` on PostgreSQL, the row inserted first when missing), and reads
  the current revision and the highest number only once the lock is granted: a statement
  of a READ COMMITTED transaction sees every commit made before it started, so two
  services never draw the same number, and content equal to the current revision records
  nothing.
- :func:`lock_owner` serialises whatever a unit does for one (agent, owner), such as a
  prompt-file rebuild, across services (``owner_lock``: a transaction-level advisory lock
  on PostgreSQL, released when the unit's transaction ends, so it cannot leak and survives
  a transaction-mode pooler; nothing on SQLite, whose write transactions run one at a time).
"""

from __future__ import annotations

import hashlib
from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import NotFoundError
from fermix.model import Resource, Revision
from fermix.model import check_resource_name as check_name
from fermix.storage.sql import Sql

RESOURCE_SELECT = "SELECT id, agent_id, owner_id, name, current_revision, updated_at FROM resources"
"""A ``SELECT`` of :class:`~fermix.model.Resource`'s columns, for a ``WHERE`` to follow."""


REVISION_SELECT = (
    "SELECT r.resource_id, s.agent_id, s.owner_id, s.name, r.revision, r.content,"
    " r.content_sha1, r.reason, r.created_at"
    " FROM resource_revisions AS r JOIN resources AS s ON s.id = r.resource_id"
)
"""A ``SELECT`` of :class:`~fermix.model.Revision`'s columns (revisions ``r`` of resources
``s``), for a ``WHERE`` to follow."""


def sha1(content: str) -> str:
    """The hex sha1 of ``content`` as UTF-8, used to tell whether a file changed."""
    return hashlib.sha1(content.encode("utf-8")).hexdigest()


def get_resource(sql: Sql, agent_id: str, name: str, *, owner_id: str = "") -> Resource | None:
    """The resource ``name`` of ``agent_id`` and ``owner_id``, or None."""
    rows = sql.rows(
        f"{RESOURCE_SELECT} WHERE agent_id = ? AND owner_id = ? AND name = ?",
        (agent_id, owner_id, check_name(name)),
    )
    return Resource(*rows[0]) if rows else None


def list_resources(sql: Sql, agent_id: str | None = None) -> list[Resource]:
    """Every resource, or those of one agent, ordered by agent, owner and name (by code
    point)."""
    statement = RESOURCE_SELECT
    params: tuple[Any, ...] = ()
    if agent_id is not None:
        statement += " WHERE agent_id = ?"
        params = (agent_id,)
    binary = sql.dialect.binary_order
    statement += f" ORDER BY agent_id{binary}, owner_id{binary}, name{binary}"
    return [Resource(*r) for r in sql.rows(statement, params)]


def current(sql: Sql, agent_id: str, name: str, *, owner_id: str = "") -> Revision | None:
    """The current revision of a resource, or None when it has none."""
    resource = get_resource(sql, agent_id, name, owner_id=owner_id)
    if resource is None or resource.current_revision == 0:
        return None
    return get_revision(sql, agent_id, name, resource.current_revision, owner_id=owner_id)


def get_revision(
    sql: Sql, agent_id: str, name: str, revision: int, *, owner_id: str = ""
) -> Revision:
    """Revision ``revision`` of a resource, or :class:`NotFoundError`."""
    rows = sql.rows(
        REVISION_SELECT + " WHERE s.agent_id = ? AND s.owner_id = ? AND s.name = ?"
        " AND r.revision = ?",
        (agent_id, owner_id, check_name(name), revision),
    )
    if not rows:
        raise NotFoundError(f"{name} of agent {agent_id!r} has no revision {revision}")
    return Revision(*rows[0])


def history(
    sql: Sql,
    agent_id: str,
    name: str,
    *,
    owner_id: str = "",
    limit: int | None = None,
) -> list[Revision]:
    """Revisions of a resource, newest first."""
    statement = (
        REVISION_SELECT
        + " WHERE s.agent_id = ? AND s.owner_id = ? AND s.name = ? ORDER BY r.revision DESC"
    )
    params: list[Any] = [agent_id, owner_id, check_name(name)]
    if limit is not None:
        validate.positive_int("limit", limit)
        statement += " LIMIT ?"
        params.append(limit)
    return [Revision(*r) for r in sql.rows(statement, params)]


def _claim(sql: Sql, agent_id: str, owner_id: str, name: str, ts: int) -> tuple[int, int]:
    """The id and current revision of the resource, its row locked until the transaction
    ends (inserted first when missing: a concurrent insert of the same one waits, then
    finds it)."""
    key = (agent_id, owner_id, name)
    claim = (
        "SELECT id, current_revision FROM resources WHERE agent_id = ? AND owner_id = ?"
        f" AND name = ?{sql.dialect.for_update}"
    )
    rows = sql.rows(claim, key)
    if not rows:
        sql.run(
            "INSERT INTO resources (agent_id, owner_id, name, current_revision, updated_at)"
            " VALUES (?, ?, ?, 0, ?) ON CONFLICT (agent_id, owner_id, name) DO NOTHING",
            (*key, ts),
        )
        rows = sql.rows(claim, key)
    return int(rows[0][0]), int(rows[0][1])


def record(
    sql: Sql,
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
    resource_id, current_number = _claim(sql, agent_id, owner_id, name, ts)
    # Read after the lock was granted: every revision committed before it is seen.
    same, highest = sql.rows(
        "SELECT (SELECT content_sha1 = ? AND content = ? FROM resource_revisions"
        "         WHERE resource_id = ? AND revision = ?),"
        " (SELECT coalesce(max(revision), 0) FROM resource_revisions WHERE resource_id = ?)",
        (digest, content, resource_id, current_number, resource_id),
    )[0]
    if current_number != 0 and same is None:
        raise NotFoundError(f"{name} of agent {agent_id!r} has no revision {current_number}")
    if same:
        return None
    number = int(highest) + 1
    sql.send(
        "INSERT INTO resource_revisions (resource_id, revision, content, content_sha1, reason,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (resource_id, number, content, digest, reason, ts),
    )
    sql.run(
        "UPDATE resources SET current_revision = ?, updated_at = ? WHERE id = ?",
        (number, ts, resource_id),
    )
    return Revision(resource_id, agent_id, owner_id, name, number, content, digest, reason, ts)


def lock_owner(sql: Sql, agent_id: str, owner_id: str) -> None:
    """Wait for, then hold until the transaction ends, the lock of (``agent_id``,
    ``owner_id``): one unit at a time per pair across every service (a prompt-file
    rebuild). Nothing to take on SQLite, whose single writer already runs one write
    transaction at a time; the ids are checked on both."""
    validate.identifier("agent_id", agent_id)
    validate.identifier("owner_id", owner_id, allow_empty=True)
    if sql.dialect.owner_lock:
        sql.run(sql.dialect.owner_lock, (agent_id, owner_id))
