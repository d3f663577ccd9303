"""The memory server's ASGI app: ``/v1`` routes, the OpenAPI document, errors as JSON (N1).

FastAPI makes the OpenAPI document (``/openapi.json``) from the routes' typed models, and
validates every request against them before a route runs. Routes that call the memory are
plain ``def`` functions: FastAPI runs them on its worker threads, since a write waits for
its commit. One ``Memory`` serves every request: one process owns the actor tree and the
database, and any number of host processes, in any language, talk to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from fermix.api import Memory
from fermix.server.http import admin, console, errors, owners, scrape, turn
from fermix.server.http.batching import AppendBatcher
from fermix.server.http.limits import BodyLimit
from fermix.server.http.metrics import Metrics
from fermix.server.http.sessions import Sessions

API_PREFIX = "/v1"


class Health(BaseModel):
    """``GET /v1/health``: the server answers (no token needed, nothing about the data)."""

    status: str
    version: str


class _CountRequests:
    """Counts requests for the status rates (N7); a pure ASGI middleware, cheap per call."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.metrics.count("requests")
        await self.app(scope, receive, send)


def create_app(
    memory: Memory,
    *,
    metrics: Metrics | None = None,
    max_body_bytes: int | None = None,
    status: Callable[[], dict[str, Any]] | None = None,
    mounts: dict[str, ASGIApp] | None = None,
    lifespans: list[Callable[[], contextlib.AbstractAsyncContextManager[Any]]] | None = None,
    console_sessions: Sessions | None = None,
) -> FastAPI:
    """The app over a started ``memory``.

    ``status`` returns the status document (``GET /v1/status``, operator only);
    ``mounts`` are other ASGI apps by path (the MCP endpoint); ``lifespans`` are context
    managers the app enters while it serves (the MCP session manager);
    ``console_sessions`` keeps the operator console's sign-ins (W2; a fresh store unless
    given, as a test of expiry gives one on its own clock).
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for enter in lifespans or ():
                await stack.enter_async_context(enter())
            yield

    app = FastAPI(
        title="fermix memory server",
        version=_version(),
        description=(
            "Durable conversation memory and long-term user facts for chat-bot hosts."
            " Every route under /v1 but /v1/health needs 'Authorization: Bearer <token>'"
            " (fermix token create)."
        ),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.memory = memory
    app.state.metrics = metrics if metrics is not None else Metrics()
    app.state.status = status
    app.state.appends = AppendBatcher(memory)
    app.state.console_sessions = console_sessions if console_sessions is not None else Sessions()
    errors.install(app)

    @app.get(f"{API_PREFIX}/health", response_model=Health, tags=["server"])
    async def health() -> Health:
        """Whether the server answers. Needs no token and says nothing of the data."""
        return Health(status="ok", version=_version())

    limit = max_body_bytes if max_body_bytes is not None else memory.config.server.max_body_bytes
    app.include_router(turn.router, prefix=API_PREFIX)
    app.include_router(admin.router, prefix=API_PREFIX)
    app.include_router(owners.router, prefix=API_PREFIX)
    app.include_router(console.router)
    app.include_router(scrape.router)  # /metrics, where scrapers look by default (O1)
    for path, mounted in (mounts or {}).items():
        app.mount(path, mounted)
    app.add_middleware(BodyLimit, max_bytes=limit)
    app.add_middleware(console.ConsoleHeaders)
    app.add_middleware(_CountRequests, metrics=app.state.metrics)
    return app


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fermix")
    except metadata.PackageNotFoundError:
        return "unknown"
