"""Retention (F7): ``[fermix_core.retention]`` applied by the sweep, on both backends.

The retention's clock runs two days ahead, so with one day of retention everything written
so far is old. The sweep drops old messages but keeps a conversation's checkpoint (its
window still composes) and a user message the reviewer has not read yet (unless
``drop_unreviewed``); archived rows go, live ones stay; each prompt file keeps its newest
``revisions_keep`` revisions and always its current one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from factories import StartMemory, config_for
from model_server import ModelServer

from fermix.api import Memory
from fermix.clock import now_ms
from fermix.config import RetentionConfig, StorageConfig

AGENT = "bot"
DAY_MS = 86_400_000


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest) -> StorageConfig:
    if request.param == "sqlite":
        return StorageConfig()
    return StorageConfig(url=request.getfixturevalue("postgres_db"))


def _memory(
    start_memory: StartMemory,
    server: ModelServer,
    storage: StorageConfig,
    **retention: Any,
) -> Memory:
    base = config_for(server, context_window=2_000)
    config = dataclasses.replace(base, storage=storage, retention=RetentionConfig(**retention))
    return start_memory(config, clock=lambda: now_ms() + 2 * DAY_MS)


def _add(key: str, value: str) -> dict[str, Any]:
    return {"op": "add", "category": "preference", "key": key, "value": value}


def test_f7_old_messages_go_but_the_checkpoint_and_the_unreviewed_stay(
    start_memory: StartMemory, model_server: ModelServer, storage: StorageConfig
) -> None:
    memory = _memory(start_memory, model_server, storage, messages_days=1)
    conv = memory.conversation(AGENT, "tg", "dm", owner_id="alice")
    for i in range(30):
        conv.append_user(f"turn {i}: tell me about the harbour in Porto again, please")
        conv.append_assistant("The harbour of Porto is on the Douro, near the sea, and old.")
    model_server.reply("Summary: the user asked about the harbour many times.")
    assert memory.compact(conv, force=True).status == "compacted"
    model_server.reply_json({"operations": [_add("city", "Asks about Porto")]})
    assert memory.review(conv).added == 1
    waiting = conv.append_user("one more question, not reviewed yet")

    dropped = memory.retain()

    kept = conv.history()
    assert dropped["messages"] == 60
    assert [m.kind for m in kept] == ["checkpoint", "chat"] and kept[1].id == waiting.id
    # the window still composes: the checkpoint, then what is left after it
    composed = [m["content"] for m in conv.compose("You are a guide.")]
    assert any("asked about the harbour many times" in c for c in composed)
    assert composed[-1] == waiting.content
    assert not any("turn 29" in c for c in composed)
    assert [r.key for r in memory.list_rows(agent_id=AGENT)] == ["city"]  # what was learnt
    assert memory.retain()["messages"] == 0  # nothing more to drop


def test_f7_drop_unreviewed_drops_the_unread_too_and_zero_keeps_everything(
    start_memory: StartMemory, model_server: ModelServer, storage: StorageConfig
) -> None:
    keeping = _memory(start_memory, model_server, storage)
    conv = keeping.conversation(AGENT, "tg", "dm", owner_id="alice")
    conv.append_user("never reviewed")
    assert keeping.retain() == {"messages": 0, "archived_rows": 0, "revisions": 0}
    keeping.close()
    dropping = _memory(start_memory, model_server, storage, messages_days=1, drop_unreviewed=True)
    conv = dropping.conversation(AGENT, "tg", "dm", owner_id="alice")
    assert dropping.retain()["messages"] == 1
    assert conv.history() == []


def test_f7_archived_rows_and_old_revisions_go_the_current_revision_stays(
    start_memory: StartMemory, model_server: ModelServer, storage: StorageConfig
) -> None:
    memory = _memory(start_memory, model_server, storage, archived_days=1, revisions_keep=2)
    conv = memory.conversation(AGENT, "tg", "dm", owner_id="alice")
    for i in range(4):
        conv.append_user(f"my favourite number is now {i}")
        model_server.reply_json({"operations": [_add(f"n{i}", f"Likes the number {i}")]})
        assert memory.review(conv).added == 1
    (first,) = [r for r in memory.list_rows(agent_id=AGENT) if r.key == "n0"]
    conv.append_user("forget about zero")
    archive = {"op": "archive", "id": first.id, "reason": "changed"}
    model_server.reply_json({"operations": [archive]})
    assert memory.review(conv).archived == 1
    current = memory.revision(AGENT, "user_md", owner_id="alice")
    assert len(memory.revisions(AGENT, "user_md", owner_id="alice")) == 5

    dropped = memory.retain()

    assert dropped["archived_rows"] == 1 and dropped["revisions"] == 3
    assert memory.get_row(first.id) is None
    assert {r.key for r in memory.list_rows(agent_id=AGENT)} == {"n1", "n2", "n3"}
    revisions = memory.revisions(AGENT, "user_md", owner_id="alice")
    assert [r.revision for r in revisions] == [current.revision, current.revision - 1]
    assert memory.revision(AGENT, "user_md", owner_id="alice") == current
