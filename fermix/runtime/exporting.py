"""An owner's data as one JSON document (F6, GDPR article 20): ``export_owner``.

The document (``format`` :data:`FORMAT`, ``version`` :data:`VERSION`; described field by
field in ``docs/forgetting.md``) holds what fermix keeps of one owner, for one agent or every
agent:

- ``conversations``: the conversations the owner owns, their state as stored;
- ``messages``: every message the owner is the author of, oldest first (a group chat's
  other speakers' messages are theirs, not in it);
- ``memory_rows``: the owner's rows of every scope, archived ones too, with their provenance
  (source, conversation, message);
- ``prompt_files``: the current USER.md and MEMORY.md of each agent, as rendered for them;
- ``jobs`` and ``runs``: the owner's scheduled jobs and every run of them.

It is written as it is read: messages page by page (:data:`PAGE`), each page one read of
the store, so an owner with a million messages exports in bounded memory. Each page sees the
store as it is when read; a message appended meanwhile may or may not be in it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import IO, Any

from fermix import validate, wire
from fermix.clock import now_ms
from fermix.core.render import FILES
from fermix.errors import NotFoundError
from fermix.storage import Storage

FORMAT = "fermix-owner-export"
VERSION = 1
PAGE = 1000
"""Messages read (and held) at once."""


def check_owner(storage: Storage, owner_id: str, agent_id: str | None) -> None:
    """Refuse an empty id, or an owner of whom nothing is stored (F8), before anything is
    written."""
    validate.identifier("owner_id", owner_id)
    if agent_id is not None:
        validate.identifier("agent_id", agent_id)
    with storage.read() as reads:
        known = reads.owner_known(owner_id, agent_id)
    if not known:
        where = "" if agent_id is None else f" of agent {agent_id!r}"
        raise NotFoundError(f"no owner {owner_id!r}{where}")


def chunks(storage: Storage, owner_id: str, *, agent_id: str | None = None) -> Iterator[bytes]:
    """The export document of ``owner_id``, as UTF-8 pieces (call :func:`check_owner`
    first: an unknown owner gives a document with nothing in it)."""
    head = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": now_ms(),
        "owner_id": owner_id,
        "agent_id": agent_id,
    }
    yield json.dumps(head, ensure_ascii=False)[:-1].encode()
    with storage.read() as reads:
        conversations = reads.owned_conversations(owner_id, agent_id=agent_id)
        rows = [
            r
            for r in reads.rows(agent_id=agent_id, owner_id=owner_id, archived=None)
            if r.owner_id == owner_id
        ]
        jobs = [j for j in reads.jobs(agent_id=agent_id) if j.owner_id == owner_id]
        runs = [run for job in jobs for run in reads.runs(job.id, limit=-1)]
        agents = sorted({r.agent_id for r in reads.resources(agent_id) if r.owner_id == owner_id})
        files = []
        for agent in agents:
            for spec in FILES:
                current = reads.current_revision(agent, spec.name, owner_id=owner_id)
                if current is not None:
                    files.append(
                        {
                            "agent_id": agent,
                            "name": spec.name,
                            "revision": current.revision,
                            "content": current.content,
                            "created_at": current.created_at,
                        }
                    )
    yield _field("conversations", [wire.to_json(c) for c in conversations])
    yield b', "messages": ['
    after, first = 0, True
    while True:
        with storage.read() as reads:
            page = reads.owner_messages(owner_id, agent_id=agent_id, after_id=after, limit=PAGE)
        if not page:
            break
        parts = [json.dumps(wire.message_json(m), ensure_ascii=False) for m in page]
        yield ("" if first else ", ").encode() + ", ".join(parts).encode()
        after, first = page[-1].id, False
    yield b"]"
    yield _field("memory_rows", [wire.to_json(r) for r in rows])
    yield _field("prompt_files", files)
    yield _field("jobs", [wire.to_json(j) for j in jobs])
    yield _field("runs", [wire.to_json(r) for r in runs])
    yield b"}\n"


def _field(name: str, value: Any) -> bytes:
    return f", {json.dumps(name)}: {json.dumps(value, ensure_ascii=False)}".encode()


def write(
    storage: Storage,
    owner_id: str,
    file: str | os.PathLike[str] | IO[bytes],
    *,
    agent_id: str | None = None,
) -> int:
    """Write the export of ``owner_id`` to ``file`` (a path, created owner-only, or a binary
    file open for writing); returns the bytes written."""
    check_owner(storage, owner_id, agent_id)
    if isinstance(file, str | os.PathLike):
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            return _copy(chunks(storage, owner_id, agent_id=agent_id), out)
    return _copy(chunks(storage, owner_id, agent_id=agent_id), file)


def _copy(pieces: Iterator[bytes], out: IO[bytes]) -> int:
    written = 0
    for piece in pieces:
        out.write(piece)
        written += len(piece)
    return written
