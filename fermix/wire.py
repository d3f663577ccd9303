"""fermix's values as JSON on the wire: conversation handles and the model's dataclasses (N1).

The memory server and :class:`fermix.Client` both speak through this module, so what one
writes the other reads back equal: ``message_from_json(message_json(m)) == m``.

A *conversation handle* names one conversation as the host opened it, in one URL path
segment: the base64url text (no padding) of the compact UTF-8 JSON array
``[agent_id, channel, chat_id, thread_scope, owner_id, trust]``. It is an address, not a
credential: the server checks every part again on each request and re-derives the trust
from the caller's token (a host token is always a guest's, N2), so a client that edits a
handle gains nothing it could not ask for by opening another conversation.

The dataclasses go as plain dicts of their fields (``dataclasses.asdict``-like; an enum as
its value, a tuple as a list, a :class:`~fermix.model.ConversationKey` as its four fields),
with one exception: a :class:`~fermix.model.Message` carries ``metadata`` as a JSON object
rather than its stored ``metadata_json`` text, which is what a client wants to read.
:func:`from_json` builds any of them back from their type hints, so this base module needs
no import of the layers above that define result types (the reviewer's, the compactor's).

The dataclass is the one definition of its JSON: :func:`wire_fields` says which fields a
type carries and with what type hints, and the codec here, the server's response models
(``fermix/server/http/wire_models.py``, hence the OpenAPI document) and the client all
follow it, so a field added to the dataclass reaches all three without another edit.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import functools
import json
import operator
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from fermix import validate
from fermix.errors import InvalidInputError
from fermix.model import (
    ConversationKey,
    ConversationState,
    JobRun,
    MemoryRow,
    Message,
    Revision,
    ScheduledJob,
    check_trust,
)

__all__ = [
    "HandleError",
    "WireError",
    "decode_handle",
    "encode_handle",
    "from_json",
    "job_from_json",
    "message_from_json",
    "message_json",
    "row_from_json",
    "run_from_json",
    "state_from_json",
    "to_json",
    "wire_fields",
]

MAX_HANDLE_CHARS = 8192
"""Longer than any handle of valid parts (six ids of at most 200 characters each)."""
_HANDLE_CHARS = re.compile(r"^[A-Za-z0-9_-]+$")

T = TypeVar("T")


class WireError(InvalidInputError):
    """A JSON document does not hold the value it claims to; ``field`` names the part."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class HandleError(WireError):
    """A conversation handle is not one this module wrote (the server answers 422)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="path.handle")


# -- conversation handles ----------------------------------------------------------------


def encode_handle(key: ConversationKey, owner_id: str, trust: str) -> str:
    """The handle of conversation ``key`` as opened for ``owner_id`` with ``trust``."""
    validate.identifier("owner_id", owner_id, allow_empty=True)
    parts = [*key.as_tuple(), owner_id, check_trust(trust)]
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_handle(handle: str) -> tuple[ConversationKey, str, str]:
    """``(key, owner_id, trust)`` of ``handle``; a :class:`HandleError` for anything else."""
    if not isinstance(handle, str) or not handle:
        raise HandleError("the conversation handle is empty")
    if len(handle) > MAX_HANDLE_CHARS or not _HANDLE_CHARS.match(handle):
        raise HandleError(
            "not a conversation handle: open the conversation first"
            " (POST /v1/conversations/open) and use the handle it answers"
        )
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        parts = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise HandleError("not a conversation handle: it does not decode") from None
    if (
        not isinstance(parts, list)
        or len(parts) != 6
        or not all(isinstance(part, str) for part in parts)
    ):
        raise HandleError("not a conversation handle: it does not hold six strings")
    agent_id, channel, chat_id, thread_scope, owner_id, trust = parts
    try:
        key = ConversationKey(agent_id, channel, chat_id, thread_scope)
        validate.identifier("owner_id", owner_id, allow_empty=True)
        check_trust(trust)
    except InvalidInputError as exc:
        raise HandleError(f"the conversation handle holds a bad value: {exc}") from None
    return key, owner_id, trust


# -- dataclasses as JSON -----------------------------------------------------------------


def to_json(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses as dicts of their :func:`wire_fields`,
    recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A Message's "metadata" is its property: the object its metadata_json holds.
        return {name: to_json(getattr(value, name)) for name, _ in wire_fields(type(value))}
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


@functools.cache
def wire_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """The fields dataclass ``cls`` carries on the wire, in order, each with its type hint:
    every field, except that a :class:`~fermix.model.Message`'s ``metadata_json`` text goes
    as its ``metadata`` (a JSON object)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        ("metadata", dict[str, Any])
        if cls is Message and f.name == "metadata_json"
        else (f.name, hints[f.name])
        for f in dataclasses.fields(cls)
    )


_MESSAGE_NAMES = tuple(name for name, _ in wire_fields(Message))
_message_values = operator.attrgetter(*_MESSAGE_NAMES)  # ``metadata``: Message's property


def message_json(message: Message) -> dict[str, Any]:
    """A stored message as JSON: its columns, with ``metadata`` as an object."""
    return dict(zip(_MESSAGE_NAMES, _message_values(message), strict=True))


def message_from_json(data: Any) -> Message:
    """The :class:`~fermix.model.Message` of :func:`message_json`'s document."""
    document = _object(data, "message")
    metadata = document.get("metadata", {})
    if not isinstance(metadata, dict):
        raise WireError("message.metadata must be an object", field="metadata")
    # The encoding NewMessage.metadata_json stores, so a round trip compares equal.
    encoded = json.dumps(metadata, ensure_ascii=False, sort_keys=True) if metadata else "{}"
    fields = {k: v for k, v in document.items() if k != "metadata"}
    return _from_fields(Message, {**fields, "metadata_json": encoded})


def row_from_json(data: Any) -> MemoryRow:
    """A :class:`~fermix.model.MemoryRow` from its JSON (every column)."""
    return from_json(MemoryRow, data)


def revision_from_json(data: Any) -> Revision:
    """A :class:`~fermix.model.Revision` from its JSON."""
    return from_json(Revision, data)


def job_from_json(data: Any) -> ScheduledJob:
    """A :class:`~fermix.model.ScheduledJob` from its JSON."""
    return from_json(ScheduledJob, data)


def run_from_json(data: Any) -> JobRun:
    """A :class:`~fermix.model.JobRun` from its JSON."""
    return from_json(JobRun, data)


def state_from_json(data: Any) -> ConversationState:
    """A :class:`~fermix.model.ConversationState` from its JSON."""
    return from_json(ConversationState, data)


def from_json(cls: type[T], data: Any) -> T:
    """An instance of dataclass ``cls`` from the dict :func:`to_json` made of one.

    Each field is converted by its type hint (a nested key, an enum, a tuple, an optional);
    keys the class does not know are ignored, so a newer server's extra fields do not break
    an older client; a missing field without a default is a :class:`WireError`. A
    :class:`~fermix.model.Message` is read as :func:`message_from_json` reads it.
    """
    if cls is Message:
        return typing.cast(T, message_from_json(data))
    return _from_fields(cls, _object(data, cls.__name__))


def _from_fields(cls: type[T], document: dict[str, Any]) -> T:
    """An instance of dataclass ``cls`` from ``document``, each field by its type hint."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.name not in document:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{cls.__name__} lacks its field {f.name!r}", field=f.name)
            continue
        values[f.name] = _convert(hints[f.name], document[f.name], f"{cls.__name__}.{f.name}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise WireError(f"{cls.__name__} is malformed: {exc}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    """``value`` converted to the type ``hint`` names (only the shapes the model uses)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        return _convert(arms[0], value, where) if len(arms) == 1 else value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise WireError(f"{where} must be an array", field=where)
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], item, where) for item in value)
        if len(args) != len(value):
            raise WireError(f"{where} must have {len(args)} items", field=where)
        return tuple(_convert(arg, item, where) for arg, item in zip(args, value, strict=True))
    if origin is list:
        if not isinstance(value, list):
            raise WireError(f"{where} must be an array", field=where)
        (arg,) = typing.get_args(hint) or (Any,)
        return [_convert(arg, item, where) for item in value]
    if isinstance(hint, type):
        if issubclass(hint, enum.Enum):
            try:
                return hint(value)
            except ValueError:
                raise WireError(f"{where} has an unknown value {value!r}", field=where) from None
        if dataclasses.is_dataclass(hint):
            return from_json(hint, value)
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if hint in (str, int, float, bool) and not isinstance(value, hint):
            raise WireError(
                f"{where} must be {hint.__name__}, not {type(value).__name__}", field=where
            )
        if hint is int and isinstance(value, bool):
            raise WireError(f"{where} must be int, not bool", field=where)
    return value


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise WireError(f"{what} must be a JSON object, not {type(data).__name__}")
    return data
