"""The vocabulary of fermix: keys, messages, memory rows, scopes, categories, trust, and the
operator's records: prompt-file resources and their revisions, scheduled jobs and their
runs, the memory server's tokens (P2, SC1, T2, N2).

Every layer speaks these types: storage persists them, the core's rules decide over them,
the runtime and the facades hand them around. Each type validates itself on construction,
so a bad value is refused with :class:`~fermix.errors.InvalidInputError` before anything is
written. Nothing here does I/O.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote

from fermix import validate
from fermix.errors import InvalidInputError

TRUST_LEVELS: Final = ("operator", "guest")
"""Who a conversation's user is to the agent: the operator, or a guest (M2)."""

USER_MD: Final = "user_md"
MEMORY_MD: Final = "memory_md"
RESOURCE_NAMES: Final = (USER_MD, MEMORY_MD)
"""The prompt-file resources: USER.md and MEMORY.md (P2)."""

USER_CATEGORIES: Final = ("identity", "preference", "interest", "goal")
MEMORY_CATEGORIES: Final = ("context", "directive")
CATEGORIES: Final = USER_CATEGORIES + MEMORY_CATEGORIES
"""The six categories of memory rows (C1)."""

TARGET_OF: Final[Mapping[str, str]] = MappingProxyType(
    {**dict.fromkeys(USER_CATEGORIES, USER_MD), **dict.fromkeys(MEMORY_CATEGORIES, MEMORY_MD)}
)
"""The prompt file each category renders into (C1)."""

PROMOTE_TARGETS: Final = RESOURCE_NAMES
SCOPE_TYPES: Final = ("owner", "agent", "conversation", "job")
SOURCE_TYPES: Final = ("conversation", "job", "realtime", "operator")
RUN_STATUSES: Final = ("running", "succeeded", "failed")
ROLES: Final = frozenset({"user", "assistant", "system", "tool"})
MAX_CONTENT_CHARS: Final = 1_000_000
MAX_METADATA_CHARS: Final = 100_000


def check_trust(trust: object) -> str:
    """Accept ``operator`` or ``guest``."""
    if trust not in TRUST_LEVELS:
        raise InvalidInputError(f"trust must be one of {TRUST_LEVELS}, not {trust!r}")
    return str(trust)


def check_category(category: object) -> str:
    """Accept one of the six categories (C1)."""
    if category not in CATEGORIES:
        raise InvalidInputError(f"category must be one of {CATEGORIES}, not {category!r}")
    return str(category)


def check_resource_name(name: object) -> str:
    """Accept a resource name (``user_md`` or ``memory_md``)."""
    if name not in RESOURCE_NAMES:
        raise InvalidInputError(f"resource name must be one of {RESOURCE_NAMES}, not {name!r}")
    return str(name)


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


@functools.lru_cache(maxsize=4096)
def _known_key(agent_id: str, channel: str, chat_id: str, thread_scope: str) -> ConversationKey:
    """``ConversationKey(...)``, validated once per distinct key, then the same (frozen)
    instance again: :attr:`Message.key` asks for the key of every message delivered.
    A key that fails validation raises every time (errors are not cached)."""
    return ConversationKey(agent_id, channel, chat_id, thread_scope)


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
    trust: str = "guest"
    """The trust of the message's author (``owner_id``) when it was written (M1)."""
    client_key: str | None = None
    """The key its client sent with it, under which a retried append is stored once (N3)."""

    @property
    def key(self) -> ConversationKey:
        """The conversation this message belongs to."""
        return _known_key(self.agent_id, self.channel, self.chat_id, self.thread_scope)

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata as a dict."""
        value: dict[str, Any] = json.loads(self.metadata_json)
        return value


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to be inserted; validated on construction so a bad one changes nothing.

    ``owner_id`` is who wrote it and ``trust`` that author's trust (M1); ``trust`` None
    stores the trust its conversation has once the message's append touched it.
    """

    key: ConversationKey
    role: str
    content: str
    owner_id: str = ""
    sender: str = ""
    kind: str = "chat"
    metadata: dict[str, Any] = field(default_factory=dict)
    trust: str | None = None
    client_key: str | None = None
    """The client's own key for this message: appending it again with the same key, in the
    same conversation, stores nothing new and answers with the stored message (N3)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidInputError(f"role must be one of {sorted(ROLES)}, not {self.role!r}")
        if self.trust is not None:
            check_trust(self.trust)
        validate.text("content", self.content, max_chars=MAX_CONTENT_CHARS)
        validate.identifier("owner_id", self.owner_id, allow_empty=True)
        validate.identifier("sender", self.sender, allow_empty=True)
        validate.identifier("kind", self.kind)
        if self.client_key is not None:
            validate.identifier("client_key", self.client_key)
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


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message found by full-text search, with its bm25 rank (lower is better)."""

    message: Message
    rank: float


@dataclass(frozen=True, slots=True)
class Scope:
    """A scope a row lives in: ``owner``, ``agent``, ``conversation`` or ``job`` and its id."""

    type: str
    id: str

    def __post_init__(self) -> None:
        if self.type not in SCOPE_TYPES:
            raise InvalidInputError(f"scope type must be one of {SCOPE_TYPES}, not {self.type!r}")
        validate.identifier("scope_id", self.id)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One stored memory row, every column of the seed."""

    id: int
    agent_id: str
    owner_id: str
    scope_type: str
    scope_id: str
    category: str
    key: str
    value: str
    confidence: float
    promote_target: str | None
    source_id: int | None
    source_type: str | None
    source_name: str | None
    source_description: str | None
    session_id: str | None
    run_id: int | None
    source_message_id: int | None
    archived_at: int | None
    archived_by: str | None
    archive_reason: str | None
    created_at: int
    updated_at: int

    @property
    def scope(self) -> Scope:
        """The row's scope."""
        return Scope(self.scope_type, self.scope_id)

    @property
    def archived(self) -> bool:
        """Whether the row is archived."""
        return self.archived_at is not None

    def as_dict(self) -> dict[str, Any]:
        """Every column as a JSON-ready dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a row came from: the source columns of the seed."""

    source_id: int | None = None
    source_type: str | None = None
    source_name: str | None = None
    source_description: str | None = None
    session_id: str | None = None
    run_id: int | None = None
    source_message_id: int | None = None


OUTCOME_WORK: Final = ("review", "compaction")
"""The background work whose last outcome a conversation keeps (W1)."""
REASON_MAX_CHARS: Final = 200
"""The longest reason kept with an outcome: a code and a few names, never a message."""


def outcome_reason(text: str) -> str:
    """``text`` as a stored reason: one line, at most :data:`REASON_MAX_CHARS` characters.

    Callers build reasons from codes, model names and error class names only, never from a
    message or an error's text (which may quote a prompt or a key): this only bounds them.
    """
    line = " ".join(text.split())
    if len(line) <= REASON_MAX_CHARS:
        return line
    return line[: REASON_MAX_CHARS - 1] + "\u2026"


@dataclass(frozen=True, slots=True)
class ConversationState:
    """The stored state of one conversation."""

    agent_id: str
    channel: str
    chat_id: str
    thread_scope: str
    owner_id: str
    trust: str
    window_after_id: int
    checkpoint_message_id: int | None
    last_reviewed_at: int | None
    last_reviewed_message_id: int
    review_failed_at: int | None
    review_claim_token: str | None
    review_claim_expires_at: int | None
    peak_prompt_tokens: int | None
    compaction_failed_at: int | None
    created_at: int
    updated_at: int
    review_outcome: str | None = None
    """How the last review that was due ended (W1): ``applied``, ``nothing``, ``failed``
    or ``skipped``; None before the first."""
    review_reason: str | None = None
    """Why, in short (:func:`outcome_reason`): ``model_error: ...``, ``no_model``, ..."""
    review_outcome_at: int | None = None
    compaction_outcome: str | None = None
    """How the last compaction that was due ended (W1): ``compacted``, ``failed`` or
    ``skipped``; None before the first."""
    compaction_reason: str | None = None
    compaction_outcome_at: int | None = None

    @property
    def key(self) -> ConversationKey:
        """The conversation's key."""
        return ConversationKey(self.agent_id, self.channel, self.chat_id, self.thread_scope)


@dataclass(frozen=True, slots=True)
class MemorySource:
    """A named origin of memory rows (a conversation, a scheduled job, a device)."""

    id: int
    agent_id: str
    owner_id: str
    source_type: str
    name: str
    description: str
    created_at: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True)
class AppendResult:
    """An append's outcome: the stored message, and whether it was stored before under
    the same client key, so this append stored nothing and answered with it (N3)."""

    message: Message
    replayed: bool


@dataclass(frozen=True)
class PendingAppend:
    """An append checked and ready to store: the message, and its conversation's trust,
    recorded peak and owner (the handle's, which may differ from the author's, M1)."""

    new: NewMessage
    trust: str
    peak_prompt_tokens: int | None = None
    owner_id: str | None = None


# -- the operator's records -------------------------------------------------------------


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


ERASURE_TARGETS: Final = ("owner", "conversation", "message", "memory")
"""What an erasure erases (F1, F2): an owner's data, a conversation, a message, a row."""

ERASURE_STATES: Final = ("running", "pending", "done")
"""An erasure's progress (F3): rows left; rows gone but a copy on disk left; done."""


@dataclass(frozen=True, slots=True)
class Erasure:
    """One erasure, from its start, and its audit record afterwards (F1, F5).

    ``subject`` (the owner id, the conversation's key, the row's id) is kept only while the
    erasure's rows are left; the record then keeps only ``subject_key``, a keyed hash of
    it. ``counts`` is what was erased so far, by kind; no content is ever recorded.
    """

    id: int
    target: str
    agent_id: str | None
    subject: str | None
    subject_key: str
    requested_by: str
    state: str
    counts: Mapping[str, int]
    started_at: int
    finished_at: int | None

    @property
    def done(self) -> bool:
        """Whether nothing of it is left, in the rows or on disk (F3)."""
        return self.state == "done"

    def as_dict(self) -> dict[str, Any]:
        """The audit record as JSON-ready data: without the subject, as it is kept."""
        return {
            "id": self.id,
            "target": self.target,
            "agent_id": self.agent_id,
            "subject_key": self.subject_key,
            "requested_by": self.requested_by,
            "state": self.state,
            "counts": dict(self.counts),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True, slots=True)
class ForgetReport:
    """What a forget did (F1-F3): the erasure's record, its counts by kind, and whether it
    is ``done`` or ``pending`` (what is left on disk, then, in ``left``)."""

    erasure_id: int
    target: str
    state: str
    counts: Mapping[str, int]
    left: str = ""

    @property
    def done(self) -> bool:
        """Whether no copy of what was forgotten is left, in the rows or on disk (F3)."""
        return self.state == "done"

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "erasure_id": self.erasure_id,
            "target": self.target,
            "state": self.state,
            "counts": dict(self.counts),
            "left": self.left,
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
