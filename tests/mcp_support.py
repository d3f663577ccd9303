"""What the MCP tests share (N5): a served app, the SDK's clients, snapshots (no tests here).

The server is the real app (``create_app`` with the MCP endpoint mounted, as the memory
server serves it) under uvicorn on a free port, in a thread of the test process; its
readiness is an event set by uvicorn's own startup, not a poll.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from fermix.api import Memory
from fermix.server.http.app import create_app
from fermix.server.mcp_http import http_app
from fermix.storage.sqlite.connection import fetch_rows
from fermix.storage.sqlite.migrations import open_database

START_TIMEOUT_S = 30.0


class _Server(uvicorn.Server):
    """uvicorn that says when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextlib.contextmanager
def served(memory: Memory) -> Iterator[str]:
    """Serve ``memory``'s app with the MCP endpoint at /mcp; yields the endpoint's URL."""
    mcp_app, lifespan = http_app(memory)
    app = create_app(memory, mounts={"/mcp": mcp_app}, lifespans=[lifespan])
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="mcp-test-uvicorn", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(START_TIMEOUT_S) or not server.started:
            raise RuntimeError("the test server did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}/mcp/"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)


@contextlib.asynccontextmanager
async def http_client(
    url: str, secret: str | None, mode: str = "auto", **identity: str
) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP with a token and identity headers
    (``agent=``, ``owner=``, ``chat=``)."""
    headers = {f"X-Fermix-{name.title()}": value for name, value in identity.items()}
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60.0) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
    ):
        yield client


def stdio_params(home: Path, *args: str) -> StdioServerParameters:
    """``python -m fermix.cli --home HOME mcp ARGS`` as the SDK's stdio client starts it."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "fermix.cli", "--home", str(home), "mcp", *args],
        env=dict(os.environ),
    )


def snapshot(db_path: Path, *, skip: str | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (but the FTS shadows, the change log and the vectors,
    which the background embedder derives from the rows), read by a connection of this
    process; rows naming ``skip`` (a chat's scope) are left out."""
    conn = open_database(db_path)
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for (table,) in fetch_rows(
            conn,
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '%fts%'"
            " AND name NOT IN ('memory_changes', 'sqlite_sequence')"
            " AND name NOT LIKE '%vector%' AND name NOT LIKE 'embedding%'",
        ):
            rows = fetch_rows(conn, f"SELECT * FROM {table}")
            if skip is not None:
                rows = [r for r in rows if skip not in map(str, r)]
            out[table] = sorted(rows, key=repr)
        return out
    finally:
        conn.close()


def files_of(home: Path) -> list[tuple[str, bytes]]:
    """Every prompt file under the home's ``memory/`` folder, with its bytes."""
    folder = home / "memory"
    if not folder.exists():
        return []
    return sorted(
        (str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
        for p in folder.rglob("*")
    )
