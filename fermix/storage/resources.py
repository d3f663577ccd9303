"""Prompt-file resources and their revisions: the columns and the content hash both adapters share
(P1, P2)."""

from __future__ import annotations

import hashlib

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
