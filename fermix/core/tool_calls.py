"""The memory tools' contract with the model: schemas, tool calls, argument checks (T4).

Pure rules, no I/O. :data:`SCHEMAS` are the tool definitions in the OpenAI / litellm
format; each tool's ``parameters`` JSON schema is also the one source of its argument
rules: :func:`parse` unpacks a tool call and checks its arguments against that schema
(with ``jsonschema``), then adds only what a schema cannot say portably (no NUL characters
or invalid Unicode, non-empty after trimming, a query or a key). Every refusal is a
:class:`ToolError` naming the argument, so the model can correct its call.

The results the tools send back are shaped here too (:func:`shown_row` and friends).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jsonschema import Draft202012Validator, ValidationError

from fermix.core.categories import RECALL_SCOPES
from fermix.errors import InvalidInputError
from fermix.model import MemoryRow, MemorySource, SearchHit

MAX_ARGUMENT_CHARS: Final = 20_000
"""The longest ``arguments`` JSON string read at all."""
MAX_KEY_CHARS: Final = 200
MAX_VALUE_CHARS: Final = 2_000
MAX_QUERY_CHARS: Final = 2_000
DEFAULT_LIMIT: Final = 5
MAX_LIMIT: Final = 20
RECALL_SOURCES: Final = ("memories", "history", "all")
STORE_CATEGORY: Final = "context"
"""The category of ``memory_store`` rows; with no promote target they never render (T1)."""

SCHEMAS: Final[list[dict[str, Any]]] = [
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
                    "key": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_KEY_CHARS,
                        "description": "short name, e.g. 'flight_date'",
                    },
                    "value": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_VALUE_CHARS,
                        "description": "the fact to remember",
                    },
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
                    "query": {
                        "type": "string",
                        "maxLength": MAX_QUERY_CHARS,
                        "description": "words to search for",
                    },
                    "key": {
                        "type": "string",
                        "maxLength": MAX_KEY_CHARS,
                        "description": "exact key to look up",
                    },
                    "scope": {
                        "type": "string",
                        "enum": list(RECALL_SCOPES),
                        "description": "current conversation, this user, or everything visible",
                    },
                    "source": {
                        "type": "string",
                        "enum": list(RECALL_SOURCES),
                        "description": "stored facts, past messages, or both",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_LIMIT,
                        "description": f"most results to return (default {DEFAULT_LIMIT})",
                    },
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

TOOL_NAMES: Final = tuple(tool["function"]["name"] for tool in SCHEMAS)
_PARAMETERS: Final[dict[str, dict[str, Any]]] = {
    tool["function"]["name"]: tool["function"]["parameters"] for tool in SCHEMAS
}
_VALIDATORS: Final = {name: Draft202012Validator(schema) for name, schema in _PARAMETERS.items()}


class ToolError(InvalidInputError):
    """A tool call was refused: its message goes back to the model as the tool result."""


@dataclass(frozen=True, slots=True)
class Store:
    """A checked ``memory_store`` call: the key and value, trimmed and non-empty."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class Recall:
    """A checked ``memory_recall`` call.

    ``key`` (trimmed) is set when the call looks a key up; otherwise ``query`` is set.
    """

    query: str | None
    key: str | None
    scope: str = "current"
    source: str = "memories"
    limit: int = DEFAULT_LIMIT

    @property
    def text(self) -> str:
        """The words a history search looks for: the query, else the key."""
        return self.query or self.key or ""


@dataclass(frozen=True, slots=True)
class ListSources:
    """A checked ``memory_sources_list`` call (it takes no arguments)."""


ToolCall = Store | Recall | ListSources


def parse(tool_call: Any) -> ToolCall:
    """Unpack ``tool_call`` and check its arguments; raises :class:`ToolError`."""
    name, arguments = unpack(tool_call)
    return check(name, arguments)


def unpack(tool_call: Any) -> tuple[str, dict[str, Any]]:
    """The tool name and the arguments object of an OpenAI-format tool call.

    ``tool_call`` is a dict (``{"function": {"name", "arguments"}}``) or the equivalent
    litellm object; ``arguments`` is a JSON string (at most :data:`MAX_ARGUMENT_CHARS`
    long), an object, or empty.
    """
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
    if not isinstance(arguments, Mapping):
        raise ToolError("arguments must be a JSON object")
    return name, dict(arguments)


def check(name: str, arguments: Mapping[str, Any]) -> ToolCall:
    """Check ``arguments`` of the tool ``name`` against its schema, then the rules a schema
    cannot say; returns the checked call or raises :class:`ToolError`."""
    validator = _VALIDATORS.get(name)
    if validator is None:
        raise ToolError(f"unknown tool {name[:80]!r}; tools: {', '.join(TOOL_NAMES)}")
    errors = sorted(validator.iter_errors(arguments), key=lambda e: _order(name, e))
    if errors:
        messages = dict.fromkeys(_message(name, error) for error in errors)
        raise ToolError("; ".join(messages))
    for argument, value in arguments.items():
        if isinstance(value, str):
            _plain_text(argument, value)
    if name == "memory_store":
        return Store(key=_not_blank(arguments, "key"), value=_not_blank(arguments, "value"))
    if name == "memory_recall":
        query, key = arguments.get("query"), arguments.get("key")
        query = query if query is not None and query.strip() else None
        key = key.strip() if key is not None and key.strip() else None
        if query is None and key is None:
            raise ToolError("give a query or a key")
        return Recall(
            query=query,
            key=key,
            scope=arguments.get("scope", "current"),
            source=arguments.get("source", "memories"),
            limit=int(arguments.get("limit", DEFAULT_LIMIT)),  # JSON's 5.0 is the integer 5
        )
    return ListSources()


# -- results ---------------------------------------------------------------------------


def shown_row(row: MemoryRow) -> dict[str, Any]:
    """A memory row as ``memory_recall`` shows it."""
    return {
        "id": row.id,
        "scope": row.scope_type,
        "category": row.category,
        "key": row.key,
        "value": row.value,
        "updated_at": row.updated_at,
    }


def stored(row: MemoryRow) -> dict[str, Any]:
    """The result of ``memory_store``."""
    return {"stored": {"id": row.id, "key": row.key, "value": row.value}}


def recalled(
    memories: Sequence[MemoryRow] | None, history: Sequence[SearchHit] | None
) -> dict[str, Any]:
    """The result of ``memory_recall``: the parts that were asked for."""
    result: dict[str, Any] = {}
    if memories is not None:
        result["memories"] = [shown_row(row) for row in memories]
    if history is not None:
        result["history"] = [
            {
                "id": h.message.id,
                "conversation": h.message.key.scope_id,
                "role": h.message.role,
                "kind": h.message.kind,
                "content": h.message.content,
                "created_at": h.message.created_at,
            }
            for h in history
        ]
    return result


def listed(sources: Sequence[MemorySource]) -> dict[str, Any]:
    """The result of ``memory_sources_list``."""
    return {
        "sources": [
            {"id": s.id, "type": s.source_type, "name": s.name, "description": s.description}
            for s in sources
        ]
    }


# -- checks and messages -----------------------------------------------------------------


def _plain_text(argument: str, value: str) -> None:
    if "\x00" in value:
        raise ToolError(f"{argument} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(f"{argument} is not valid Unicode text") from None


def _not_blank(arguments: Mapping[str, Any], argument: str) -> str:
    value = str(arguments[argument]).strip()
    if not value:
        raise ToolError(f"{argument} must not be empty")
    return value


def _order(tool: str, error: ValidationError) -> tuple[int, int]:
    """Whole-call errors (unknown or missing arguments) first, then by argument."""
    if not error.path:
        return (0, 0)
    names = list(_PARAMETERS[tool]["properties"])
    argument = error.path[0]
    return (1, names.index(argument) if argument in names else len(names))


def _message(tool: str, error: ValidationError) -> str:
    """One schema violation as a sentence naming the argument."""
    properties = _PARAMETERS[tool]["properties"]
    if not error.path:
        given = error.instance if isinstance(error.instance, Mapping) else {}
        if error.validator == "additionalProperties":
            unknown = [_short(a) for a in given if a not in properties]
            takes = ", ".join(properties) or "no arguments"
            plural = "s" if len(unknown) > 1 else ""
            return f"unknown argument{plural} {', '.join(unknown)} ({tool} takes {takes})"
        if error.validator == "required":
            missing = [_short(a) for a in error.validator_value if a not in given]
            plural = "s" if len(missing) > 1 else ""
            return f"missing argument{plural} {', '.join(missing)}"
        return f"arguments: {error.message[:200]}"
    argument = str(error.path[0])
    schema, value = error.schema, error.instance
    if error.validator == "type":
        return f"{argument} must be {_a(schema['type'])}, not {_a(_json_type(value))}"
    if error.validator == "maxLength":
        return f"{argument} must be at most {schema['maxLength']} characters, not {len(value)}"
    if error.validator == "minLength":
        return f"{argument} must not be empty"
    if error.validator == "enum":
        return f"{argument} must be one of {', '.join(schema['enum'])}, not {_short(value)}"
    if error.validator in ("minimum", "maximum"):
        low, high = schema.get("minimum"), schema.get("maximum")
        return f"{argument} must be an integer from {low} to {high}, not {_short(value)}"
    return f"{argument}: {error.message[:200]}"


_JSON_TYPES: Final[dict[type, str]] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _a(type_name: str) -> str:
    if type_name == "null":
        return type_name
    return ("an " if type_name[:1] in "aeiou" else "a ") + type_name


def _short(value: object) -> str:
    """``repr`` of a value the model sent, cut short (repr escapes NUL and surrogates)."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        return "a number too large"
    return text if len(text) <= 40 else text[:37] + "..."
