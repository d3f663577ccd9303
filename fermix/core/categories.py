"""Categories, trust and scopes: who may write a fact, where it lives, where it renders.

Pure rules (C1, C3, SC1-SC3), no I/O. A row renders into a prompt file of one agent and
one owner only when every rule here allows it:

- ``user_md`` (USER.md): live owner-scoped rows of that agent and that owner in the
  categories identity, preference, interest and goal.
- ``memory_md`` (MEMORY.md): live agent-scoped ``context`` and ``directive`` rows of that
  agent, either shared (row owner ``""``, written from operator conversations) or written
  from this owner's guest conversations; and conversation-scoped ``context`` rows of this
  owner. Conversation-scoped ``directive`` never renders, job-scoped rows never render (C3).
- ``promote_target`` decides the file and must agree with the category; rows without one
  (those the ``memory_store`` tool writes, T1) never render.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.model import (
    MEMORY_CATEGORIES,
    TARGET_OF,
    USER_CATEGORIES,
    USER_MD,
    ConversationKey,
    MemoryRow,
    Scope,
    check_category,
    check_trust,
)

OPERATOR_ONLY: Final = frozenset({"directive"})

DEFAULT_OWNER_SCOPE_ID: Final = "_default"
"""The owner scope id of the single-user default owner ``""``.

A scope id cannot be empty, so the default owner's profile lives at ``owner:_default``.
Rows are told apart by their ``owner_id`` column as well, so a real owner who happens to be
called ``_default`` never sees the default owner's rows, nor the other way round.
"""


def may_write(category: str, trust: str) -> bool:
    """Whether a conversation at ``trust`` may write ``category`` (guests never ``directive``)."""
    check_category(category)
    check_trust(trust)
    return trust == "operator" or category not in OPERATOR_ONLY


def owner_scope_id(owner_id: str) -> str:
    """The owner scope id of ``owner_id`` (:data:`DEFAULT_OWNER_SCOPE_ID` for ``""``)."""
    return owner_id or DEFAULT_OWNER_SCOPE_ID


def owner_scope(owner_id: str) -> Scope:
    """The scope of one human's profile facts (SC1)."""
    return Scope("owner", owner_scope_id(owner_id))


def agent_scope(agent_id: str) -> Scope:
    """The scope of one agent's working knowledge (SC1)."""
    return Scope("agent", agent_id)


def conversation_scope(key: ConversationKey) -> Scope:
    """The scope of one conversation, where ``memory_store`` writes (SC1, SC2, T1)."""
    return Scope("conversation", key.scope_id)


def job_scope(memory_source_id: int) -> Scope:
    """The scope of one scheduled job: its memory source's id (SC1)."""
    if isinstance(memory_source_id, bool) or not isinstance(memory_source_id, int):
        raise InvalidInputError(f"memory_source_id must be an integer, not {memory_source_id!r}")
    if memory_source_id < 1:
        raise InvalidInputError(f"memory_source_id must be >= 1, not {memory_source_id}")
    return Scope("job", str(memory_source_id))


def reviewer_scope(category: str, *, agent_id: str, owner_id: str, trust: str) -> tuple[Scope, str]:
    """Where the reviewer stores a fact of ``category`` (SC2): the scope and the row's owner.

    Profile categories go to the owner's scope. ``context`` and ``directive`` go to the
    agent's scope: shared (row owner ``""``) when said in an operator conversation, kept to
    this owner when said by a guest, so one guest's context never reaches another's prompt.
    A guest's ``directive`` is refused with :class:`AccessDeniedError` (C1).
    """
    if not may_write(category, trust):
        raise AccessDeniedError(f"a {trust} conversation may not write {category!r} memories")
    if TARGET_OF[category] == USER_MD:
        return owner_scope(owner_id), owner_id
    return agent_scope(agent_id), "" if trust == "operator" else owner_id


HOST_CATEGORY: Final = "context"
"""The category of the rows a host writes (:func:`check_host_row`); with no promote target
they render into no prompt file, as ``memory_store``'s (T1)."""


def conversation_key_of(agent_id: str, scope_id: str) -> ConversationKey:
    """The conversation whose scope id is ``scope_id`` (the inverse of
    :attr:`ConversationKey.scope_id`); an :class:`InvalidInputError` for an id no key has."""
    parts = scope_id.split(":")
    if len(parts) in (2, 3):
        key = ConversationKey(agent_id, *(unquote(part) for part in parts))
        if key.scope_id == scope_id:
            return key
    raise InvalidInputError(
        f"scope_id {scope_id[:80]!r} is not a conversation's (CHANNEL:CHAT_ID[:THREAD],"
        " each part percent-encoded)"
    )


def check_host_row(scope: Scope, *, agent_id: str, owner_id: str, trust: str) -> None:
    """Whether a host may write or archive its own row of ``owner_id`` at ``scope`` with
    ``trust`` (SC1-SC3, M1, M2); raises, naming the rule, before anything is written.

    The scope must be one the row's owner has: an owner scope is that owner's profile, an
    agent scope this agent's, a conversation scope the id of a conversation key. The
    agent's shared rows (agent scope, owner ``""``) reach every owner's recall, so only
    an operator writes or archives them (:class:`AccessDeniedError`), as the reviewer
    shares only what an operator said; a guest keeps to its own rows. A job scope's
    source is checked against the database by the caller.
    """
    check_trust(trust)
    if scope.type == "owner" and scope.id != owner_scope_id(owner_id):
        raise InvalidInputError(
            f"an owner-scoped row is its owner's: owner {owner_id!r} has scope id"
            f" {owner_scope_id(owner_id)!r}, not {scope.id!r}"
        )
    if scope.type == "agent":
        if scope.id != agent_id:
            raise InvalidInputError(
                f"agent {agent_id!r} has agent scope id {agent_id!r}, not {scope.id!r}"
            )
        if owner_id == "" and trust != "operator":
            raise AccessDeniedError(
                f"the agent's shared rows are the operator's: a {trust} may write only"
                " its own (name its owner_id)"
            )
    if scope.type == "conversation":
        conversation_key_of(agent_id, scope.id)


def renders(row: MemoryRow, *, agent_id: str, owner_id: str) -> bool:
    """Whether ``row`` renders into a prompt file of ``agent_id`` for ``owner_id`` (C3, SC3)."""
    if row.archived_at is not None or row.agent_id != agent_id:
        return False
    target = row.promote_target
    if target is None or TARGET_OF.get(row.category) != target:
        return False
    if target == USER_MD:
        return (
            row.scope_type == "owner"
            and row.owner_id == owner_id
            and row.scope_id == owner_scope_id(owner_id)
        )
    if row.scope_type == "agent":
        return row.scope_id == agent_id and row.owner_id in ("", owner_id)
    if row.scope_type == "conversation":
        return row.category == "context" and row.owner_id == owner_id
    return False


def render_target(row: MemoryRow) -> str | None:
    """The file ``row`` renders into for its own agent and owner, or None if it never renders."""
    if renders(row, agent_id=row.agent_id, owner_id=row.owner_id):
        return row.promote_target
    return None


def shared_across_owners(row: MemoryRow) -> bool:
    """Whether ``row`` renders into the MEMORY.md of every owner of its agent."""
    return row.scope_type == "agent" and row.owner_id == "" and render_target(row) is not None


@dataclass(frozen=True, slots=True)
class RowQuery:
    """One ``memories.list_rows`` filter that rendering reads, for one category."""

    agent_id: str
    owner_id: str
    category: str
    scopes: tuple[Scope, ...] | None = None
    scope_type: str | None = None

    @property
    def target(self) -> str:
        """The prompt file the rows of this query render into."""
        return TARGET_OF[self.category]

    def filters(self) -> dict[str, Any]:
        """Keyword arguments for ``memories.list_rows`` (live rows only)."""
        return {
            "agent_id": self.agent_id,
            "owner_id": self.owner_id,
            "category": self.category,
            "scopes": None if self.scopes is None else list(self.scopes),
            "scope_type": self.scope_type,
            "archived": False,
        }


def render_queries(agent_id: str, owner_id: str) -> tuple[RowQuery, ...]:
    """Every filter rendering needs for ``agent_id`` and ``owner_id``, and nothing wider.

    Together they select a superset of the rows :func:`renders` accepts (``promote_target``
    is not a ``list_rows`` filter), never a row of another agent, owner or job.
    """
    profile = (owner_scope(owner_id),)
    agent = (agent_scope(agent_id),)
    owners = ("",) if owner_id == "" else ("", owner_id)
    queries = [RowQuery(agent_id, owner_id, c, scopes=profile) for c in USER_CATEGORIES]
    for category in MEMORY_CATEGORIES:
        queries += [RowQuery(agent_id, o, category, scopes=agent) for o in owners]
    queries.append(RowQuery(agent_id, owner_id, "context", scope_type="conversation"))
    return tuple(queries)


RECALL_SCOPES: Final = ("current", "owner", "all")
"""How far ``memory_recall`` reaches: this conversation, this owner, everything visible (T2)."""


@dataclass(frozen=True, slots=True)
class ScopeGroup:
    """One filter of the rows a caller may recall: a row owner and its scopes (SC3)."""

    agent_id: str
    owner_id: str
    scopes: tuple[Scope, ...] | None = None
    scope_type: str | None = None

    def filters(self) -> dict[str, Any]:
        """Keyword arguments for ``memories.list_rows`` and ``memories.search`` (live rows)."""
        return {
            "agent_id": self.agent_id,
            "owner_id": self.owner_id,
            "scopes": None if self.scopes is None else list(self.scopes),
            "scope_type": self.scope_type,
        }


def visible_scopes(
    agent_id: str, owner_id: str, home: ConversationKey | Scope, scope: str = "current"
) -> tuple[ScopeGroup, ...]:
    """What ``memory_recall`` may read for a caller at ``scope`` (SC3, T2).

    ``home`` is where the caller stands: its conversation's key, or a scheduled job's
    scope (:func:`job_scope`). ``current`` is this conversation's rows; ``owner`` adds the
    owner's profile and the owner's other conversations of this agent; ``all`` adds the
    agent's working knowledge this owner may see (shared rows and the owner's own). A job
    sees its own scope only, whatever ``scope`` says.
    """
    if scope not in RECALL_SCOPES:
        raise InvalidInputError(f"scope must be one of {', '.join(RECALL_SCOPES)}, not {scope!r}")
    if isinstance(home, Scope):
        if home.type != "job":
            raise InvalidInputError(f"a caller stands in a conversation or a job, not {home}")
        return (ScopeGroup(agent_id, owner_id, (home,)),)
    if home.agent_id != agent_id:
        raise InvalidInputError(f"conversation {home} is not one of agent {agent_id!r}")
    current = ScopeGroup(agent_id, owner_id, (conversation_scope(home),))
    if scope == "current":
        return (current,)
    groups = [
        current,
        ScopeGroup(agent_id, owner_id, (owner_scope(owner_id),)),
        ScopeGroup(agent_id, owner_id, scope_type="conversation"),
    ]
    if scope == "all":
        agent = (agent_scope(agent_id),)
        groups.append(ScopeGroup(agent_id, owner_id, agent))
        if owner_id != "":
            groups.append(ScopeGroup(agent_id, "", agent))
    return tuple(groups)
