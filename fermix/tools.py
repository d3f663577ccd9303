"""The agent's memory tools: schemas in the OpenAI / litellm format and one dispatcher (T1-T4).

``memory_store`` keeps a small fact for the current conversation (conversation scope, never
rendered into the prompt files); ``memory_recall`` looks a key up or searches memories and/or
history within the scopes the caller is entitled to; ``memory_sources_list`` lists the
sources the caller may see. A scheduled job's run is a :class:`JobCaller`: it sees and
writes only its own job-scoped memories, and no history (SC1, T2).

:meth:`MemoryTools.run` never raises into the host: bad arguments, unknown tools and
storage errors come back as ``{"error": ...}`` in the tool message content.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

from fermix.core import categories
from fermix.errors import FermixError, InvalidInputError
from fermix.model import MemoryRow, Provenance, Scope
from fermix.storage import jobs, memories, messages

if TYPE_CHECKING:
    from fermix.api import Memory
    from fermix.conversation import Conversation

log = logging.getLogger(__name__)

MAX_ARGUMENT_CHARS = 20_000
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 2_000
MAX_QUERY_CHARS = 2_000
DEFAULT_LIMIT = 5
MAX_LIMIT = 20
TOOL_CATEGORY = "context"
"""The category of ``memory_store`` rows; with no promote target they never render (T1)."""

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "memory_store",
            "description": (
                "Store a small fact for this conversation under a short key, to recall later. "
                "Storing the same key again replaces its value."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "key": {"type": "string", "description": "short name, e.g. 'flight_date'"},
                    "value": {"type": "string", "description": "the fact to remember"},
                },
                "required": ["key", "value"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "memory_recall",
            "description": (
                "Look up a stored fact by key, or search memories and/or past conversation "
                "history by words. Defaults: this conversation's memories."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "words to search for"},
                    "key": {"type": "string", "description": "exact key to look up"},
                    "scope": {
                        "type": "string",
                        "enum": ["current", "owner", "all"],
                        "description": "current conversation, this user, or everything visible",
                    },
                    "source": {
                        "type": "string",
                        "enum": ["memories", "history", "all"],
                        "description": "stored facts, past messages, or both",
                    },
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                },
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "memory_sources_list",
            "description": "List the memory sources visible here (conversations, scheduled jobs).",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


@dataclass(frozen=True)
class JobCaller:
    """A scheduled job's run calling the tools: only its own job scope, no history (T2)."""

    agent_id: str
    memory_source_id: int
    owner_id: str = ""
    run_id: int | None = None

    @property
    def scope(self) -> Scope:
        """The job's scope."""
        return categories.job_scope(self.memory_source_id)




class ToolError(InvalidInputError):
    """A tool call was refused: its message goes back to the model as the tool result."""


class MemoryTools:
    """The memory tools of one :class:`~fermix.api.Memory`."""

    def __init__(self, memory: Memory) -> None:
        self._memory = memory

    @staticmethod
    def schemas() -> list[dict[str, Any]]:
        """The tool definitions, as ``tools=`` for litellm.completion (T4)."""
        return json.loads(json.dumps(SCHEMAS))  # type: ignore[no-any-return]

    def run(self, tool_call: Any, caller: Conversation | JobCaller) -> str:
        """Run one tool call and return the tool message content (JSON); never raises.

        ``tool_call`` is an OpenAI-format dict (``{"function": {"name", "arguments"}}``) or
        the equivalent litellm object.
        """
        try:
            name, arguments = _unpack(tool_call)
            handler = {
                "memory_store": self._store,
                "memory_recall": self._recall,
                "memory_sources_list": self._sources,
            }.get(name)
            if handler is None:
                raise ToolError(
                    f"unknown tool {name!r}; tools: memory_store, memory_recall, "
                    "memory_sources_list"
                )
            result = handler(arguments, caller)
        except FermixError as exc:
            log.info("tool call refused: %s", exc)
            return json.dumps({"error": str(exc)}, ensure_ascii=False)
        return json.dumps(result, ensure_ascii=False)

    # -- memory_store ------------------------------------------------------------------

    def _store(self, args: Mapping[str, Any], caller: Conversation | JobCaller) -> dict[str, Any]:
        _only(args, {"key", "value"}, required={"key", "value"})
        key = _text(args, "key", MAX_KEY_CHARS).strip()
        value = _text(args, "value", MAX_VALUE_CHARS).strip()
        if not key or not value:
            raise ToolError("key and value must not be empty")
        if isinstance(caller, JobCaller):
            scope, owner = caller.scope, caller.owner_id
            provenance = Provenance(
                source_id=caller.memory_source_id, source_type="job", run_id=caller.run_id
            )
        else:
            scope, owner = categories.conversation_scope(caller.key), caller.owner_id
            provenance = Provenance(source_type="tool", session_id=caller.key.scope_id)
        agent = caller.agent_id if isinstance(caller, JobCaller) else caller.key.agent_id

        def write(conn: apsw.Connection) -> MemoryRow:
            return memories.upsert(
                conn,
                agent_id=agent,
                owner_id=owner,
                scope=scope,
                category=TOOL_CATEGORY,
                key=key,
                value=value,
                promote_target=None,
                provenance=provenance,
            )

        row: MemoryRow = self._memory.write(write, label=f"memory_store {scope.type}")
        return {"stored": {"id": row.id, "key": row.key, "value": row.value}}

    # -- memory_recall -----------------------------------------------------------------

    def _recall(self, args: Mapping[str, Any], caller: Conversation | JobCaller) -> dict[str, Any]:
        _only(args, {"query", "key", "scope", "source", "limit"})
        query = _text(args, "query", MAX_QUERY_CHARS) if "query" in args else None
        key = _text(args, "key", MAX_KEY_CHARS) if "key" in args else None
        scope = _choice(args, "scope", ("current", "owner", "all"), "current")
        source = _choice(args, "source", ("memories", "history", "all"), "memories")
        limit = args.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit must be an integer from 1 to {MAX_LIMIT}")
        if not (query and query.strip()) and not (key and key.strip()):
            raise ToolError("give a query or a key")
        if isinstance(caller, JobCaller) and source != "memories":
            raise ToolError("a scheduled job can only recall its own memories, not history")
        result: dict[str, Any] = {}
        if source in ("memories", "all"):
            result["memories"] = [
                _shown(r) for r in self._recall_rows(caller, scope, key, query, limit)
            ]
        if source in ("history", "all") and not isinstance(caller, JobCaller):
            result["history"] = self._recall_history(caller, scope, query or key or "", limit)
        return result

    def _recall_rows(
        self,
        caller: Conversation | JobCaller,
        scope: str,
        key: str | None,
        query: str | None,
        limit: int,
    ) -> list[MemoryRow]:
        agent_id, _, groups = visible_scopes(caller, scope)
        found: dict[int, MemoryRow] = {}
        with self._memory.readers.connection() as conn:
            for owner, scopes, scope_type in groups:
                if key is not None and key.strip():
                    rows = memories.list_rows(
                        conn,
                        agent_id=agent_id,
                        owner_id=owner,
                        scopes=scopes,
                        scope_type=scope_type,
                        key=key.strip(),
                    )
                else:
                    rows = memories.search(
                        conn,
                        query or "",
                        agent_id=agent_id,
                        owner_id=owner,
                        scopes=scopes,
                        scope_type=scope_type,
                        limit=limit,
                    )
                for row in rows:
                    found.setdefault(row.id, row)
        return list(found.values())[:limit]

    def _recall_history(
        self, caller: Conversation, scope: str, text: str, limit: int
    ) -> list[dict[str, Any]]:
        with self._memory.readers.connection() as conn:
            if scope == "current":
                hits = messages.search(conn, text, key=caller.key, limit=limit)
            else:
                # History never crosses owners: "owner" and "all" mean this owner's chats.
                hits = messages.search(
                    conn, text, agent_id=caller.key.agent_id, owner_id=caller.owner_id, limit=limit
                )
        return [
            {
                "id": h.message.id,
                "conversation": h.message.key.scope_id,
                "role": h.message.role,
                "kind": h.message.kind,
                "content": h.message.content,
                "created_at": h.message.created_at,
            }
            for h in hits
        ]

    # -- memory_sources_list -----------------------------------------------------------

    def _sources(self, args: Mapping[str, Any], caller: Conversation | JobCaller) -> dict[str, Any]:
        _only(args, set())
        agent = caller.agent_id if isinstance(caller, JobCaller) else caller.key.agent_id
        with self._memory.readers.connection() as conn:
            if isinstance(caller, JobCaller):
                own = jobs.get_source(conn, caller.memory_source_id)
                found = [] if own is None else [own]
            else:
                found = jobs.list_sources(conn, agent_id=agent, owner_id=caller.owner_id)
        return {
            "sources": [
                {"id": s.id, "type": s.source_type, "name": s.name, "description": s.description}
                for s in found
            ]
        }


ScopeGroup = tuple[str, list[Scope] | None, str | None]


def visible_scopes(
    caller: Conversation | JobCaller, scope: str
) -> tuple[str, str, list[ScopeGroup]]:
    """What ``memory_recall`` may read for ``caller`` at ``scope`` (SC3, T2).

    Returns the agent, the owner and a list of ``(row owner, scopes, scope_type)`` filters:
    ``current`` is this conversation's rows; ``owner`` adds the owner's profile and the
    owner's other conversations of this agent; ``all`` adds the agent's working knowledge
    this owner may see (shared rows and the owner's own). A job sees its own scope only.
    """
    if isinstance(caller, JobCaller):
        return caller.agent_id, caller.owner_id, [(caller.owner_id, [caller.scope], None)]
    agent_id, owner_id = caller.key.agent_id, caller.owner_id
    current: ScopeGroup = (owner_id, [categories.conversation_scope(caller.key)], None)
    if scope == "current":
        return agent_id, owner_id, [current]
    groups: list[ScopeGroup] = [
        current,
        (owner_id, [categories.owner_scope(owner_id)], None),
        (owner_id, None, "conversation"),
    ]
    if scope == "all":
        agent_scope = [categories.agent_scope(agent_id)]
        groups.append((owner_id, agent_scope, None))
        if owner_id != "":
            groups.append(("", agent_scope, None))
    return agent_id, owner_id, groups


def _shown(row: MemoryRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "scope": row.scope_type,
        "category": row.category,
        "key": row.key,
        "value": row.value,
        "updated_at": row.updated_at,
    }


def _unpack(tool_call: Any) -> tuple[str, dict[str, Any]]:
    function = (
        tool_call.get("function")
        if isinstance(tool_call, Mapping)
        else getattr(tool_call, "function", None)
    )
    if function is None:
        raise ToolError("a tool call needs a function with a name and arguments")
    if isinstance(function, Mapping):
        name, raw = function.get("name"), function.get("arguments")
    else:
        name, raw = getattr(function, "name", None), getattr(function, "arguments", None)
    if not isinstance(name, str):
        raise ToolError("the tool call has no function name")
    if raw is None or raw == "":
        arguments: object = {}
    elif isinstance(raw, str):
        if len(raw) > MAX_ARGUMENT_CHARS:
            raise ToolError(f"arguments are over {MAX_ARGUMENT_CHARS} characters")
        try:
            arguments = json.loads(raw)
        except (ValueError, RecursionError):
            raise ToolError("arguments are not valid JSON") from None
    else:
        arguments = raw
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    return name, arguments


def _only(
    args: Mapping[str, Any], allowed: set[str], required: frozenset[str] | set[str] = frozenset()
) -> None:
    unknown = set(args) - allowed
    if unknown:
        raise ToolError(f"unknown arguments: {sorted(unknown)}")
    missing = required - set(args)
    if missing:
        raise ToolError(f"missing arguments: {sorted(missing)}")


def _text(args: Mapping[str, Any], name: str, max_chars: int) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ToolError(f"{name} must be a string")
    if len(value) > max_chars:
        raise ToolError(f"{name} is over {max_chars} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(f"{name} is not valid Unicode text") from None
    if "\x00" in value:
        raise ToolError(f"{name} must not contain NUL characters")
    return value


def _choice(args: Mapping[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = args.get(name, default)
    if value not in allowed:
        raise ToolError(f"{name} must be one of {', '.join(allowed)}")
    return str(value)
