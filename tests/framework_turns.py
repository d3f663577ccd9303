"""What the asyncio frameworks' adapter tests share (I2, I4), for the OpenAI Agents SDK's
session and Pydantic AI's history alike: the two scripted turns and what a hand-written
host would have stored of them; a turn with a review finishing in its middle, and fermix's
hops to worker threads counted (the prompt files as instructions, P1); and any JSON value
stored under an adapter's metadata key (hypothesis)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from model_server import ModelServer

from fermix.core import composer
from fermix.model import Message
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


# -- the prompt files of a run's requests (P1, M11) -----------------------------------------

LEARNED = "zanzibartea"
"""The preference a review stores in the middle of :func:`script_review_during_a_turn`."""


def script_review_during_a_turn(
    model_server: ModelServer, memory: Any, conversation: ConversationSurface, monkeypatch: Any
) -> None:
    """A turn whose first model request calls memory_recall, and whose tool call then waits
    for a review of the conversation (of an earlier turn's user message) that adds a
    preference to USER.md, as a review in the background may finish while a run goes on;
    then a reply. The run's first request is to be sent without the preference, its second
    with it."""
    conversation.append_user("I drink tea every morning.")
    tools = memory.tools
    real_run = tools.run

    def run_then_review(call: Any, caller: Any) -> str:
        answer: str = real_run(call, caller)
        memory.review(conversation)
        return answer

    monkeypatch.setattr(tools, "run", run_then_review)
    model_server.reply_tool_call("memory_recall", {"query": "drink"})
    op = {"op": "add", "category": "preference", "key": "drink", "value": f"Likes {LEARNED}"}
    model_server.reply_json({"operations": [op]})
    model_server.reply("Tea it is.")


def assert_learned_from_the_second_request(
    model_server: ModelServer, model: str, conversation: ConversationSurface, system: str
) -> None:
    """Of :func:`script_review_during_a_turn`'s run: its first request to ``model`` was
    sent without the preference, its second with it, as fermix's instructions are now."""
    first, second = [r for r in model_server.requests if r["model"] == model]
    assert LEARNED not in first["messages"][0]["content"]
    assert LEARNED in second["messages"][0]["content"]
    expected = composer.instructions(system, *conversation.memory_files())
    assert second["messages"][0] == {"role": "system", "content": expected}


class ThreadHops:
    """Counts the ``asyncio.to_thread`` calls of fermix's functions (and of this module's),
    by the name of the function each hands over; the framework's own are not counted."""

    def __init__(self, monkeypatch: Any) -> None:
        self.names: list[str] = []
        real = asyncio.to_thread

        async def counted(func: Any, /, *args: Any, **kwargs: Any) -> Any:
            module = getattr(func, "__module__", None) or ""
            if module.startswith("fermix") or module == __name__:
                self.names.append(func.__name__)
            return await real(func, *args, **kwargs)

        monkeypatch.setattr(asyncio, "to_thread", counted)


# -- anything under an adapter's metadata key -----------------------------------------------

ANY_METADATA = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
"""The settings of the tests that store :func:`values_under` examples in one Memory."""


def values_under(keys: list[str]) -> Any:
    """A hypothesis strategy of one to four JSON values, some of them objects with
    ``keys``: what any writer may have put under an adapter's metadata key."""
    value = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(keys), inner, max_size=3)
        ),
        max_leaves=8,
    )
    return st.lists(value, min_size=1, max_size=4)


def stored_under(memory: MemorySurface[Any], key: str, values: list[Any]) -> list[Message]:
    """One assistant message per value, each with ``{key: value}`` as its metadata, in a
    conversation of its own; the stored messages."""
    conv = memory.conversation("assistant", "cli", "any", owner_id="ana", trust="operator")
    start = len(conv.history())
    for value in values:
        conv.append("assistant", "text", metadata={key: value})
    window = conv.history()[start:]
    assert len(window) == len(values)
    return window
