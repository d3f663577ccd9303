"""fermix for the OpenAI Agents SDK (I2): a ``Session`` over a fermix conversation, the
memory tools as function tools and the prompt files as instructions.

:class:`FermixSession` is the SDK's session protocol (``get_items``, ``add_items``,
``pop_item``, ``clear_session``, ``session_settings``) over one conversation of a
:class:`~fermix.api.Memory` or a :class:`~fermix.remote.Client`, so ``Runner.run(agent,
text, session=session)`` stores the turn as a hand-written host would:

- a user item is ``append_user`` with the session's owner and trust (a guest stays a
  guest, M1, M2);
- the items of one model response (an assistant message, its function calls, reasoning)
  are one assistant message whose metadata holds ``tool_calls`` in the shape fermix's
  composer reads, and each ``function_call_output`` is a tool message (``tool_call_id``,
  ``name``);
- the response that ends the turn (the last of a batch, an assistant message with no
  function call) is ``commit(reply, usage)``, with the run's peak prompt tokens: the
  reviewer and the compactor run as after any host's commit (K3, M5).

Each message keeps the SDK items it was made from in its metadata (``openai_agents``), so
``get_items`` gives back exactly what was added, item types fermix does not read included;
a message fermix or another host wrote (a compaction checkpoint, a hand-written turn) comes
back as the items the SDK takes for it (:func:`items_of`). The window is fermix's: after a
compaction, ``get_items`` is the checkpoint and the messages kept after it.

The Runner passes its ``RunContextWrapper`` to a session whose four methods take a
``wrapper`` keyword; the session reads the run's usage from it at the commit. Before the
first read of a turn (the Runner reads the history before it stores the new input) the
session runs fermix's ``preflight``, which compacts when the last turn's peak calls for it;
its notice is :attr:`FermixSession.notice`. fermix's calls are synchronous: every one runs
in a worker thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from agents import Agent, FunctionTool, RunContextWrapper, TResponseInputItem
from agents.memory import SessionABC, SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
from agents.tool_context import ToolContext

from fermix.core import commands, composer
from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.integrations.prompt_files import FilesAhead
from fermix.model import ConversationKey, JobCaller, Message, NewMessage
from fermix.surface import ConversationSurface, MemorySurface

__all__ = ["META_KEY", "FermixSession", "items_of", "memory_instructions", "memory_tools"]

META_KEY: Final = "openai_agents"
"""The metadata key of a message's SDK items: ``{"items": [...]}``, and ``"text"`` naming
the field of its one item that is the message's content (stored once, not twice)."""

_INPUT_ROLES: Final = {"user": "user", "system": "system", "developer": "system"}
"""Input message roles and the fermix role each is stored with."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """One fermix message to write for some SDK items."""

    role: str
    text: str
    metadata: dict[str, Any]
    reply: bool = False
    """Whether it is the turn's reply, written with ``commit``."""


class FermixSession(SessionABC):
    """The SDK's ``Session`` over one fermix conversation (I2).

    ``memory`` is a :class:`~fermix.api.Memory` or a :class:`~fermix.remote.Client`; the
    other arguments open the conversation as ``memory.conversation(...)`` does: items the
    user adds are that owner's, at that trust (``None``: fermix's default, a guest unless
    the config names the owner an operator; M2). One session per speaker, as a host keeps
    one handle per speaker: in a group chat, sessions of different owners over the same
    ``chat_id`` share one conversation.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        memory: MemorySurface[Any],
        agent_id: str,
        channel: str,
        chat_id: str,
        *,
        owner_id: str,
        trust: str | None = None,
        thread_scope: str = "",
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.memory = memory
        self.conversation: ConversationSurface = memory.conversation(
            agent_id, channel, chat_id, thread_scope, owner_id=owner_id, trust=trust
        )
        self.session_id = f"{agent_id}/{self.conversation.key.scope_id}"
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.notice: str | None = None
        """The notice of the last preflight that compacted (for the host to send), else None."""
        self._lock = threading.Lock()
        self._needs_preflight = True
        self._ahead = FilesAhead(self.conversation)
        """The prompt files read with the window, for :meth:`instructions`."""

    def __repr__(self) -> str:
        return f"FermixSession({self.conversation!r})"

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        """The window's items, oldest first (the newest ``limit`` if given, else
        ``session_settings.limit``); the first read of a turn runs fermix's preflight."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and (isinstance(wanted, bool) or wanted < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, not {wanted!r}")
        return await asyncio.to_thread(self._get_items, wanted)

    def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        with self._lock:
            if self._needs_preflight:
                self.notice = self.conversation.preflight()
                self._needs_preflight = False
            self._ahead.read()
            if limit == 0:
                return []
            items = [item for message in self.conversation.history() for item in items_of(message)]
        return items if limit is None else items[-limit:]

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Store ``items`` in the conversation, each acknowledged once committed (A1).

        Every item is checked first: a batch with one bad item (not a JSON object, text
        fermix refuses, metadata past its limit) is an
        :class:`~fermix.errors.InvalidInputError` and nothing of it is stored.
        """
        if not items:
            return
        entries = _entries(items)
        for entry in entries:
            _check(self.conversation.key, entry)
        peak = _peak_prompt_tokens(wrapper)
        await asyncio.to_thread(self._write, entries, peak)

    def _write(self, entries: Sequence[_Entry], peak: int | None) -> None:
        conv = self.conversation
        with self._lock:
            names = _call_names(entries)
            for entry in entries:
                metadata = entry.metadata
                if entry.role == "tool" and "name" not in metadata:
                    call_id = metadata["tool_call_id"]
                    name = names.get(call_id) or _call_names_of(conv.history()).get(call_id)
                    metadata = {**metadata, "name": name or ""}
                if entry.reply:
                    usage = None if peak is None else {"prompt_tokens": peak}
                    conv.commit(entry.text, usage, metadata=metadata)
                    self._needs_preflight = True
                    self._ahead.drop()
                elif entry.role == "user":
                    conv.append_user(entry.text, metadata=metadata)
                else:
                    sender = "assistant" if entry.role == "assistant" else ""
                    conv.append(entry.role, entry.text, sender=sender, metadata=metadata)

    async def pop_item(
        self, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        """Remove the newest item and return it, or None when the window is empty.

        The message holding it is erased (``forget_message``: a real delete, F2, which
        needs an operator token remote); when that message held other items of the same
        model response, they are stored again as one message, in its place at the end.
        """
        return await asyncio.to_thread(self._pop_item)

    def _pop_item(self) -> TResponseInputItem | None:
        with self._lock:
            newest = self.conversation.history(1)
            if not newest:
                return None
            message = newest[-1]
            items = items_of(message)
            self.memory.forget_message(message.id)
            rest = items[:-1]
            if rest:
                entry = _response_entry(cast("list[dict[str, Any]]", rest))
                self.conversation.append(
                    message.role, entry.text, sender=message.sender, metadata=entry.metadata
                )
            return items[-1] if items else None

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Start a fresh window: fermix's ``/clear``.

        The SDK's "clear" is a host starting the conversation over, which fermix calls
        ``/clear``: ``get_items`` is empty after it, while the stored messages, what the
        reviewer drew from them and recall over history stay (long-term memory is the
        point of fermix). Erasing is another act with its own call, :meth:`forget`. As
        for ``/clear`` typed in a chat, a guest's session may not: an
        :class:`~fermix.errors.AccessDeniedError`, and nothing changes.
        """
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        with self._lock:
            if not commands.allowed(commands.Command("clear"), self.conversation.trust):
                raise AccessDeniedError(commands.refusal(commands.Command("clear")))
            self.conversation.handle_command("/clear")
            self._needs_preflight = True

    async def command(self, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command (``/compact``, ``/new``, ``/clear``;
        a guest's is refused, K4) and return the reply to send; None for anything else,
        which the host gives the Runner."""
        reply = await asyncio.to_thread(self.conversation.handle_command, text)
        if reply is not None:
            with self._lock:
                self._needs_preflight = True
        return reply

    async def forget(self) -> None:
        """Erase the conversation: its messages, the rows drawn from them and its state
        (``conversation.forget()``, F2; an operator token remote)."""
        await asyncio.to_thread(self.conversation.forget)

    def tools(self) -> list[FunctionTool]:
        """fermix's memory tools for this session's conversation (:func:`memory_tools`)."""
        return memory_tools(self.memory, self.conversation)

    def instructions(
        self, system: str
    ) -> Callable[[RunContextWrapper[Any], Agent[Any]], Awaitable[str]]:
        """``system`` and this conversation's memory, for ``Agent(instructions=...)``, as
        :func:`memory_instructions` gives them, read afresh for every model call; the first
        call after :meth:`get_items` takes the files that call read with the window, which
        saves the run a hop to a worker thread (:mod:`fermix.integrations.prompt_files`)."""
        ahead = self._ahead
        ahead.wanted = True

        async def instructions(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
            return await ahead.instructions(system)

        return instructions


def memory_tools(
    memory: MemorySurface[Any], caller: ConversationSurface | JobCaller
) -> list[FunctionTool]:
    """fermix's memory tools (T4) as the SDK's function tools, each run for ``caller`` (a
    conversation, or a scheduled job's :class:`~fermix.model.JobCaller`) by
    ``memory.tools.run`` in a worker thread. A refusal is the tool's output
    (``{"error": ...}``), as for any host: the model sees it and goes on."""
    tools = []
    for schema in memory.tools.schemas():
        function = schema["function"]
        tools.append(
            FunctionTool(
                name=function["name"],
                description=function["description"],
                params_json_schema=function["parameters"],
                on_invoke_tool=_invoker(memory, caller, function["name"]),
                strict_json_schema=False,  # fermix's schemas have optional fields
            )
        )
    return tools


def _invoker(
    memory: MemorySurface[Any], caller: ConversationSurface | JobCaller, name: str
) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        call = {
            "id": context.tool_call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return await asyncio.to_thread(memory.tools.run, call, caller)

    return invoke


def memory_instructions(
    conversation: ConversationSurface, system: str
) -> Callable[[RunContextWrapper[Any], Agent[Any]], Awaitable[str]]:
    """A callable for ``Agent(instructions=...)``: ``system``, then the operator's standing
    rules and the fenced ``<memory-context>`` block of ``conversation``'s USER.md and
    MEMORY.md, read fresh for every model call (P1, M11).

    These are the system messages fermix's ``compose`` puts before the history, in its
    order and with its labels, joined into the one instructions text the SDK sends.
    """

    files = FilesAhead(conversation)  # never read ahead: each call reads them

    async def instructions(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        return await files.instructions(system)

    return instructions


# -- items to messages --------------------------------------------------------------------


def _entries(items: Sequence[Any]) -> list[_Entry]:
    """The fermix messages for a batch of SDK items, in order (see the module)."""
    entries: list[_Entry] = []
    response: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, Mapping):
            raise InvalidInputError(f"a session item must be a JSON object, not {item!r:.80}")
        item = dict(item)
        kind = _kind(item)
        if kind == "response":
            response.append(item)
            continue
        if response:
            entries.append(_response_entry(response))
            response = []
        entries.append(_input_entry(item) if kind == "input" else _output_entry(item))
    if response:
        last = _response_entry(response)
        ends_turn = "tool_calls" not in last.metadata and any(
            _is_assistant_message(item) for item in response
        )
        entries.append(_Entry(last.role, last.text, last.metadata, reply=ends_turn))
    return entries


def _kind(item: Mapping[str, Any]) -> str:
    """``input`` (what a user or the host said), ``output`` (a tool's result) or
    ``response`` (what the model produced)."""
    kind = item.get("type")
    if kind in (None, "message") and item.get("role") in _INPUT_ROLES:
        return "input"
    if isinstance(kind, str) and kind.endswith("_output"):
        return "output"
    return "response"


def _is_assistant_message(item: Mapping[str, Any]) -> bool:
    return item.get("type") in (None, "message") and item.get("role") == "assistant"


def _text_of(content: Any) -> str:
    """The text of a message item's ``content``: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, Mapping):
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                texts.append(text)
    return "\n".join(texts)


def _kept(item: dict[str, Any], field: str, text: str) -> dict[str, Any]:
    """The metadata keeping ``item``, without its ``field`` when that is the message text."""
    if item.get(field) == text:
        rest = {k: v for k, v in item.items() if k != field}
        return {META_KEY: {"items": [rest], "text": field}}
    return {META_KEY: {"items": [item]}}


def _input_entry(item: dict[str, Any]) -> _Entry:
    text = _text_of(item.get("content"))
    return _Entry(_INPUT_ROLES[item["role"]], text, _kept(item, "content", text))


def _output_entry(item: dict[str, Any]) -> _Entry:
    output = item.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    metadata = _kept(item, "output", text)
    metadata["tool_call_id"] = str(item.get("call_id") or item.get("id") or "")
    if item.get("type") != "function_call_output":
        metadata["name"] = str(item["type"]).removesuffix("_output")
    return _Entry("tool", text, metadata)


def _response_entry(items: Sequence[dict[str, Any]]) -> _Entry:
    """One assistant message for the items of one model response."""
    text = "\n".join(
        text
        for item in items
        if _is_assistant_message(item)
        if (text := _text_of(item.get("content")))
    )
    metadata: dict[str, Any] = {META_KEY: {"items": list(items)}}
    calls = [
        {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
        }
        for item in items
        if item.get("type") == "function_call"
    ]
    if calls:
        metadata["tool_calls"] = calls
    return _Entry("assistant", text, metadata)


def _check(key: ConversationKey, entry: _Entry) -> None:
    """Refuse an entry fermix would refuse, before anything of its batch is written."""
    NewMessage(key, entry.role, entry.text, metadata=entry.metadata).metadata_json()


def _call_names(entries: Sequence[_Entry]) -> dict[str, str]:
    names: dict[str, str] = {}
    for entry in entries:
        for call in entry.metadata.get("tool_calls", ()):
            names[str(call["id"])] = str(call["function"]["name"])
    return names


def _call_names_of(window: Sequence[Message]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in window:
        if message.role == "assistant" and "tool_calls" in message.metadata_json:
            for call in message.metadata.get("tool_calls", ()):
                names[str(call.get("id"))] = str(call.get("function", {}).get("name"))
    return names


def _peak_prompt_tokens(wrapper: RunContextWrapper[Any] | None) -> int | None:
    """The most prompt tokens of one model call of the run so far (K3), or None."""
    if wrapper is None:
        return None
    usage = wrapper.usage
    peaks = [entry.input_tokens for entry in usage.request_usage_entries]
    if peaks:
        return max(peaks)
    return usage.input_tokens if usage.requests == 1 else None


# -- messages to items --------------------------------------------------------------------


def items_of(message: Message) -> list[TResponseInputItem]:
    """The SDK items a stored message stands for: the ones it was made from, or, for a
    message fermix or another host wrote, the items of its litellm form (a checkpoint is a
    system message marked as the summary of the earlier conversation)."""
    if META_KEY in message.metadata_json:
        kept = message.metadata.get(META_KEY)  # parsed afresh: the items are this call's own
        if isinstance(kept, Mapping) and isinstance(kept.get("items"), list):
            items = kept["items"]
            field = kept.get("text")
            if isinstance(field, str) and items and isinstance(items[0], dict):
                items[0][field] = message.content
            return cast("list[TResponseInputItem]", items)
    return _items_of_litellm(composer.history_message(message))


def _items_of_litellm(message: Mapping[str, Any]) -> list[TResponseInputItem]:
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        item: dict[str, Any] = {
            "type": "function_call_output",
            "call_id": message.get("tool_call_id", ""),
            "output": content,
        }
        return [cast("TResponseInputItem", item)]
    out: list[dict[str, Any]] = []
    calls = message.get("tool_calls") if role == "assistant" else None
    if content or not calls:
        out.append({"role": role, "content": content})
    for call in calls or ():
        function = call.get("function", {})
        out.append(
            {
                "type": "function_call",
                "call_id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
            }
        )
    return cast("list[TResponseInputItem]", out)
