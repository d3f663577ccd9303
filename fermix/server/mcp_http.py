"""The MCP endpoint of the memory server: streamable HTTP, a bearer token per request (N5).

:func:`http_app` gives the ASGI app the server mounts at ``/mcp`` (clients use
``<server>/mcp/``; ``/mcp`` answers a same-origin redirect the SDK's client follows) and
the lifespan that runs the SDK's session manager. It is stateless with JSON answers: every
POST is a whole exchange, so nothing is kept between requests, any number of clients and
workers can share it, and each request carries its own identity.

Every request needs ``Authorization: Bearer <secret>`` (``fermix token create``), checked
with ``memory.tokens.authenticate``: a 401 otherwise. The identity comes from headers:

- ``X-Fermix-Agent``: one of the token's agents (a 403 otherwise); it may be left out
  when the token lists exactly one agent;
- ``X-Fermix-Owner``: the owner the client acts for (default ``""``, the agent's default
  owner);
- ``X-Fermix-Chat``: the chat of its conversation (default the owner, else ``default``).

A host token is a guest's, whatever owner it names; an operator token gets the config's
trust of the owner (as the HTTP API's ``trust_for``). Header values are UTF-8 (a bad
value is a 422). Errors are the HTTP API's JSON ``{"error": {"type", "message", "field"}}``.

The identity reaches the handlers in the request's ASGI scope (under
:data:`~fermix.server.mcp.IDENTITY_SCOPE_KEY`): the SDK hands each handler the Starlette
request of its own message, so two requests in flight at once can never see each other's
identity, which a context variable would only promise as long as the SDK runs the handler
in a task copied from the request's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio.to_thread
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fermix import validate
from fermix.api import Memory
from fermix.errors import InvalidInputError
from fermix.model import ApiToken
from fermix.server.http.errors import error_response
from fermix.server.mcp import IDENTITY_SCOPE_KEY, Identity, build_server

AGENT_HEADER = "x-fermix-agent"
OWNER_HEADER = "x-fermix-owner"
CHAT_HEADER = "x-fermix-chat"


class _Refused(Exception):
    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


class McpGate:
    """Authenticates a request, derives its :class:`Identity`, then hands it to the SDK."""

    def __init__(self, app: ASGIApp, memory: Memory) -> None:
        self.app = app
        self.memory = memory

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            identity = await self._identity(Headers(scope=scope))
        except _Refused as refused:
            headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
            response = error_response(
                refused.status, refused.message, field=refused.field, headers=headers
            )
            await response(scope, receive, send)
            return
        await self.app({**scope, IDENTITY_SCOPE_KEY: identity}, receive, send)

    async def _identity(self, headers: Headers) -> Identity:
        token = await self._token(headers.get("authorization"))
        agent = _header(headers, AGENT_HEADER)
        if agent is None:
            if len(token.agents) != 1:
                raise _Refused(
                    422,
                    "name the agent in X-Fermix-Agent (this token acts for several)",
                    f"header.{AGENT_HEADER}",
                )
            agent = token.agents[0]
        if not token.may_act_for(agent):
            raise _Refused(
                403, f"this token may not act for agent {agent[:80]!r}", f"header.{AGENT_HEADER}"
            )
        owner = _header(headers, OWNER_HEADER) or ""
        try:
            validate.identifier("owner_id", owner, allow_empty=True)
        except InvalidInputError as exc:
            raise _Refused(422, str(exc), f"header.{OWNER_HEADER}") from None
        chat = _header(headers, CHAT_HEADER)
        try:
            validate.identifier("chat_id", chat or owner or "default")
        except InvalidInputError as exc:
            if chat:
                raise _Refused(422, str(exc), f"header.{CHAT_HEADER}") from None
            message = f"the owner is no chat id ({exc}): name the chat in X-Fermix-Chat"
            raise _Refused(422, message, f"header.{OWNER_HEADER}") from None
        trust = self.memory.config.trust_of(owner) if token.operator else "guest"
        return Identity(agent, owner, chat or "", trust=trust, agents=token.agents)

    async def _token(self, header: str | None) -> ApiToken:
        field = "header.authorization"
        if header is None:
            raise _Refused(401, "missing Authorization: Bearer <token>", field)
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise _Refused(401, "Authorization must be 'Bearer <token>'", field)
        tokens = self.memory.tokens
        token = await anyio.to_thread.run_sync(tokens.authenticate, secret.strip())
        if token is None:
            raise _Refused(401, "unknown or revoked token", field)
        return token


def _header(headers: Headers, name: str) -> str | None:
    """A header's value as UTF-8 text (Starlette decodes headers as latin-1), or None."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise _Refused(422, f"{name} is not UTF-8 text", f"header.{name}") from None


def http_app(
    memory: Memory,
) -> tuple[ASGIApp, Callable[[], AbstractAsyncContextManager[Any]]]:
    """The MCP endpoint over a started ``memory``, and the lifespan to run while it serves.

    Mount the app (``create_app(memory, mounts={"/mcp": app}, lifespans=[lifespan])``);
    the lifespan runs the SDK's session manager, which may run once: make a new pair for
    another app.
    """
    manager = StreamableHTTPSessionManager(
        app=build_server(memory),
        json_response=True,
        stateless=True,
        # Not the SDK's DNS-rebinding guard (a Host allow-list): every request needs a
        # bearer token, which a page rebinding a name to this address does not have, and
        # the server may sit behind a TLS proxy under another host name.
        security_settings=None,
        max_request_body_size=memory.config.server.max_body_bytes,
    )

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await manager.handle_request(scope, receive, send)

    return McpGate(endpoint, memory), manager.run
