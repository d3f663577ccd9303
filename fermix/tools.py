"""The agent's memory tools: schemas in the OpenAI / litellm format and one dispatcher (T1-T4).

``memory_store`` keeps a small fact for the current conversation (conversation scope, never
rendered into the prompt files); ``memory_recall`` looks a key up or searches memories and/or
history within the scopes the caller is entitled to; ``memory_sources_list`` lists the
sources the caller may see. A scheduled job's run is a :class:`~fermix.model.JobCaller`
(``Memory.job_caller(run_id)``): it sees and writes only its own job-scoped memories, and no
history (SC1, T2); one whose memory source or run the database does not vouch for is
refused, naming the source, and nothing is written (M9).

:meth:`MemoryTools.run` never raises into the host: bad arguments, unknown tools and
storage errors come back as ``{"error": ...}`` in the tool message content. The schemas
and argument checks are :mod:`fermix.core.tool_calls`; the work is
:mod:`fermix.runtime.recall`.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, overload

from fermix.core import tool_calls
from fermix.core.tool_calls import SCHEMAS, ToolError
from fermix.errors import FermixError
from fermix.model import ConversationKey, JobCaller
from fermix.runtime import recall

if TYPE_CHECKING:
    from fermix.runtime.writer import Writer
    from fermix.storage import Storage

__all__ = ["SCHEMAS", "Caller", "JobCaller", "MemoryTools", "ToolError"]

log = logging.getLogger(__name__)


class ToolRunner(Protocol):
    """What the tools need of the runtime: to run a checked call for a caller."""

    def run_tool(self, call: tool_calls.ToolCall, caller: recall.Caller) -> dict[str, Any]: ...


class ConversationLike(Protocol):
    """A conversation calling the tools (a :class:`~fermix.conversation.Conversation`)."""

    @property
    def key(self) -> ConversationKey: ...

    @property
    def owner_id(self) -> str: ...


Caller = ConversationLike | JobCaller


@dataclass(frozen=True)
class _Storage:
    """A database and its writer, running tool calls without a runtime."""

    db: Storage
    writer: Writer

    def run_tool(self, call: tool_calls.ToolCall, caller: recall.Caller) -> dict[str, Any]:
        return recall.run(self.db, self.writer, call, caller)


class MemoryTools:
    """The memory tools over one database and its writer.

    ``MemoryTools(db, writer)``, or ``MemoryTools(runtime)`` for the process's runtime,
    which refuses a call while it is not running (so the tools may be made before it
    starts).
    """

    @overload
    def __init__(self, runtime: ToolRunner, /) -> None: ...

    @overload
    def __init__(self, db: Storage, writer: Writer, /) -> None: ...

    def __init__(self, source: ToolRunner | Storage, writer: Writer | None = None, /) -> None:
        self._runner = (
            cast("ToolRunner", source)
            if writer is None
            else _Storage(cast("Storage", source), writer)
        )

    @staticmethod
    def schemas() -> list[dict[str, Any]]:
        """The tool definitions, as ``tools=`` for litellm.completion (T4); a fresh copy."""
        return copy.deepcopy(SCHEMAS)

    def run(self, tool_call: Any, caller: Caller) -> str:
        """Run one tool call for ``caller`` and return the tool message content (JSON).

        ``tool_call`` is an OpenAI-format dict (``{"function": {"name", "arguments"}}``) or
        the equivalent litellm object; ``caller`` is a conversation or a
        :class:`~fermix.model.JobCaller`. Never raises: a refusal is ``{"error": ...}``.
        """
        try:
            call = tool_calls.parse(tool_call)
            result = self._runner.run_tool(call, _plain(caller))
        except FermixError as exc:
            log.info("tool call refused: %s", exc)
            return json.dumps({"error": str(exc)}, ensure_ascii=False)
        return json.dumps(result, ensure_ascii=False)


def _plain(caller: Caller) -> recall.Caller:
    """The caller as plain values for the runtime."""
    if isinstance(caller, JobCaller):
        return caller
    key, owner_id = getattr(caller, "key", None), getattr(caller, "owner_id", None)
    if not isinstance(key, ConversationKey) or not isinstance(owner_id, str):
        raise ToolError("the caller must be a conversation or a JobCaller")
    return recall.ConversationCaller(key, owner_id)
