"""``RemoteConversation``: a :class:`~fermix.conversation.Conversation` over HTTP (N1, N3).

Every method has the embedded one's name, parameters, defaults and return type, so a host
written against ``Conversation`` runs unchanged against the memory server: each is one
request to ``/v1/conversations/{handle}/...`` and the answer is read back into fermix's
own types (:mod:`fermix.wire`).

Appends and commits always carry a client key: the caller's, or a fresh uuid4 made here.
The transport may then send one again after a lost answer (the connection broke, the
server was restarting) and the server still stores it once (N3).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fermix import wire
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import ConversationKey, ConversationState, ForgetReport, Message

if TYPE_CHECKING:
    from fermix.remote.transport import Transport


class RemoteConversation:
    """One conversation of a host, served by the memory server."""

    def __init__(
        self, http: Transport, handle: str, key: ConversationKey, *, owner_id: str, trust: str
    ) -> None:
        self._http = http
        self.handle = handle
        """The server's name for this conversation (in its URLs)."""
        self.key = key
        self.owner_id = owner_id
        self.trust = trust
        """The trust the server granted (a host token's is always ``guest``, N2)."""
        self._path = f"/v1/conversations/{handle}"

    def __repr__(self) -> str:
        return f"RemoteConversation({self.key!r}, owner_id={self.owner_id!r}, trust={self.trust!r})"

    def append(
        self,
        role: str,
        text: str,
        *,
        sender: str = "",
        kind: str = "chat",
        metadata: Mapping[str, Any] | None = None,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store a message; returns once the server committed it (A1).

        As :meth:`fermix.conversation.Conversation.append`; ``client_key`` defaults to a
        fresh one, so a retried request never doubles history (N3).
        """
        body = {
            "role": role,
            "text": text,
            "sender": sender,
            "kind": kind,
            "metadata": dict(metadata or {}),
            "peak_prompt_tokens": peak_prompt_tokens,
            "owner_id": owner_id,
            "trust": trust,
            "client_key": client_key if client_key is not None else _new_key(),
        }
        data = self._http.request("POST", f"{self._path}/messages", json=body, idempotent=True)
        return wire.message_from_json(data)

    def append_user(
        self,
        text: str,
        *,
        sender: str = "",
        metadata: Mapping[str, Any] | None = None,
        owner_id: str | None = None,
        trust: str | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store what a user said, recording who said it and with what trust (M1)."""
        author = self.owner_id if owner_id is None else owner_id
        return self.append(
            "user",
            text,
            sender=sender or author,
            metadata=metadata,
            owner_id=owner_id,
            trust=trust,
            client_key=client_key,
        )

    def append_assistant(
        self,
        text: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Store what the assistant said (``commit`` also dispatches post-delivery work)."""
        return self.append(
            "assistant", text, sender="assistant", metadata=metadata, client_key=client_key
        )

    def history(self, limit: int | None = None) -> list[Message]:
        """The conversation's window, oldest first (the newest ``limit`` messages if given)."""
        if limit is not None and (isinstance(limit, bool) or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, not {limit!r}")
        data = self._http.request("GET", f"{self._path}/messages", params={"limit": limit})
        return [wire.message_from_json(item) for item in data["messages"]]

    def memory_files(self) -> tuple[str, str]:
        """The current USER.md and MEMORY.md of this agent and owner."""
        data = self._http.request("GET", f"{self._path}/files")
        return data["user_md"], data["memory_md"]

    def compose(self, system: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The litellm messages for the next model call (P1, T5)."""
        data = self._http.request(
            "POST",
            f"{self._path}/compose",
            json={"system": system, "limit": limit},
            idempotent=True,  # it only reads: sending it again is harmless
        )
        messages: list[dict[str, Any]] = data["messages"]
        return messages

    def preflight(self) -> str | None:
        """Before a turn: compact if the previous turn's peak calls for it (K3); the
        notice to send when it did, else None."""
        notice: str | None = self._http.request("POST", f"{self._path}/preflight")["notice"]
        return notice

    def handle_command(self, text: str) -> str | None:
        """Run ``text`` if it is a fermix chat command and return the reply to send (K4)."""
        reply: str | None = self._http.request(
            "POST", f"{self._path}/command", json={"text": text}
        )["reply"]
        return reply

    def state(self) -> ConversationState | None:
        """The conversation's stored state, or None when nothing is stored yet."""
        try:
            data = self._http.request("GET", f"{self._path}/state")
        except NotFoundError:
            return None
        return wire.state_from_json(data)

    def forget(self) -> ForgetReport:
        """Erase this conversation (operator token; F2)."""
        return wire.from_json(ForgetReport, self._http.request("DELETE", self._path))

    def reload(self) -> None:
        """Make the server re-read the window from SQLite."""
        self._http.request("POST", f"{self._path}/reload")

    def commit(
        self,
        reply: str,
        usage: Mapping[str, Any] | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        client_key: str | None = None,
    ) -> Message:
        """Write the turn's reply and its peak prompt tokens, then have the server
        dispatch the post-delivery work. ``usage`` is a dict or litellm's usage object."""
        tokens = prompt_tokens(usage)
        body = {
            "reply": reply,
            "usage": None if tokens is None else {"prompt_tokens": tokens},
            "metadata": dict(metadata or {}),
            "client_key": client_key if client_key is not None else _new_key(),
        }
        data = self._http.request("POST", f"{self._path}/commit", json=body, idempotent=True)
        return wire.message_from_json(data)


def prompt_tokens(usage: Mapping[str, Any] | Any | None) -> int | None:
    """``prompt_tokens`` of a usage dict or object, checked as the embedded commit does."""
    if usage is None:
        return None
    value = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    if value is None:
        value = getattr(usage, "prompt_tokens", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"usage.prompt_tokens must be a non-negative integer: {value!r}")
    return value


def _new_key() -> str:
    return uuid.uuid4().hex
