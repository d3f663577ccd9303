"""The memory server process: one ``Memory``, its HTTP API and MCP endpoint (N1, N2, N5).

MCP (streamable HTTP, stateless, JSON answers) is mounted at ``/mcp/`` beside ``/v1``,
with the same bearer tokens.

:func:`serve` runs in the process ``fermix server start`` made (or in the foreground):
it opens the home's ``Memory`` (the database, the write path, the supervised actor tree,
the review sweep), serves the HTTP API with uvicorn on 127.0.0.1 (or a Unix socket),
starts Litestream when a replica is configured (N9; refused when the memory is in
PostgreSQL, B1), and writes ``server.json`` (url, pid, start time; owner-only) for clients
and ``fermix server status``, whose document names the store. SIGTERM or SIGINT
stops it gracefully: uvicorn stops taking requests and finishes those under way, then the
memory closes (queued writes finish first) and the files are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
import uvicorn

from fermix.config import Config, ServerConfig, load_config
from fermix.errors import ServiceError
from fermix.home import Home, create_private_file, make_private_dir
from fermix.server import service
from fermix.server.http.app import create_app
from fermix.server.http.metrics import Metrics
from fermix.server.mcp_http import http_app
from fermix.server.replica import Replica, refuse_postgres
from fermix.storage.opening import describe

log = logging.getLogger(__name__)

SERVER_FILE = "server.json"
WORKER_THREADS = 64
"""Requests served at once on worker threads (each waits for its commit or its actor)."""


@dataclass(frozen=True)
class Listen:
    """Where the server listens: a TCP host and port, or a Unix socket."""

    host: str
    port: int
    socket: str | None = None

    @classmethod
    def of(
        cls,
        config: ServerConfig,
        *,
        host: str | None = None,
        port: int | None = None,
        socket: str | None = None,
        allow_public: bool = False,
    ) -> Listen:
        """The address from config, overridden by the command line; refuses a public
        address without TLS in front unless allowed (N2)."""
        listen = cls(
            host if host is not None else config.host,
            port if port is not None else config.port,
            socket if socket is not None else config.socket,
        )
        if listen.socket is None and not is_loopback(listen.host):
            if not (allow_public or config.allow_public_bind):
                raise ServiceError(
                    f"refusing to listen on {listen.host}: it is not a loopback address, and"
                    " bearer tokens and memories would cross the network unencrypted. Put a"
                    " TLS proxy in front and bind 127.0.0.1 behind it, or use a Unix socket;"
                    " if TLS is already in front, pass --allow-public-bind (or set"
                    " [fermix_core.server] allow_public_bind = true)"
                )
            log.warning("listening on non-loopback %s: TLS must be in front", listen.host)
        return listen


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_file(home: Home) -> Path:
    """``server.json`` of ``home``: where a running server answers."""
    return home.root / SERVER_FILE


def read_server_file(home: Home) -> dict[str, Any] | None:
    """The running server's ``server.json``, or None when there is none."""
    try:
        data: dict[str, Any] = json.loads(server_file(home).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return data


def _write_server_file(home: Home, document: dict[str, Any]) -> None:
    path = server_file(home)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    create_private_file(temp)
    temp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(temp, path)


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_started`` once its sockets listen."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[_Server], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started(self)


def _bound_url(server: uvicorn.Server, listen: Listen) -> str:
    if listen.socket is not None:
        return f"http+unix://{listen.socket}"
    for running in getattr(server, "servers", ()):
        for sock in running.sockets:
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            return f"http://{shown}:{port}"
    return f"http://{listen.host}:{listen.port}"


def serve(
    home: Home,
    *,
    announce: Callable[[], None] | None = None,
    host: str | None = None,
    port: int | None = None,
    socket: str | None = None,
    allow_public: bool = False,
) -> int:
    """Run the server in this process until SIGTERM or SIGINT; return an exit code."""
    from fermix.api import Memory

    config: Config = load_config(home.config_path)
    listen = Listen.of(
        config.server, host=host, port=port, socket=socket, allow_public=allow_public
    )
    if config.replica.url is not None:  # before anything starts: no Litestream on PostgreSQL
        refuse_postgres(config, "replication ([fermix_core.replica] url)")
    paths = service.ServicePaths.of(home)
    make_private_dir(home.root)
    service.claim_pid_file(paths)
    stopping = threading.Event()
    # uvicorn restores the handlers it found when it stops and raises the signal it caught
    # again: these are what it finds, so that ends here instead of killing the process
    # before the memory is closed.
    previous = {
        sig: signal.signal(sig, lambda *_: stopping.set())
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    started_at = time.time()
    storage = describe(home, config)  # a PostgreSQL URL without its password
    metrics = Metrics()
    memory = Memory(home, config=config)
    status_server: service.StatusServer | None = None
    replica: Replica | None = None
    address: dict[str, str] = {}
    try:
        memory.start()
        replica = _start_replica(home, config)

        def status() -> dict[str, Any]:
            return {
                "pid": os.getpid(),
                "started_at": started_at,
                "home": str(home.root),
                "storage": storage,
                "url": address.get("url"),
                **memory.stats(),
                "failure": None if memory.failure is None else str(memory.failure),
                "replica": None
                if replica is None
                else {"url": config.replica.url, "running": replica.running},
                **metrics.snapshot(),
            }

        @contextlib.asynccontextmanager
        async def watch() -> AsyncIterator[None]:
            anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
            task = asyncio.create_task(_watch(memory, server))
            try:
                yield
            finally:
                task.cancel()

        mcp_app, mcp_lifespan = http_app(memory)
        app = create_app(
            memory,
            metrics=metrics,
            status=status,
            mounts={"/mcp": mcp_app},
            lifespans=[watch, mcp_lifespan],
        )

        def started(server: _Server) -> None:
            nonlocal status_server
            address["url"] = _bound_url(server, listen)
            _write_server_file(
                home,
                {"url": address["url"], "pid": os.getpid(), "started_at": started_at},
            )
            status_server = service.StatusServer(paths.socket, status)
            log.info("memory server listening on %s (pid %d)", address["url"], os.getpid())
            if announce is not None:
                announce()

        server = _Server(
            uvicorn.Config(
                app,
                host=listen.host,
                port=listen.port,
                uds=listen.socket,
                log_config=None,
                access_log=False,
                server_header=False,
                lifespan="on",
                backlog=2048,
                timeout_graceful_shutdown=10,
            ),
            started,
        )
        server.run()
        if not server.started:
            raise ServiceError(f"the server could not listen on {_bound_url(server, listen)}")
        return 1 if memory.failure is not None else 0
    finally:
        log.info("memory server stopping: finishing in-flight writes")
        memory.close()
        if replica is not None:
            replica.stop()  # after the memory closed: its last writes are shipped too
        if status_server is not None:
            status_server.close()
        if read_server_file(home) is not None:
            server_file(home).unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if service.read_pid(paths) == os.getpid():
            paths.pid.unlink(missing_ok=True)


async def _watch(memory: Any, server: uvicorn.Server) -> None:
    """Stop serving when the actor tree gave up: every call would fail from then on."""
    while not server.should_exit:
        await asyncio.sleep(service.WATCH_S)
        if memory.failure is not None:
            log.error("stopping: the actor tree gave up: %s", memory.failure)
            server.should_exit = True


def _start_replica(home: Home, config: Config) -> Replica | None:
    """Litestream for the home's database when ``[fermix_core.replica] url`` is set (N9)."""
    return Replica.start(home, config.replica)
