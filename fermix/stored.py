"""The records of the operator's side: prompt-file resources and their revisions, scheduled
jobs and their runs, the memory server's tokens (P2, SC1, T2, N2).

The vocabulary's other half (:mod:`fermix.model` holds conversations, messages and memory
rows): storage returns these, the runtime and the facades hand them around. Nothing here
does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fermix import validate


@dataclass(frozen=True, slots=True)
class ScheduledJob:
    """A job the host runs on a schedule, with its own memory source."""

    id: int
    agent_id: str
    owner_id: str
    name: str
    schedule: str
    prompt: str
    memory_source_id: int
    enabled: bool
    next_run_at: int | None
    created_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of a scheduled job."""

    id: int
    job_id: int
    status: str
    output: str
    error: str | None
    started_at: int
    finished_at: int | None


@dataclass(frozen=True, slots=True)
class Resource:
    """A versioned prompt file of one agent and owner, and its current revision (0: none)."""

    id: int
    agent_id: str
    owner_id: str
    name: str
    current_revision: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class Revision:
    """One recorded revision of a resource."""

    resource_id: int
    agent_id: str
    owner_id: str
    name: str
    revision: int
    content: str
    content_sha1: str
    reason: str
    created_at: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the revision."""
        return {
            "agent_id": self.agent_id,
            "owner_id": self.owner_id,
            "name": self.name,
            "revision": self.revision,
            "content": self.content,
            "content_sha1": self.content_sha1,
            "reason": self.reason,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True)
class JobCaller:
    """A scheduled job's run calling the memory tools (SC1, T2).

    It reads and writes only its own job scope (its memory source), and sees no history.
    """

    agent_id: str
    memory_source_id: int
    owner_id: str = ""
    run_id: int | None = None

    def __post_init__(self) -> None:
        validate.identifier("agent_id", self.agent_id)
        validate.positive_int("memory_source_id", self.memory_source_id, maximum=2**63 - 1)
        validate.identifier("owner_id", self.owner_id, allow_empty=True)
        if self.run_id is not None:
            validate.positive_int("run_id", self.run_id, maximum=2**63 - 1)


@dataclass(frozen=True)
class ApiToken:
    """A bearer token of the memory server, without its secret (N2).

    It acts for ``agents`` only, and as the operator only when ``operator`` is set.
    """

    id: int
    name: str
    prefix: str
    """The first characters of the secret, to tell tokens apart in a listing."""
    agents: tuple[str, ...]
    operator: bool
    created_at: int
    revoked_at: int | None = None

    def may_act_for(self, agent_id: str) -> bool:
        """Whether this token may read or write ``agent_id``'s data."""
        return agent_id in self.agents
