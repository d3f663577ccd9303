"""The two scripted turns the asyncio frameworks' adapter tests run (I2, I4), and what a
hand-written host would have stored of them: the same script, the same expectation, for
the OpenAI Agents SDK's session and Pydantic AI's history alike."""

from __future__ import annotations

import json
from typing import Any

from model_server import ModelServer

from fermix.surface import ConversationSurface, MemorySurface

ROLES = ["user", "assistant", "tool", "assistant", "user", "assistant"]
"""The fermix roles of the two turns of :func:`script_turns`."""


def script_turns(model_server: ModelServer) -> None:
    """A tool call to memory_store, its answer, then a plain second turn."""
    model_server.reply_tool_call("memory_store", {"key": "job", "value": "nurse in Porto"})
    model_server.reply("Noted, Ana.", prompt_tokens=321)
    model_server.reply("You are a nurse in Porto.", prompt_tokens=345)


def assert_turns_stored(conversation: ConversationSurface, memory: MemorySurface[Any]) -> None:
    """The two turns of :func:`script_turns` as fermix messages a hand-written host writes."""
    window = conversation.history()
    assert [m.role for m in window] == ROLES
    call = window[1].metadata["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "memory_store"
    assert json.loads(call["function"]["arguments"]) == {"key": "job", "value": "nurse in Porto"}
    assert window[2].metadata["tool_call_id"] == call["id"]
    assert window[2].metadata["name"] == "memory_store"
    assert [m.content for m in window[3:]] == [
        "Noted, Ana.",
        "What do I do?",
        "You are a nurse in Porto.",
    ]
    state = conversation.state()
    assert state is not None and state.peak_prompt_tokens == 345
    rows = memory.list_rows(agent_id="assistant", key="job")
    assert [r.value for r in rows] == ["nurse in Porto"]
