"""LangChain's chat history over a fermix conversation (I3): :class:`FermixChatMessageHistory`.

``FermixChatMessageHistory(conversation)`` takes a conversation of a
:class:`~fermix.api.Memory` or a :class:`~fermix.remote.Client`
(:class:`~fermix.surface.ConversationSurface`), so ``RunnableWithMessageHistory`` or a
LangGraph node keeps its messages in fermix and fermix reviews and compacts them as it
does a hand-written host's turns. Each LangChain message is one fermix append:

- a ``HumanMessage`` is ``append_user``: the conversation's owner and trust, or the
  speaker's own in a group chat, given as ``additional_kwargs={"owner_id": ..., "trust":
  ...}`` (M1; a named owner's trust defaults as fermix's does, a guest's unless the config
  names the owner, never the operator's for the asking);
- an ``AIMessage`` with tool calls is an assistant message whose metadata holds them in
  the OpenAI format fermix's composer reads back (``{"tool_calls": [...]}``), and a
  ``ToolMessage`` a ``tool`` message with ``{"tool_call_id", "name"}``;
- an ``AIMessage`` without tool calls ends the turn: it is ``commit``-ted, with its
  ``usage_metadata``'s input tokens as the turn's peak, so the reviewer and the compactor
  are dispatched after it as after a hand-written host's reply (E1, K3);
- a ``SystemMessage`` is refused: the system prompt is the host's, given to each call
  (fermix composes it before the history), not a message of the conversation.

Every append returns once committed (A1). ``messages`` is the conversation's window,
oldest first, each with its fermix id; a compaction's checkpoint reads back as a
``SystemMessage`` marked as a summary, as the composer shows it. ``clear()`` is fermix's
``/clear`` (K4): the window is emptied for the next turn and long-term memory stays,
messages kept for history search (K5); it is the operator's, as the chat command is, so a
guest's conversation refuses it with an :class:`~fermix.errors.AccessDeniedError`.
Erasing is ``conversation.forget()`` (F2), not a history's clear. The async forms are
LangChain's defaults: the sync calls on an executor thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)

from fermix.core import commands, composer
from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.model import Message
from fermix.surface import ConversationSurface

__all__ = ["FermixChatMessageHistory", "message_of", "openai_tool_calls"]


def _text(message: BaseMessage) -> str:
    """A message's content as text: a string, or the text blocks of a block list."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidInputError(
                f"a {type(message).__name__}'s content block of type {kind!r} cannot be"
                " stored: fermix keeps text"
            )
    return "".join(parts)


def openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """LangChain's tool calls in the OpenAI format fermix stores and composes."""
    out = []
    for call in calls:
        if not call.get("id"):
            raise InvalidInputError(f"tool call {call.get('name')!r} has no id to answer it by")
        out.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("args", {}), ensure_ascii=False),
                },
            }
        )
    return out


def _langchain_tool_calls(calls: Any) -> list[ToolCall]:
    """The OpenAI-format tool calls of a stored message as LangChain's."""
    out: list[ToolCall] = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        raw = function.get("arguments") or "{}"
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            args = {"arguments": raw}
        out.append(
            ToolCall(
                name=str(function.get("name", "")),
                args=args if isinstance(args, dict) else {"arguments": args},
                id=call.get("id"),
                type="tool_call",
            )
        )
    return out


def message_of(stored: Message) -> BaseMessage:
    """One stored message as LangChain's, as the composer shows it to a model."""
    shown = composer.history_message(stored)
    role, content, ident = shown["role"], shown["content"], str(stored.id)
    if role == "user":
        return HumanMessage(content=content, id=ident, name=stored.sender or None)
    if role == "assistant":
        calls = _langchain_tool_calls(shown.get("tool_calls"))
        return AIMessage(content=content, id=ident, tool_calls=calls)
    if role == "tool":
        return ToolMessage(
            content=content,
            id=ident,
            tool_call_id=str(shown.get("tool_call_id", "")),
            name=shown.get("name"),
        )
    return SystemMessage(content=content, id=ident)


def _usage(message: AIMessage) -> dict[str, Any] | None:
    usage = message.usage_metadata
    return None if usage is None else {"prompt_tokens": int(usage["input_tokens"])}


class FermixChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history that is one fermix conversation (I3).

    ``conversation`` is ``memory.conversation(...)`` of a ``Memory`` or a ``Client``; its
    owner and trust are what a ``HumanMessage`` records unless it names its speaker.
    """

    def __init__(self, conversation: ConversationSurface) -> None:
        self.conversation = conversation

    def __repr__(self) -> str:
        return f"FermixChatMessageHistory({self.conversation!r})"

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The conversation's window, oldest first (LangChain's attribute, read-only)."""
        return [message_of(m) for m in self.conversation.history()]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append each message in order, each committed before the next; a batch is
        checked whole first, so a message fermix cannot store changes nothing."""
        for message in messages:
            self._check(message)
        for message in messages:
            self._append(message)

    def _check(self, message: BaseMessage) -> None:
        if isinstance(message, SystemMessage):
            raise InvalidInputError(
                "a SystemMessage is not stored: give the system prompt to each model call"
                " (fermix composes it before the history)"
            )
        if not isinstance(message, HumanMessage | AIMessage | ToolMessage):
            raise InvalidInputError(
                f"a {type(message).__name__} cannot be stored: fermix keeps user, assistant"
                " and tool messages"
            )
        _text(message)
        if isinstance(message, AIMessage) and message.tool_calls:
            openai_tool_calls(message.tool_calls)

    def _append(self, message: BaseMessage) -> None:
        conv, text = self.conversation, _text(message)
        if isinstance(message, HumanMessage):
            extra = message.additional_kwargs
            conv.append_user(
                text,
                sender=message.name or "",
                owner_id=extra.get("owner_id"),
                trust=extra.get("trust"),
            )
        elif isinstance(message, AIMessage) and message.tool_calls:
            conv.append_assistant(
                text, metadata={"tool_calls": openai_tool_calls(message.tool_calls)}
            )
        elif isinstance(message, AIMessage):
            conv.commit(text, _usage(message))
        elif isinstance(message, ToolMessage):
            metadata = {"tool_call_id": message.tool_call_id}
            if message.name:
                metadata["name"] = message.name
            conv.append("tool", text, sender="tool", metadata=metadata)

    def clear(self) -> None:
        """Empty the window, as ``/clear`` does (K4): the operator's; a guest's
        conversation raises :class:`~fermix.errors.AccessDeniedError`, changing nothing."""
        if self.conversation.trust != "operator":
            raise AccessDeniedError(
                "clearing a conversation's history is the operator's (/clear, K4); this"
                f" conversation is a {self.conversation.trust}'s: erase it with forget()"
            )
        reply = self.conversation.handle_command("/clear")
        if reply != commands.CLEARED:
            raise AccessDeniedError(f"the history was not cleared: {reply}")
