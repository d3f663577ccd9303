"""Realtime voice transcripts: stored per device when enabled, reviewed like chat (V1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import StartMemory, config_for, stored_messages
from model_server import ModelServer

from fermix import Memory
from fermix.config import Config
from fermix.errors import InvalidInputError
from fermix.model import ConversationKey
from fermix.storage.sqlite.connection import fetch_value
from fermix.storage.sqlite.migrations import open_database

KITCHEN = ConversationKey("agent", "realtime", "kitchen")


@pytest.fixture
def persisting(start_memory: StartMemory, model_server: ModelServer) -> Memory:
    """A running Memory with ``persist_transcripts = true``, reviewing on the loopback server."""
    return start_memory(config_for(model_server, persist_transcripts=True))


def count_rows(home: Path, table: str) -> int:
    conn = open_database(home / "memory.db")
    try:
        return int(fetch_value(conn, f"SELECT count(*) FROM {table}"))
    finally:
        conn.close()


def test_v1_transcripts_are_voice_turns_in_the_devices_realtime_conversation(
    persisting: Memory, home: Path
) -> None:
    heard = persisting.voice_transcript(
        "agent", "kitchen", "user", "I moved to Porto", owner_id="alice"
    )
    said = persisting.voice_transcript(
        "agent", "kitchen", "assistant", "Welcome to Porto!", owner_id="alice"
    )
    persisting.voice_transcript("agent", "car", "user", "Drive me home", owner_id="alice")

    rows = stored_messages(home, KITCHEN)
    assert rows == [heard, said]
    assert [(m.role, m.kind, m.channel, m.chat_id) for m in rows] == [
        ("user", "voice_turn", "realtime", "kitchen"),
        ("assistant", "voice_turn", "realtime", "kitchen"),
    ]
    assert [m.sender for m in rows] == ["alice", "assistant"]
    assert all(m.owner_id == "alice" for m in rows)
    assert all(m.metadata == {"source_type": "realtime", "device_id": "kitchen"} for m in rows)
    car = stored_messages(home, ConversationKey("agent", "realtime", "car"))
    assert [m.content for m in car] == ["Drive me home"]
    # the device's conversation holds them as its window too
    conv = persisting.conversation("agent", "realtime", "kitchen", owner_id="alice")
    assert conv.history() == rows


def test_v1_the_reviewer_reads_the_user_voice_turns_like_chat_messages(
    persisting: Memory, model_server: ModelServer
) -> None:
    for role, text in [
        ("user", "I moved to Porto last month"),
        ("assistant", "How do you like Porto so far?"),
        ("user", "I love the tiles, I am learning Portuguese"),
    ]:
        persisting.voice_transcript("agent", "kitchen", role, text, owner_id="alice")
    model_server.reply_json(
        {
            "operations": [
                {"op": "add", "category": "identity", "key": "home_city", "value": "Porto"}
            ]
        }
    )
    conv = persisting.conversation("agent", "realtime", "kitchen", owner_id="alice")

    result = persisting.review(conv)

    assert (result.status, result.messages, result.added) == ("applied", 2, 1)
    (request,) = model_server.requests
    data = json.loads(request["messages"][1]["content"])
    assert [(m["kind"], m["text"]) for m in data["user_messages"]] == [
        ("voice_turn", "I moved to Porto last month"),
        ("voice_turn", "I love the tiles, I am learning Portuguese"),
    ]
    (row,) = persisting.list_rows(agent_id="agent", owner_id="alice")
    assert (row.key, row.value, row.session_id) == ("home_city", "Porto", KITCHEN.scope_id)


def test_v1_with_persist_transcripts_off_nothing_is_stored(
    running: Memory, home: Path, model_server: ModelServer
) -> None:
    assert Config().realtime.persist_transcripts is False  # off by default
    assert running.config.realtime.persist_transcripts is False
    assert running.voice_transcript("agent", "kitchen", "user", "I moved", owner_id="a") is None
    assert running.voice_transcript("agent", "kitchen", "assistant", "Nice", owner_id="a") is None
    conv = running.conversation("agent", "realtime", "kitchen", owner_id="a")
    assert conv.history() == []
    assert conv.state() is None
    for table in ("messages", "messages_fts", "conversations", "memories"):
        assert count_rows(home, table) == 0, table
    assert model_server.requests == []


@pytest.mark.parametrize("role", ["system", "tool", "User", ""])
def test_v1_a_transcript_is_from_the_user_or_the_assistant_only(
    persisting: Memory, home: Path, role: str
) -> None:
    with pytest.raises(InvalidInputError):
        persisting.voice_transcript("agent", "kitchen", role, "text", owner_id="alice")
    assert count_rows(home, "messages") == 0
