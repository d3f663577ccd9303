"""Request bodies over the limit are refused before they are read whole (N2, N8).

A pure ASGI middleware: a declared ``Content-Length`` over the limit is a 413 at once, with
nothing read; a body sent without one (chunked) is counted as it arrives and refused with a
413 as soon as it passes the limit, so a client cannot make the server buffer more than
``max_body_bytes`` of one request. (Starlette 1.x has a limit of its own, but it answers a
declared length in plain text, replacing the JSON error every other answer has.)
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fermix.server.http.errors import error_body

LIMIT_SCOPE_KEY = "fermix.max_body_bytes"
"""Where the limit is left in the request's scope, for the error handler's message."""


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a request's body passes the limit: an HTTP error, so
    the framework hands it to the app's JSON error handler (a 413 naming ``body``)."""

    def __init__(self) -> None:
        super().__init__(413, "request body over the limit")


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a JSON 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[LIMIT_SCOPE_KEY] = self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _too_large(send, self.max_bytes)
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await _too_large(send, self.max_bytes)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _too_large(send: Send, max_bytes: int) -> None:
    body: dict[str, Any] = error_body(
        413, f"request body over the limit of {max_bytes} bytes", "body"
    )
    payload = json.dumps(body).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
