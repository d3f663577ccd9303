"""A host that runs commands from its stdin, for tests with two hosts on one home.

Run in a child forked by :mod:`soak.zygote` as ``main([HOME, MODEL_URL])``. It starts a
``Memory`` (the real tree), prints ``{"ready": true}``, then reads one JSON command per line
and prints one JSON answer per line: ``{"ok": RESULT}``, or ``{"error": TYPE, "message":
TEXT}`` when a fermix call raised. ``{"op": "quit"}`` closes the tree and ends it.

Commands (``chat`` and ``owner`` name a conversation of agent ``twin``):

- ``append`` ``chat owner text``: the stored message's id;
- ``review`` ``chat owner``: the review's ``as_dict()``;
- ``write`` ``owner key value``: upsert a goal row at owner scope through the host's writer
  (which rebuilds the prompt files it shows in);
- ``archive`` ``id``: archive a row the same way;
- ``get`` ``id`` / ``list`` ``key``: rows through ``Memory.get_row`` / ``list_rows`` (read
  from SQLite each time), as dicts;
- ``load`` ``tag n``: three threads, two appending ``n`` messages each and one writing ``n``
  rows, at once; the ids acknowledged, and every error that reached them.
"""

from __future__ import annotations

import threading
from typing import Any

from factories import config_for

from fermix.api import Memory
from fermix.core import categories
from fermix.errors import FermixError
from fermix.model import MemoryRow
from fermix.storage import Writes
from soak.commands import serve

AGENT = "twin"


def _row(row: MemoryRow | None) -> dict[str, Any] | None:
    return None if row is None else row.as_dict()


class Twin:
    """The commands, over one running Memory."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory

    def append(self, chat: str, owner: str, text: str) -> int:
        conv = self.memory.conversation(AGENT, "chat", chat, owner_id=owner)
        return conv.append_user(text).id

    def review(self, chat: str, owner: str) -> dict[str, Any]:
        conv = self.memory.conversation(AGENT, "chat", chat, owner_id=owner)
        return self.memory.review(conv).as_dict()

    def write(self, owner: str, key: str, value: str) -> int:
        def work(writes: Writes) -> list[MemoryRow]:
            row = writes.upsert_row(
                agent_id=AGENT,
                owner_id=owner,
                scope=categories.owner_scope(owner),
                category="goal",
                key=key,
                value=value,
                promote_target=None,
            )
            return [row]

        return self.memory._runtime.services.writer.write_rows(work, label="twin write").rows[0].id

    def archive(self, id: int) -> dict[str, Any] | None:
        written = self.memory._runtime.services.writer.write_rows(
            lambda w: [w.archive_row(id, by="twin", reason="test")], label="twin archive"
        )
        return _row(written.rows[0])

    def get(self, id: int) -> dict[str, Any] | None:
        return _row(self.memory.get_row(id))

    def list(self, key: str) -> list[dict[str, Any] | None]:
        return [_row(r) for r in self.memory.list_rows(key=key, archived=None)]

    def load(self, tag: str, n: int) -> dict[str, Any]:
        acked: dict[str, list[int]] = {"messages": [], "rows": []}
        errors: list[str] = []
        lock = threading.Lock()

        def run(kind: str, step: Any) -> None:
            for i in range(n):
                try:
                    got = step(i)
                except FermixError as exc:
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    acked[kind].append(got)

        threads = [
            threading.Thread(
                target=run,
                args=("messages", lambda i, t=t: self.append(f"{tag}{t}", "ana", f"{tag}{t}-{i}")),
            )
            for t in range(2)
        ]
        threads.append(
            threading.Thread(
                target=run, args=("rows", lambda i: self.write("ana", f"{tag}-{i % 7}", str(i)))
            )
        )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {"acked": acked, "errors": errors}


def main(argv: list[str]) -> int:
    home, model_url = argv[0], argv[1]
    memory = Memory(home, config=config_for(model_url, primary="openai/twin", timeout_s=30))
    return serve(memory, Twin)
