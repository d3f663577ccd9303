"""``Client``: what a host uses of :class:`fermix.Memory`, served by the memory server (N1).

A host that runs several worker processes, or is not written in one process at all, talks
to the one server process that owns the home (``fermix supervisor start``) instead of
opening the home itself. The methods are the embedded ones, with their arguments and
return types, so the same host code runs against either::

    with fermix.Client("http://127.0.0.1:8787", token) as memory:
        conv = memory.conversation("assistant", "telegram", "12345", owner_id="alice")
        conv.append_user("I moved to Porto last month")
        messages = conv.compose(system="You are a helpful assistant.")
        ...
        conv.commit(reply, usage={"prompt_tokens": 1234})

The trust of what a host stores follows its token: a host token is a guest's whatever
owner it names, and only an operator token may ask for ``operator`` (M2, N2).
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self

from fermix import wire
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.errors import FermixError, InvalidInputError
from fermix.model import ConversationKey, JobCaller
from fermix.remote.admin import AdminCalls
from fermix.remote.conversation import RemoteConversation
from fermix.remote.transport import Transport


class Client(AdminCalls):
    """The memory server at ``url`` (``http://127.0.0.1:PORT`` or ``http+unix:///PATH``),
    with a bearer ``token`` (``fermix token create``).

    ``timeout`` bounds each request's wait for an answer (a forced review may need more);
    ``retries`` is how often a request that did not get through, or was answered 503, is
    tried again. Thread-safe: one client (one pool of connections) serves every thread.
    """

    _http: Transport

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 3):
        self.url = url
        self._http = Transport(url, token, timeout=timeout, retries=retries)
        self.tools = RemoteTools(self._http)
        """The agent's memory tools: ``schemas()`` and ``run(tool_call, caller)`` (T4)."""

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- lifecycle: the server owns the memory; the client owns only its connections ------

    def start(self) -> Self:
        """Nothing to start (the server runs the memory); here so a host's code is the
        same for a ``Memory`` and a ``Client``."""
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Close the pooled connections. The server and its memory go on running."""
        self._http.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """The server's ``/v1/health`` answer (its version); raises when it does not answer."""
        data: dict[str, Any] = self._http.request("GET", "/v1/health")
        return data

    # -- conversations -----------------------------------------------------------------

    def conversation(
        self,
        agent_id: str,
        channel: str,
        chat_id: str,
        thread_scope: str = "",
        *,
        owner_id: str = "",
        trust: str | None = None,
    ) -> RemoteConversation:
        """A handle on one conversation. One request: the server checks the token may act
        for ``agent_id`` and says which trust it grants (a host token's: ``guest``)."""
        body = {
            "agent_id": agent_id,
            "channel": channel,
            "chat_id": chat_id,
            "thread_scope": thread_scope,
            "owner_id": owner_id,
            "trust": trust,
        }
        data = self._http.request("POST", "/v1/conversations/open", json=body, idempotent=True)
        key = ConversationKey(
            data["agent_id"], data["channel"], data["chat_id"], data["thread_scope"]
        )
        return RemoteConversation(
            self._http, data["handle"], key, owner_id=data["owner_id"], trust=data["trust"]
        )

    def review(self, conv: RemoteConversation, *, force: bool = True) -> ReviewResult:
        """Review ``conv`` now and wait for the result (``force``: past the time gates)."""
        data = self._http.request("POST", f"{_path(conv)}/review", json={"force": force})
        return wire.from_json(ReviewResult, data)

    def compact(self, conv: RemoteConversation, *, force: bool = False) -> CompactionResult:
        """Compact ``conv`` now if due (``force``: whatever its peak) and wait for it."""
        data = self._http.request("POST", f"{_path(conv)}/compact", json={"force": force})
        return wire.from_json(CompactionResult, data)

    def handle_command(self, conv: RemoteConversation, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command and return the reply to send (K4)."""
        return conv.handle_command(text)


class RemoteTools:
    """The memory tools, run by the server for a conversation or a job's run (T4)."""

    def __init__(self, http: Transport) -> None:
        self._http = http

    def schemas(self) -> list[dict[str, Any]]:
        """The tool definitions, as ``tools=`` for litellm.completion (T4)."""
        tools: list[dict[str, Any]] = self._http.request("GET", "/v1/tools")["tools"]
        return tools

    def run(self, tool_call: Any, caller: RemoteConversation | JobCaller) -> str:
        """Run one tool call for ``caller`` and return the tool message content (JSON).

        Never raises, as the embedded one: a refusal, and a server that cannot be
        reached, come back as ``{"error": ...}`` for the model to read.
        """
        try:
            if isinstance(caller, JobCaller):
                if caller.run_id is None:
                    raise FermixError("a job's caller over HTTP needs its run (job_caller)")
                path = f"/v1/runs/{caller.run_id}/tools/run"
            elif isinstance(caller, RemoteConversation):
                path = f"{_path(caller)}/tools/run"
            else:
                raise FermixError("the caller must be a conversation or a JobCaller")
            body = {"tool_call": tool_call_json(tool_call)}
            content: str = self._http.request("POST", path, json=body)["content"]
        except FermixError as exc:
            return json.dumps({"error": str(exc)}, ensure_ascii=False)
        return content


def tool_call_json(tool_call: Any) -> dict[str, Any]:
    """An OpenAI-format tool call as a dict: a dict as it is, litellm's object dumped."""
    if isinstance(tool_call, dict):
        return tool_call
    dump = getattr(tool_call, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, dict):
            return dumped
    function = getattr(tool_call, "function", None)
    return {
        "id": getattr(tool_call, "id", None),
        "type": "function",
        "function": {
            "name": getattr(function, "name", None),
            "arguments": getattr(function, "arguments", None),
        },
    }


def _path(conv: RemoteConversation) -> str:
    if not isinstance(conv, RemoteConversation):
        raise InvalidInputError(
            "a Client works on the conversations it opened (client.conversation)"
        )
    return f"/v1/conversations/{conv.handle}"
