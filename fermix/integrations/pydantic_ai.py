"""fermix for Pydantic AI (I4): a conversation's window as ``message_history``, a run's
new messages stored back, the prompt files as instructions and the memory tools as a
toolset.

:class:`FermixHistory` holds one conversation of a :class:`~fermix.api.Memory` or a
:class:`~fermix.remote.Client`. A turn is::

    result = await history.run(agent, text, instructions=history.instructions(SYSTEM),
                               toolsets=[history.toolset()])

which is :meth:`~FermixHistory.messages` (fermix's preflight, then the window as
``list[ModelMessage]``), ``agent.run(text, message_history=...)``, then
:meth:`~FermixHistory.save` of ``result.new_messages()``:

- a ``UserPromptPart`` is ``append_user`` with the history's owner and trust (a guest stays
  a guest, M1, M2); a ``ToolReturnPart`` (or a retry prompt) is a tool message
  (``tool_call_id``, ``name``); a ``SystemPromptPart`` a system message;
- a ``ModelResponse`` is one assistant message whose metadata holds ``tool_calls`` in the
  shape fermix's composer reads; the run's last response is ``commit(reply, usage)`` with
  the run's peak prompt tokens (the most of one model request), so the reviewer and the
  compactor run as after any host's commit (K3, M5).

The first fermix message of each ``ModelMessage`` keeps it whole in its metadata
(``pydantic_ai``, as ``ModelMessagesTypeAdapter`` dumps it), and the others of the same
``ModelMessage`` point at that one: the history read back is the messages saved. The
``instructions`` of a saved request are dropped (every run is given fresh ones, with the
prompt files as they are then). A message fermix or another host wrote (a compaction
checkpoint, a hand-written turn) is read as the parts its litellm form stands for.

fermix's calls are synchronous: each runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import StrictInt, TypeAdapter, ValidationError
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.run import AgentRunResult
from pydantic_ai.toolsets import FunctionToolset
from typing_extensions import TypedDict

from fermix.core import composer
from fermix.errors import InvalidInputError
from fermix.integrations.prompt_files import FilesAhead
from fermix.model import ConversationKey, JobCaller, Message, NewMessage
from fermix.surface import ConversationSurface, MemorySurface

__all__ = [
    "META_KEY",
    "FermixHistory",
    "memory_instructions",
    "memory_toolset",
    "model_messages",
]

log = logging.getLogger(__name__)

META_KEY: Final = "pydantic_ai"
"""The metadata key: ``{"message": <one ModelMessage as JSON>}`` on the first fermix
message of a ``ModelMessage``, ``{"part_of": <that message's id>}`` on the others."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """One fermix message to write for one part (or a response) of a ``ModelMessage``."""

    role: str
    text: str
    metadata: dict[str, Any]
    head: dict[str, Any] | None
    """The whole ``ModelMessage`` as JSON, on the first entry of it; None on the others."""
    reply: bool = False


class FermixHistory:
    """One fermix conversation as Pydantic AI's message history (I4).

    The arguments open the conversation as ``memory.conversation(...)`` does (``memory`` a
    :class:`~fermix.api.Memory` or a :class:`~fermix.remote.Client`): what the user says
    is that owner's, at that trust (``None``: fermix's default, a guest unless the config
    names the owner an operator; M2).
    """

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
    ) -> None:
        self.memory = memory
        self.conversation: ConversationSurface = memory.conversation(
            agent_id, channel, chat_id, thread_scope, owner_id=owner_id, trust=trust
        )
        self.notice: str | None = None
        """The notice of the last :meth:`messages` whose preflight compacted, else None."""
        self._ahead = FilesAhead(self.conversation)
        """The prompt files read with the window, for :meth:`instructions`."""

    def __repr__(self) -> str:
        return f"FermixHistory({self.conversation!r})"

    async def messages(self, *, preflight: bool = True) -> list[ModelMessage]:
        """The window as ``message_history``, oldest first; before a turn (``preflight``)
        fermix first compacts when the last turn's peak calls for it (K3). Once this
        history's :meth:`instructions` were asked for, the prompt files are read in the same
        worker call, for the run's first model request."""
        return await asyncio.to_thread(self._messages, preflight)

    def _messages(self, preflight: bool) -> list[ModelMessage]:
        if preflight:
            self.notice = self.conversation.preflight()
        window = model_messages(self.conversation.history())
        self._ahead.read()
        return window

    async def save(self, messages: Sequence[ModelMessage]) -> None:
        """Store a run's ``new_messages()``, each acknowledged once committed (A1); the
        last response is the turn's reply (``commit``).

        Everything is checked first: a message fermix would refuse is an
        :class:`~fermix.errors.InvalidInputError` and nothing of the batch is stored.
        """
        entries = _entries(messages)
        for entry in entries:
            _check(self.conversation.key, entry)
        await asyncio.to_thread(self._write, entries, _peak_prompt_tokens(messages))

    def _write(self, entries: Sequence[_Entry], peak: int | None) -> None:
        conv = self.conversation
        head_id = 0
        for entry in entries:
            own = {"message": entry.head} if entry.head is not None else {"part_of": head_id}
            metadata = {**entry.metadata, META_KEY: own}
            if entry.reply:
                usage = None if peak is None else {"prompt_tokens": peak}
                stored = conv.commit(entry.text, usage, metadata=metadata)
                self._ahead.drop()
            elif entry.role == "user":
                stored = conv.append_user(entry.text, metadata=metadata)
            else:
                sender = "assistant" if entry.role == "assistant" else ""
                stored = conv.append(entry.role, entry.text, sender=sender, metadata=metadata)
            if entry.head is not None:
                head_id = stored.id

    async def command(self, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command (``/compact``, ``/new``, ``/clear``;
        a guest's is refused, K4) and return the reply to send; None for anything else,
        which the host gives the agent."""
        return await asyncio.to_thread(self.conversation.handle_command, text)

    async def run(
        self, agent: Agent[Any, Any], user_prompt: str | None, **keywords: Any
    ) -> AgentRunResult[Any]:
        """One turn: :meth:`messages`, ``agent.run(user_prompt, message_history=...,
        **keywords)``, then :meth:`save` of its new messages; the run's result."""
        history = await self.messages()
        result: AgentRunResult[Any] = await agent.run(
            user_prompt, message_history=history, **keywords
        )
        await self.save(result.new_messages())
        return result

    def instructions(self, system: str) -> Callable[[RunContext[Any]], Awaitable[str]]:
        """``system`` and this conversation's memory, as :func:`memory_instructions` gives
        them, read afresh for every model request; the first request after
        :meth:`messages` takes the files that call read with the window, which saves the
        run a hop to a worker thread (:mod:`fermix.integrations.prompt_files`)."""
        ahead = self._ahead
        ahead.wanted = True

        async def instructions(context: RunContext[Any]) -> str:
            return await ahead.instructions(system)

        return instructions

    def toolset(self) -> FunctionToolset[Any]:
        """fermix's memory tools for this conversation (:func:`memory_toolset`)."""
        return memory_toolset(self.memory, self.conversation)


def memory_toolset(
    memory: MemorySurface[Any], caller: ConversationSurface | JobCaller
) -> FunctionToolset[Any]:
    """fermix's memory tools (T4) as a Pydantic AI toolset, each call run for ``caller`` (a
    conversation, or a scheduled job's :class:`~fermix.model.JobCaller`) by
    ``memory.tools.run`` in a worker thread. The schemas are fermix's own
    (``Tool.from_schema``); a refusal is the tool's return (``{"error": ...}``), which the
    model sees, as for any host."""
    tools: list[Tool[Any]] = []
    for schema in memory.tools.schemas():
        function = schema["function"]
        tools.append(
            Tool.from_schema(
                _tool_function(memory, caller, function["name"]),
                name=function["name"],
                description=function["description"],
                json_schema=function["parameters"],
                takes_ctx=True,
            )
        )
    return FunctionToolset(tools)


def _tool_function(
    memory: MemorySurface[Any], caller: ConversationSurface | JobCaller, name: str
) -> Callable[..., Awaitable[str]]:
    async def run_tool(context: RunContext[Any], **arguments: Any) -> str:
        call = {
            "id": context.tool_call_id or "",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
        return await asyncio.to_thread(memory.tools.run, call, caller)

    return run_tool


def memory_instructions(
    conversation: ConversationSurface, system: str
) -> Callable[[RunContext[Any]], Awaitable[str]]:
    """Instructions for ``Agent(instructions=...)`` or ``agent.run(instructions=...)``:
    ``system``, then the operator's standing rules and the fenced ``<memory-context>``
    block of ``conversation``'s USER.md and MEMORY.md, read afresh for every model request
    (P1, M11): the system messages fermix's ``compose`` puts before the history, in its
    order and with its labels, as one text."""
    files = FilesAhead(conversation)  # never read ahead: each request reads them

    async def instructions(context: RunContext[Any]) -> str:
        return await files.instructions(system)

    return instructions


# -- ModelMessages to fermix messages -------------------------------------------------------


def _entries(messages: Sequence[ModelMessage]) -> list[_Entry]:
    entries: list[_Entry] = []
    last_response = max(
        (i for i, m in enumerate(messages) if isinstance(m, ModelResponse)), default=-1
    )
    for index, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            entries.append(_response_entry(message, reply=index == last_response))
        elif isinstance(message, ModelRequest):
            request = dataclasses.replace(message, instructions=None)
            head: dict[str, Any] | None = _dump(request)
            for part in request.parts:
                entries.append(_part_entry(part, head))
                head = None
        else:
            raise InvalidInputError(f"not a Pydantic AI ModelMessage: {message!r:.80}")
    return entries


def _dump(message: ModelMessage) -> dict[str, Any]:
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python([message], mode="json")
    return dumped[0]


def _user_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(item for item in content if isinstance(item, str))


def _part_entry(part: ModelRequestPart, head: dict[str, Any] | None) -> _Entry:
    if isinstance(part, UserPromptPart):
        return _Entry("user", _user_text(part.content), {}, head)
    if isinstance(part, SystemPromptPart):
        return _Entry("system", part.content, {}, head)
    if isinstance(part, ToolReturnPart):
        text = part.model_response_str()
    elif isinstance(part, RetryPromptPart):
        text = part.model_response()
    else:
        text = ""
    call_id = getattr(part, "tool_call_id", "") or ""
    name = getattr(part, "tool_name", "") or ""
    return _Entry("tool", text, {"tool_call_id": call_id, "name": name}, head)


def _response_entry(response: ModelResponse, *, reply: bool) -> _Entry:
    text = "\n".join(p.content for p in response.parts if isinstance(p, TextPart) and p.content)
    calls = [
        {
            "id": p.tool_call_id,
            "type": "function",
            "function": {"name": p.tool_name, "arguments": p.args_as_json_str()},
        }
        for p in response.parts
        if isinstance(p, ToolCallPart)
    ]
    metadata: dict[str, Any] = {"tool_calls": calls} if calls else {}
    return _Entry("assistant", text, metadata, _dump(response), reply=reply)


def _check(key: ConversationKey, entry: _Entry) -> None:
    """Refuse an entry fermix would refuse, before anything of its batch is written."""
    own = {"message": entry.head} if entry.head is not None else {"part_of": 1}
    NewMessage(
        key, entry.role, entry.text, metadata={**entry.metadata, META_KEY: own}
    ).metadata_json()


def _peak_prompt_tokens(messages: Sequence[ModelMessage]) -> int | None:
    """The most input tokens of one model request of the run (K3), or None."""
    peaks = [m.usage.input_tokens for m in messages if isinstance(m, ModelResponse)]
    return max(peaks) if peaks and max(peaks) > 0 else None


# -- fermix messages to ModelMessages -------------------------------------------------------


class _Own(TypedDict, total=False):
    message: ModelMessage
    part_of: StrictInt


class _Metadata(TypedDict, total=False):
    pydantic_ai: _Own  # META_KEY: a class body names its keys literally


_METADATA: Final = TypeAdapter(_Metadata)
"""A saved message's metadata read straight from its JSON: its ``ModelMessage`` built in
one pass of pydantic-core, the other keys skipped (about 40 % less time than ``json.loads``
then ``validate_python``: a 40-message window is read before every run)."""


def model_messages(window: Sequence[Message]) -> list[ModelMessage]:
    """The ``ModelMessage``\\ s of a fermix window, oldest first: the ones saved, whole,
    and for a message fermix or another host wrote (or a part whose first message a
    compaction summarised), the parts of its litellm form."""
    out: list[ModelMessage] = []
    heads: set[int] = set()
    for message in window:
        own = _own(message) if META_KEY in message.metadata_json else None
        if own is not None and "message" in own:
            out.append(own["message"])
            heads.add(message.id)
            continue
        if own is not None and type(part_of := own.get("part_of")) is int and part_of in heads:
            continue
        out.append(_from_litellm(composer.history_message(message)))
    return out


def _own(message: Message) -> Mapping[str, Any] | None:
    """``message``'s ``pydantic_ai`` metadata, its ``ModelMessage`` read (None: none this
    version reads)."""
    try:
        own: Mapping[str, Any] | None = _METADATA.validate_json(message.metadata_json).get(META_KEY)
    except ValidationError:  # not as this version saves them: looked at key by key
        return _own_by_key(message)
    return own


def _own_by_key(message: Message) -> Mapping[str, Any] | None:
    """``message``'s ``pydantic_ai`` metadata when it is not what this version saves: its
    ``ModelMessage`` validated, or None (logged) when this version cannot read it."""
    own = message.metadata.get(META_KEY)
    if not isinstance(own, Mapping):
        return None
    if "message" not in own:
        return own
    try:
        (read,) = ModelMessagesTypeAdapter.validate_python([own["message"]])
    except ValidationError as exc:  # not one this version reads: its litellm form
        log.warning("message %d is read as its litellm form: %s", message.id, exc)
        return None
    return {**own, "message": read}


def _from_litellm(message: Mapping[str, Any]) -> ModelMessage:
    role, content = message["role"], str(message.get("content") or "")
    if role == "assistant":
        parts: list[ModelResponsePart] = [TextPart(content)] if content else []
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            parts.append(
                ToolCallPart(
                    function.get("name", ""),
                    function.get("arguments", ""),
                    tool_call_id=call.get("id", ""),
                )
            )
        return ModelResponse(parts=parts)
    if role == "tool":
        name = str(message.get("name") or "")
        call_id = str(message.get("tool_call_id") or "")
        return ModelRequest(parts=[ToolReturnPart(name, content, tool_call_id=call_id)])
    if role == "system":
        return ModelRequest(parts=[SystemPromptPart(content)])
    return ModelRequest(parts=[UserPromptPart(content)])
