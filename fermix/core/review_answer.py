"""The memory reviewer's answer: its format, its JSON schema and its parser (E4).

Output format (documented for operators and model authors). The model answers either the
literal ``Nothing to save.`` or one JSON object::

    {"operations": [
        {"op": "add", "speaker": "S1", "category": "preference", "key": "drink",
         "value": "Drinks green tea"},
        {"op": "replace", "speaker": "S1", "id": 12, "value": "Lives in Porto since 2026"},
        {"op": "archive", "speaker": "S2", "id": 7, "reason": "no longer works at Acme"}
    ]}

``replace`` may also carry ``key`` and ``category``. Every op names its ``speaker``: the
handle (``S1``, ``S2``...) of the person whose words it comes from, as the prompt lists
them (M1); admission files and admits the op as that person's, and refuses one without a
valid speaker (an op without one is that of the only speaker, when only one spoke).

Any other shape, an unknown field, a wrong type or an unknown op rejects the whole answer
(E4). The same schema is passed as
``response_format`` where the model supports it; a model that refuses it is asked again
without, and its text answer goes through the same parser (a JSON object inside a code
fence is accepted). :func:`parse` checks the answer against :data:`RESPONSE_SCHEMA` with
``jsonschema`` (an integer ``id`` must be a JSON integer: ``1.0`` is refused), and by hand
only the rule the schema does not state: which fields each op takes. A category outside
the six is not malformed: admission (:mod:`fermix.core.review_admission`) refuses that one
operation (E5).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.validators import extend

from fermix.errors import ReviewOutputError
from fermix.model import CATEGORIES

NOTHING_TO_SAVE = "Nothing to save."
MAX_OPERATIONS = 50

RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "memory_operations",
        "strict": False,
        "schema": {
            "type": "object",
            "properties": {
                "operations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "op": {"type": "string", "enum": ["add", "replace", "archive"]},
                            "speaker": {"type": "string"},
                            "id": {"type": "integer"},
                            "category": {"type": "string", "enum": list(CATEGORIES)},
                            "key": {"type": "string"},
                            "value": {"type": "string"},
                            "reason": {"type": "string"},
                        },
                        "required": ["op"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["operations"],
            "additionalProperties": False,
        },
    },
}
"""The answer's JSON schema, passed as ``response_format`` where the model supports it."""


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation the model asked for."""

    op: str
    id: int | None = None
    category: str | None = None
    key: str | None = None
    value: str | None = None
    reason: str | None = None
    speaker: str | None = None
    """The handle of the person the op's fact comes from (``S1``), as the model said (M1)."""


_FIELDS = {
    "add": ({"op", "category", "key", "value"}, {"speaker"}),
    "replace": ({"op", "id", "value"}, {"key", "category", "speaker"}),
    "archive": ({"op", "id"}, {"reason", "speaker"}),
}
"""The fields each op needs and may carry: the one rule :data:`RESPONSE_SCHEMA` leaves out."""
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _answer_schema() -> dict[str, Any]:
    """:data:`RESPONSE_SCHEMA` as :func:`parse` applies it: at most :data:`MAX_OPERATIONS`
    operations, and any string as a category (admission refuses an unknown one, E5)."""
    schema: dict[str, Any] = copy.deepcopy(RESPONSE_SCHEMA["json_schema"]["schema"])
    operations = schema["properties"]["operations"]
    operations["maxItems"] = MAX_OPERATIONS
    del operations["items"]["properties"]["category"]["enum"]
    return schema


# JSON Schema counts 1.0 as an integer; an id is an integer only as written without a point.
_Validator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: type(value) is int
    ),
)
Draft202012Validator.check_schema(RESPONSE_SCHEMA["json_schema"]["schema"])
_VALIDATOR = _Validator(_answer_schema())
_A_TYPE = {"integer": "an integer", "string": "a string", "object": "an object"}


def parse(text: str) -> list[Operation]:
    """The operations in the model's answer; ``[]`` for ``Nothing to save.``.

    Raises :class:`ReviewOutputError` naming the first thing wrong (in document order) when
    the answer is malformed; the answer is then rejected whole (E4).
    """
    if not isinstance(text, str):
        raise ReviewOutputError("the answer is not text")
    body = text.strip()
    if body.rstrip(".").strip().lower() == NOTHING_TO_SAVE.rstrip(".").lower():
        return []
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        msg = f"the answer is neither JSON nor {NOTHING_TO_SAVE!r}: {exc}"
        raise ReviewOutputError(msg) from None
    by_operation: dict[int, ValidationError] = {}
    for error in sorted(_VALIDATOR.iter_errors(data), key=_error_order):
        path = list(error.absolute_path)
        if len(path) < 2:
            raise ReviewOutputError(_document_error(error, data))
        by_operation.setdefault(path[1], error)
    items: list[dict[str, Any]] = data["operations"]
    for index, item in enumerate(items):
        if index in by_operation:
            raise ReviewOutputError(_operation_error(by_operation[index], index, item))
        _check_fields(index, item)
    return [
        Operation(
            op=item["op"],
            id=item.get("id"),
            category=item.get("category"),
            key=item.get("key"),
            value=item.get("value"),
            reason=item.get("reason"),
            speaker=item.get("speaker"),
        )
        for item in items
    ]


def _error_order(error: ValidationError) -> tuple[Any, ...]:
    """The document first, then each operation in turn: its op, then the rest in order."""
    path = tuple(error.absolute_path)
    about_op = path[2:] == ("op",) or (len(path) == 2 and error.validator == "required")
    return (path[:2], not about_op, path)


def _document_error(error: ValidationError, data: Any) -> str:
    if not error.absolute_path:
        return 'the answer must be one object with only "operations"'
    if error.validator == "maxItems":
        return f"{len(data['operations'])} operations; at most {MAX_OPERATIONS}"
    return '"operations" must be a list'


def _operation_error(error: ValidationError, index: int, item: Any) -> str:
    where = f"operation {index}"
    path = list(error.absolute_path)
    if len(path) == 2 and error.validator == "type":
        return f"{where} is not an object"
    if "op" not in item:
        return f"{where} has no op"
    if path[2:] == ["op"]:
        return f"{where} has an unknown op {item['op']!r}"
    if error.validator == "additionalProperties":
        extra = sorted(set(item) - set(error.schema["properties"]))
        return f"{where} ({item['op']}) has unknown fields {extra}"
    if len(path) == 3 and error.validator == "type":
        wanted = _A_TYPE.get(str(error.validator_value), str(error.validator_value))
        return f"{where}: {path[2]} must be {wanted}"
    return f"{where}: {error.message[:200]}"


def _check_fields(index: int, item: dict[str, Any]) -> None:
    """Which fields an op takes depends on the op: checked here, not by the schema."""
    op = item["op"]
    required, optional = _FIELDS[op]
    missing = sorted(required - set(item))
    extra = sorted(set(item) - required - optional)
    problems = [f"is missing {missing}"] if missing else []
    if extra:
        problems.append(f"does not take {extra}")
    if problems:
        raise ReviewOutputError(f"operation {index} ({op}) {' and '.join(problems)}")
