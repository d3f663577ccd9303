"""``fermix.Memory`` on PostgreSQL, chosen by the home's config alone (B1, B2).

A home whose config.toml names a database of the suite's own PostgreSQL (``postgres_db``,
tests/pg_fixtures.py) runs the host's whole life with the loopback model server: a turn
(append, compose, commit), a review storing memory rows, USER.md composed from them, a
compaction, recall over the messages the checkpoint replaced, vectors from the background
embedder; then the same home opened again reads every bit of it back, and no memory.db
was ever made. Nothing above storage is told which backend runs: only the config says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from factories import MODEL, StartMemory
from model_server import ModelServer

from fermix.api import Memory
from fermix.config import STORAGE_URL_ENV
from fermix.conversation import Conversation
from fermix.model import Message
from fermix.runtime import indexing

SYSTEM = "You are a tutor."
WINDOW = 2_000
"""A context window small enough that forty turns need a compaction."""


@pytest.fixture
def pg_home(home: Path, postgres_db: str, model_server: ModelServer, monkeypatch: Any) -> Path:
    """The temporary home, its config.toml naming ``postgres_db`` and the loopback model
    (background review off, so every model request is one the test asked for)."""
    monkeypatch.delenv(STORAGE_URL_ENV, raising=False)
    (home / "config.toml").write_text(
        f"""
[fermix_core.storage]
url = "{postgres_db}"

[fermix_core.memory]
review_interval_hours = 0

[fermix_core.model]
primary = "{MODEL}"
api_base = "{model_server.url}"
context_window = {WINDOW}
timeout_s = 10
""",
        encoding="utf-8",
    )
    return home


def _ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"operations": list(operations)}


def _add(category: str, key: str, value: str) -> dict[str, Any]:
    return {"op": "add", "category": category, "key": key, "value": value}


def _recall(memory: Memory, conv: Conversation, query: str) -> list[int]:
    """The ids of the messages ``memory_recall`` finds in the history of ``conv``."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {
            "name": "memory_recall",
            "arguments": json.dumps({"query": query, "source": "history"}),
        },
    }
    found = json.loads(memory.tools.run(call, conv))
    return [hit["id"] for hit in found["history"]]


def _fill(conv: Conversation, turns: int) -> list[Message]:
    stored = []
    for i in range(turns):
        stored.append(conv.append_user(f"marker{i:03d}u I keep asking about the harbour, {i}."))
        stored.append(conv.append_assistant(f"marker{i:03d}a The harbour is busy in May, {i}."))
    return stored


def test_b1_b2_a_memory_on_postgresql_runs_a_host_and_reads_it_all_back_when_reopened(
    pg_home: Path, start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory()  # config None: the home's config.toml, as a host reads it
    assert memory._runtime.services.storage.shared  # the store the config named, not memory.db
    conv = memory.conversation("tutor", "telegram", "42", owner_id="ana")

    # a turn
    assert conv.preflight() is None
    asked = conv.append_user("I am a nurse in Porto and I drink green tea every morning.")
    messages = conv.compose(SYSTEM)
    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert messages[-1] == {"role": "user", "content": asked.content}
    reply = conv.commit("Nice to meet you, Ana!", usage={"prompt_tokens": 120})
    assert [m.id for m in conv.history()] == [asked.id, reply.id] and asked.id < reply.id
    assert conv.state().peak_prompt_tokens == 120  # type: ignore[union-attr]

    # a review storing memory rows, and the prompt file rendered from them
    model_server.reply_json(
        _ops(_add("identity", "job", "Nurse in Porto"), _add("preference", "drink", "Green tea"))
    )
    review = memory.review(conv)
    assert review.status == "applied", review.error
    assert review.added == 2 and review.messages == 1
    rows = {r.key: r.value for r in memory.list_rows(agent_id="tutor", owner_id="ana")}
    assert rows == {"job": "Nurse in Porto", "drink": "Green tea"}
    user_md, memory_md = conv.memory_files()
    assert "Nurse in Porto" in user_md and "Green tea" in user_md
    assert any("Nurse in Porto" in str(m["content"]) for m in conv.compose(SYSTEM))
    assert [r.key for r in memory.search_rows("porto nurse", agent_id="tutor")] == ["job"]

    # a compaction, and recall of what the checkpoint replaced
    filled = _fill(conv, 40)
    model_server.reply("Ana, a nurse in Porto, asked about the harbour many times.")
    compaction = memory.compact(conv, force=True)
    assert compaction.status == "compacted", compaction.error or compaction.reason
    window = conv.history()
    assert window[0].kind == "checkpoint" and "harbour" in window[0].content
    assert filled[0].id not in {m.id for m in window}
    assert filled[0].id in _recall(memory, conv, "marker000u")
    assert asked.id in _recall(memory, conv, "green tea")

    # the background embedder's vectors, fused into recall
    indexer = memory._runtime.services.indexer
    assert indexer is not None
    indexer.wake()
    assert indexer.wait_idle(60.0)
    with memory._runtime.services.storage.read() as reads:
        assert indexing.active(reads) is indexer  # searches of this store find it
        covered = reads.vector_coverage()
    assert covered.message_vectors == covered.messages == 2 + 2 * 40 + 1  # and the checkpoint
    assert covered.memory_vectors == covered.memories == 2 and covered.model is not None
    assert asked.id in _recall(memory, conv, "what does Ana drink in the morning")
    memory.close()

    # the same home, opened again: everything is read back from PostgreSQL
    again = start_memory()
    reopened = again.conversation("tutor", "telegram", "42", owner_id="ana")
    assert reopened.history() == window
    assert {r.key: r.value for r in again.list_rows(agent_id="tutor", owner_id="ana")} == rows
    assert reopened.memory_files() == (user_md, memory_md)
    assert filled[0].id in _recall(again, reopened, "marker000u")
    state = reopened.state()
    assert state is not None and state.last_reviewed_message_id == asked.id
    assert not (pg_home / "memory.db").exists()
