"""One Hermes turn as fermix appends: what ``sync_turn`` stores, in order (I1).

Hermes hands a provider the turn's user text, its final reply and the OpenAI-style message
list as of the turn's end. The turn is the list's last user message and what follows it:
assistant messages that call tools, the tools' results, and the final reply. They become
the appends a hand-written host makes (README, "Embedding fermix in a bot"): the user's
message, each assistant tool-call message with ``{"tool_calls": [...]}`` in its metadata,
each tool result with ``{"tool_call_id", "name"}``, then the reply, which is the commit.

Each append carries a client key derived from the Hermes session, the turn's place in the
list and its user text, so a turn stored twice (``sync_turn`` and ``on_session_end``
racing at a session's end) is stored once (N3). Pure functions: no Hermes, no fermix I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

MAX_KEY_SESSION_CHARS: Final = 80
"""How much of Hermes's session id a client key keeps (keys are at most 200 characters)."""


@dataclass(frozen=True)
class Step:
    """One append of a turn: ``role`` ``user``, ``assistant`` or ``tool``."""

    role: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """A turn to store: its steps before the reply, the reply, and its identity.

    ``ident`` names the turn (session, place, user text); ``key(i)`` is the client key of
    its ``i``-th append, the reply's being ``key(len(steps))``.
    """

    ident: str
    steps: tuple[Step, ...]
    reply: str

    def key(self, index: int) -> str:
        """The client key of append ``index`` of this turn."""
        return f"{self.ident}:{index}"


def text_of(content: Any) -> str:
    """A message's content as plain text: a string as it is, the text parts of a
    multimodal list joined by newlines, anything else empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def last_user_index(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the last user message of ``messages``, or None."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def build(
    session_id: str,
    user_text: str,
    reply: str,
    messages: Sequence[Mapping[str, Any]] | None,
) -> Turn:
    """The turn ``sync_turn`` was handed: ``user_text`` (Hermes's cleaned user message),
    the tool calls and results after the last user message of ``messages``, ``reply``."""
    steps = [Step("user", user_text)]
    place = 0
    raw_user = user_text
    if messages:
        start = last_user_index(messages)
        if start is not None:
            place = sum(1 for m in messages[: start + 1] if m.get("role") == "user")
            raw_user = text_of(messages[start].get("content"))
            between = list(messages[start + 1 :])
            if between and _is_final(between[-1]):
                between.pop()  # the reply: stored by the commit, as Hermes gave it
            steps += [step for m in between if (step := _step(m, between)) is not None]
    return Turn(_ident(session_id, place, raw_user), tuple(steps), reply)


def completed(
    session_id: str, messages: Sequence[Mapping[str, Any]], user_text: str
) -> Turn | None:
    """The last turn of ``messages`` if it ended with a reply (None while it is still
    calling tools or was cut short), its user text being ``user_text`` (cleaned)."""
    start = last_user_index(messages)
    if start is None or start == len(messages) - 1 or not _is_final(messages[-1]):
        return None
    reply = text_of(messages[-1].get("content"))
    if not reply.strip():
        return None
    return build(session_id, user_text, reply, messages)


def _is_final(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant" and not message.get("tool_calls")


def _step(message: Mapping[str, Any], turn: Sequence[Mapping[str, Any]]) -> Step | None:
    role = message.get("role")
    text = text_of(message.get("content"))
    if role == "assistant":
        calls = [_call(c) for c in message.get("tool_calls") or ()]
        return Step("assistant", text, {"tool_calls": calls} if calls else {})
    if role == "tool":
        call_id = str(message.get("tool_call_id") or "")
        name = message.get("name") or _name_of(call_id, turn)
        return Step("tool", text, {"tool_call_id": call_id, "name": str(name)})
    return None  # a system note or another user message inside the turn: not the turn's


def _call(call: Any) -> dict[str, Any]:
    """A tool call as fermix stores it: ``{"id", "type", "function": {"name", "arguments"}}``."""
    if not isinstance(call, Mapping):
        return {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    function = call.get("function")
    if not isinstance(function, Mapping):
        function = {}
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": str(function.get("name") or ""), "arguments": arguments},
    }


def _name_of(call_id: str, turn: Sequence[Mapping[str, Any]]) -> str:
    """The name of the tool ``call_id`` called, from the assistant message that called it."""
    for message in turn:
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping) and call.get("id") == call_id:
                function = call.get("function")
                if isinstance(function, Mapping):
                    return str(function.get("name") or "")
    return ""


def _ident(session_id: str, place: int, user_text: str) -> str:
    digest = hashlib.sha256(f"{place}\x00{user_text}".encode("utf-8", "replace")).hexdigest()
    return f"hermes:{session_id[:MAX_KEY_SESSION_CHARS]}:{place}:{digest[:24]}"
