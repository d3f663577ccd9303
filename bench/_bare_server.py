"""The bare baseline of ``bench/server.py``: the server stack alone, one raw insert a request.

Usage: ``python bench/_bare_server.py DB_PATH`` (prints ``url http://127.0.0.1:PORT`` once
it listens, then serves until SIGTERM or SIGINT).

It is what the memory server's stack can do at best on this machine: the same framework
(FastAPI), the same server and settings as ``fermix.server.serving`` (uvicorn with its
``auto`` loop and HTTP parser, uvloop and httptools when installed; no access log, no server
header, backlog 2048), the same route and request body as the memory server's append, and
one ``BEGIN IMMEDIATE; INSERT; COMMIT`` of the message row per request, with apsw, into a
database opened by ``fermix.storage.open_database`` (fermix's schema, triggers, indexes and
connection settings). The endpoint is ``async def``: the insert runs on the event loop
itself, with no hop to a worker thread. It checks no token, decodes no handle (the handle
is stored as the chat id) and answers the new row's id, not the whole message.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from fermix.storage.sqlite.migrations import open_database

_INSERT = (
    "INSERT INTO messages (agent_id, owner_id, channel, chat_id, thread_scope, sender, role,"
    " kind, content, metadata_json, created_at, client_key, trust)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


class AppendBody(BaseModel):
    """The memory server's append body, the fields the benchmark sends."""

    role: str
    text: str
    sender: str = ""
    kind: str = "chat"
    client_key: str | None = None


class Appended(BaseModel):
    id: int


def create_app(db_path: Path) -> FastAPI:
    """The bare app over the database at ``db_path``."""
    conn = open_database(db_path)
    app = FastAPI(docs_url=None, redoc_url=None)

    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/conversations/{handle}/messages", status_code=201)
    async def append(handle: str, body: AppendBody) -> Appended:
        row = (
            *("bench", "alice", "http", handle, ""),
            *(body.sender, body.role, body.kind, body.text, "{}"),
            time.time_ns() // 1_000_000,
            body.client_key,
            "guest",
        )
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_INSERT, row)
        conn.execute("COMMIT")
        return Appended(id=conn.last_insert_rowid())

    return app


def main(argv: list[str]) -> int:
    app = create_app(Path(argv[0]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
        backlog=2048,
        timeout_graceful_shutdown=10,
    )
    print(f"url http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
