"""The OpenAI Agents SDK adapter (I2): ``FermixSession`` driven by the SDK's own
``Runner`` with ``OpenAIChatCompletionsModel`` on the loopback model server, embedded and
through a real memory server; and the assertions of the SDK's own tests of
``SQLiteSession`` (tests/memory/test_session.py, test_session_limit.py of
openai-agents-python) that apply, pointed at it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunContextWrapper,
    Runner,
    SessionSettings,
    TResponseInputItem,
    set_tracing_disabled,
)
from docs_page import section
from factories import StartMemory, config_for
from framework_turns import (
    ANY_METADATA,
    ThreadHops,
    assert_learned_from_the_second_request,
    assert_turns_stored,
    script_review_during_a_turn,
    script_turns,
    stored_under,
    values_under,
)
from hypothesis import given
from model_server import ModelServer
from openai import AsyncOpenAI

from fermix.api import Memory
from fermix.core import composer
from fermix.core.compaction import NOTICE
from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.integrations.openai_agents import META_KEY, FermixSession, items_of

set_tracing_disabled(True)  # the SDK would send traces to OpenAI's servers

T = TypeVar("T")
AGENT_MODEL = "agent"
"""The agent's model name on the model server (fermix's own compactor is ``test``)."""
SYSTEM = "You are a helpful assistant."


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Recorded(FermixSession):
    """A FermixSession that remembers every item the SDK gave it, to compare with what
    ``get_items`` gives back."""

    def __init__(self, *args: Any, **keywords: Any) -> None:
        super().__init__(*args, **keywords)
        self.added: list[TResponseInputItem] = []

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        await super().add_items(items, wrapper=wrapper)
        self.added.extend(copy.deepcopy(items))


@asynccontextmanager
async def agent_for(
    session: FermixSession, model_server: ModelServer, system: str = SYSTEM
) -> AsyncIterator[Agent[Any]]:
    """An agent with fermix's tools and instructions, its model on the loopback server."""
    client = AsyncOpenAI(base_url=model_server.url, api_key="sk-test")
    try:
        yield Agent(
            name="assistant",
            model=OpenAIChatCompletionsModel(model=AGENT_MODEL, openai_client=client),
            instructions=session.instructions(system),
            tools=session.tools(),
        )
    finally:
        await client.close()


async def turns(session: FermixSession, model_server: ModelServer, *texts: str) -> list[str]:
    """Run one ``Runner.run`` per text; the final outputs."""
    outputs = []
    async with agent_for(session, model_server) as agent:
        for text in texts:
            result = await Runner.run(agent, text, session=session)
            outputs.append(str(result.final_output))
    return outputs


# -- the Runner over several turns, a tool call, a restart (I2) ---------------------------


def test_i2_runner_turns_with_a_memory_tool_call_are_stored_as_a_hand_written_host_does(
    memory: Memory, model_server: ModelServer
) -> None:
    session = Recorded(memory, "assistant", "cli", "42", owner_id="ana", trust="operator")
    script_turns(model_server)

    outputs = run(turns(session, model_server, "I am a nurse in Porto.", "What do I do?"))

    assert outputs == ["Noted, Ana.", "You are a nurse in Porto."]
    assert_turns_stored(session.conversation, memory)
    # the items round-trip exactly: what the SDK added is what get_items gives back
    assert run(session.get_items()) == session.added
    assert [item.get("type") for item in session.added[1:3]] == [
        "function_call",
        "function_call_output",
    ]
    # the second turn's model call saw the first turn, tool call and its output included
    second = model_server.requests[-1]["messages"]
    assert [m["role"] for m in second] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert second[3]["tool_call_id"] == second[2]["tool_calls"][0]["id"]
    assert second[0]["content"] == SYSTEM  # no prompt files yet: the system text alone


def test_i2_the_session_reads_back_after_a_restart_and_the_next_turn_sees_it(
    home: Path, model_server: ModelServer
) -> None:
    with Memory(home) as memory:
        session = Recorded(memory, "assistant", "cli", "42", owner_id="ana", trust="operator")
        script_turns(model_server)
        run(turns(session, model_server, "I am a nurse in Porto.", "What do I do?"))
        added = session.added

    with Memory(home) as reopened:
        again = FermixSession(reopened, "assistant", "cli", "42", owner_id="ana", trust="operator")
        assert run(again.get_items()) == added
        model_server.reply("Still a nurse.")
        assert run(turns(again, model_server, "And now?")) == ["Still a nurse."]
        sent = model_server.requests[-1]["messages"]
        assert [m["role"] for m in sent[1:]] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert sent[-1]["content"] == "And now?"


@pytest.mark.slow  # a memory server process
def test_i2_through_fermix_client_against_a_real_server_a_guest_stays_a_guest(
    model_server: ModelServer, start_server: Any
) -> None:
    """N1, N2, M1: the same turns through ``fermix.Client``; a host token's conversation is a
    guest's, asking for operator is refused, and the session survives a server restart."""
    server = start_server()
    client = server.client()
    with pytest.raises(AccessDeniedError):
        FermixSession(client, "assistant", "cli", "42", owner_id="ana", trust="operator")
    session = Recorded(client, "assistant", "cli", "42", owner_id="ana")
    script_turns(model_server)

    run(turns(session, model_server, "I am a nurse in Porto.", "What do I do?"))

    assert_turns_stored(session.conversation, client)
    assert {m.trust for m in session.conversation.history() if m.role == "user"} == {"guest"}
    with pytest.raises(AccessDeniedError):  # a guest may not /clear; nothing changed
        run(session.clear_session())
    with pytest.raises(AccessDeniedError):  # an erasure needs an operator token (F2)
        run(session.pop_item())
    assert run(session.get_items()) == session.added

    server.restart()
    operator = server.client(server.operator_token)
    again = FermixSession(operator, "assistant", "cli", "42", owner_id="ana")
    assert run(again.get_items()) == session.added
    assert run(again.pop_item()) == session.added[-1]
    assert run(again.get_items()) == session.added[:-1]


def test_i2_a_guest_turn_stays_a_guest_and_may_not_clear_the_window(
    memory: Memory, model_server: ModelServer
) -> None:
    """M1, M2: trust None is fermix's default (a guest), never the operator's."""
    session = FermixSession(memory, "assistant", "tg", "group", owner_id="bob")
    assert session.conversation.trust == "guest"
    model_server.reply("Hi Bob.")
    run(turns(session, model_server, "hello"))
    assert [(m.role, m.owner_id, m.trust) for m in session.conversation.history()] == [
        ("user", "bob", "guest"),
        ("assistant", "bob", "guest"),
    ]
    with pytest.raises(AccessDeniedError, match="Only the operator"):
        run(session.clear_session())
    assert run(session.command("/new")) == "Only the operator can use /new. Nothing was changed."
    assert run(session.command("hello again")) is None
    assert len(run(session.get_items())) == 2


def test_i2_clear_session_starts_a_fresh_window_and_keeps_the_history_for_recall(
    memory: Memory, model_server: ModelServer
) -> None:
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    model_server.reply("Porto is lovely.")
    run(turns(session, model_server, "I live in zanzibarporto."))
    run(session.clear_session())
    assert run(session.get_items()) == []
    call = {
        "id": "c1",
        "type": "function",
        "function": {
            "name": "memory_recall",
            "arguments": '{"query": "zanzibarporto", "source": "history"}',
        },
    }
    found = json.loads(memory.tools.run(call, session.conversation))
    # The reply joins the hits once the background embedder has stored its vector (it
    # shares "porto"); the message that holds the word comes first either way.
    contents = [h["content"] for h in found["history"]]
    assert contents[0] == "I live in zanzibarporto."
    assert set(contents) <= {"I live in zanzibarporto.", "Porto is lovely."}


# -- instructions and tools -----------------------------------------------------------------


def test_i2_p1_instructions_carry_the_fenced_memory_block_of_the_owner(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server))
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    session.conversation.append_user("I am a nurse.")
    op = {"op": "add", "category": "preference", "key": "drink", "value": "Likes zanzibartea"}
    model_server.reply_json({"operations": [op]})
    memory.review(session.conversation)  # type: ignore[arg-type]
    model_server.reply("Tea it is.")

    run(turns(session, model_server, "What do I like?"))

    system = model_server.requests[-1]["messages"][0]
    assert system["role"] == "system"
    expected = composer.compose(SYSTEM, *session.conversation.memory_files(), [])
    assert system["content"] == "\n\n".join(m["content"] for m in expected)
    assert composer.FENCE_OPEN in system["content"] and "zanzibartea" in system["content"]
    assert system["content"].startswith(SYSTEM)


def test_i2_t4_a_refused_tool_call_is_the_tools_output_and_the_turn_goes_on(
    memory: Memory, model_server: ModelServer
) -> None:
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    model_server.reply_tool_call("memory_store", {"key": "", "value": "x"})
    model_server.reply("Could not store that.")
    assert run(turns(session, model_server, "store nothing")) == ["Could not store that."]
    tool = session.conversation.history()[2]
    assert tool.role == "tool" and "error" in json.loads(tool.content)
    assert memory.list_rows(agent_id="assistant") == []


# -- compaction through fermix (K1, K3) ------------------------------------------------------


def _fill(session: FermixSession, pairs: int) -> None:
    items: list[TResponseInputItem] = []
    for i in range(pairs):
        items.append({"role": "user", "content": f"marker{i:03d} I keep asking about Porto, {i}."})
        items.append({"role": "assistant", "content": f"The harbour in Porto is busy, {i}."})
    run(session.add_items(items))


def test_i2_k3_preflight_compacts_before_the_turn_and_the_window_starts_at_the_checkpoint(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server, context_window=2_000))
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    _fill(session, 30)
    # Each reply of the fill dispatched a compaction (post-delivery work); one still queued
    # when the peak below is recorded would compact in the background, and the preflight
    # would find nothing to do. An ask queues behind them: once it answers, none is left.
    assert memory.compact(session.conversation).status == "skipped"
    # the last turn's peak, recorded by a host that stopped before its post-delivery work
    session.conversation.append("assistant", "the last reply", peak_prompt_tokens=1_700)
    model_server.reply("The user asked about Porto many times.", for_model="test")
    model_server.reply("Porto again.", for_model=AGENT_MODEL)

    assert run(turns(session, model_server, "and Porto?")) == ["Porto again."]

    assert session.notice == NOTICE
    window = session.conversation.history()
    assert window[0].kind == "checkpoint"
    items = run(session.get_items())
    checkpoint = f"{composer.CHECKPOINT_LABEL}\nThe user asked about Porto many times."
    assert items[0] == {"role": "system", "content": checkpoint}
    assert items == [item for m in window for item in items_of(m)]
    sent = model_server.requests[-1]["messages"]
    assert sent[1] == {"role": "system", "content": checkpoint}
    assert not any("marker000" in str(m.get("content")) for m in sent)


def test_i2_k1_a_turn_over_the_threshold_compacts_after_its_commit_with_the_runs_peak(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server, context_window=2_000))
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    _fill(session, 30)
    model_server.reply("The user asked about Porto many times.", for_model="test")
    model_server.reply("Busy, as ever.", for_model=AGENT_MODEL, prompt_tokens=1_800)

    run(turns(session, model_server, "is the harbour busy?"))

    # queued behind the background compaction the commit dispatched, which used the peak up
    assert memory.compact(session.conversation).reason == "cold"  # type: ignore[arg-type]
    items = run(session.get_items())
    assert str(items[0]["content"]).startswith(composer.CHECKPOINT_LABEL)  # type: ignore[typeddict-item]
    assert _text(items[-1]) == "Busy, as ever."
    assert session.notice is None  # nothing was left for the preflight to do


def _text(item: TResponseInputItem) -> str:
    content = item.get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content)
    return str(content)


# -- pop_item, bad input ---------------------------------------------------------------------


def test_i2_f2_pop_item_erases_the_newest_message_for_real(
    memory: Memory, model_server: ModelServer
) -> None:
    session = Recorded(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    script_turns(model_server)
    run(turns(session, model_server, "I am a nurse in Porto.", "What do I do?"))
    newest = session.conversation.history()[-1]

    assert run(session.pop_item()) == session.added[-1]

    assert run(session.get_items()) == session.added[:-1]
    erasures = memory.erasures()
    assert [(e.target, e.state, dict(e.counts)) for e in erasures] == [
        ("message", "done", {"messages": 1})
    ]
    call = {
        "id": "c1",
        "type": "function",
        "function": {
            "name": "memory_recall",
            "arguments": '{"query": "Porto", "source": "history"}',
        },
    }
    found = json.loads(memory.tools.run(call, session.conversation))
    assert newest.id not in [h["id"] for h in found["history"]]


def test_i2_pop_item_of_a_response_with_text_and_a_call_keeps_the_text(memory: Memory) -> None:
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    text = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
    }
    call = {"type": "function_call", "call_id": "c9", "name": "lookup", "arguments": "{}"}
    items: list[TResponseInputItem] = [{"role": "user", "content": "look"}, text, call]  # type: ignore[list-item]
    run(session.add_items(items))
    assert session.conversation.history()[-1].metadata["tool_calls"][0]["id"] == "c9"

    assert run(session.pop_item()) == call
    assert run(session.get_items()) == items[:2]
    assert [m.content for m in session.conversation.history()] == ["look", "Let me look."]
    assert "tool_calls" not in session.conversation.history()[-1].metadata


@pytest.mark.parametrize(
    "bad",
    [
        "not an object",
        {"role": "user", "content": object()},
        {"role": "user", "content": "x" * 2_000_000},
    ],
)
def test_i2_a_batch_with_a_bad_item_is_refused_whole_and_nothing_is_stored(
    memory: Memory, bad: Any
) -> None:
    """The port of test_sqlite_session_failed_add_items_releases_write_lock: the error is
    fermix's typed one and the session stays usable."""
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    with pytest.raises(InvalidInputError):
        run(session.add_items([{"role": "user", "content": "fine"}, bad]))
    assert run(session.get_items()) == []
    run(session.add_items([{"role": "user", "content": "after failure"}]))
    assert run(session.get_items()) == [{"role": "user", "content": "after failure"}]


def test_i2_a_negative_limit_is_refused(memory: Memory) -> None:
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    with pytest.raises(InvalidInputError):
        run(session.get_items(limit=-1))


def test_i2_a_hand_written_turn_comes_back_as_items_the_runner_accepts(
    memory: Memory, model_server: ModelServer
) -> None:
    """A turn a host wrote by hand (the README's loop) on the same conversation."""
    conv = memory.conversation("assistant", "cli", "1", owner_id="ana", trust="operator")
    conv.append_user("weather?")
    calls = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
    conv.append("assistant", "", metadata={"tool_calls": calls})
    conv.append("tool", "sunny", metadata={"tool_call_id": "c1", "name": "lookup"})
    conv.commit("It is sunny.")
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    assert run(session.get_items()) == [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    model_server.reply("Still sunny.")
    run(turns(session, model_server, "and now?"))
    sent = model_server.requests[-1]["messages"]
    assert [(m["role"], m.get("content") or "") for m in sent[1:]] == [
        ("user", "weather?"),
        ("assistant", ""),
        ("tool", "sunny"),
        ("assistant", "It is sunny."),
        ("user", "and now?"),
    ]
    assert sent[2]["tool_calls"] == calls and sent[3]["tool_call_id"] == "c1"


# -- the SDK's own session tests, ported (tests/memory/test_session.py, test_session_limit.py) -


@pytest.fixture
def operator_session(memory: Memory) -> FermixSession:
    return FermixSession(memory, "assistant", "cli", "direct", owner_id="me", trust="operator")


def test_i2_sdk_session_memory_basic_functionality(
    memory: Memory, model_server: ModelServer
) -> None:
    """test_session_memory_basic_functionality_parametrized (run and run_sync)."""
    session = FermixSession(memory, "assistant", "cli", "s123", owner_id="me", trust="operator")
    model_server.reply("San Francisco")
    assert run(turns(session, model_server, "What city is the Golden Gate Bridge in?")) == [
        "San Francisco"
    ]
    model_server.reply("California")
    client = AsyncOpenAI(base_url=model_server.url, api_key="sk-test")
    agent: Agent[Any] = Agent(
        name="test", model=OpenAIChatCompletionsModel(model=AGENT_MODEL, openai_client=client)
    )
    result = Runner.run_sync(agent, "What state is it in?", session=session)
    assert result.final_output == "California"
    assert len(model_server.requests[-1]["messages"]) > 1


def test_i2_sdk_different_sessions_keep_separate_histories(
    memory: Memory, model_server: ModelServer
) -> None:
    """test_session_memory_different_sessions_parametrized."""
    one = FermixSession(memory, "assistant", "cli", "session_1", owner_id="me", trust="operator")
    two = FermixSession(memory, "assistant", "cli", "session_2", owner_id="me", trust="operator")
    model_server.reply("I like cats")
    run(turns(one, model_server, "I like cats"))
    model_server.reply("I like dogs")
    run(turns(two, model_server, "I like dogs"))
    model_server.reply("Yes, you mentioned cats")
    assert run(turns(one, model_server, "What did I say I like?")) == ["Yes, you mentioned cats"]
    sent = json.dumps(model_server.requests[-1]["messages"])
    assert "cats" in sent and "dogs" not in sent


def test_i2_sdk_direct_add_get_and_clear(operator_session: FermixSession) -> None:
    """test_sqlite_session_memory_direct."""
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
    ]
    run(operator_session.add_items(items))
    assert run(operator_session.get_items()) == items
    run(operator_session.clear_session())
    assert run(operator_session.get_items()) == []


def test_i2_sdk_pop_item_until_empty(operator_session: FermixSession) -> None:
    """test_sqlite_session_memory_pop_item."""
    assert run(operator_session.pop_item()) is None
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]
    run(operator_session.add_items(items))
    assert len(run(operator_session.get_items())) == 3
    assert run(operator_session.pop_item()) == items[2]
    assert run(operator_session.get_items()) == items[:2]
    assert run(operator_session.pop_item()) == items[1]
    assert run(operator_session.pop_item()) == items[0]
    assert run(operator_session.pop_item()) is None
    assert run(operator_session.get_items()) == []


def test_i2_sdk_pop_item_touches_only_its_session(memory: Memory) -> None:
    """test_session_memory_pop_different_sessions."""
    one = FermixSession(memory, "assistant", "cli", "session_1", owner_id="me", trust="operator")
    two = FermixSession(memory, "assistant", "cli", "session_2", owner_id="me", trust="operator")
    run(one.add_items([{"role": "user", "content": "Session 1 message"}]))
    run(
        two.add_items(
            [
                {"role": "user", "content": "Session 2 message 1"},
                {"role": "user", "content": "Session 2 message 2"},
            ]
        )
    )
    assert run(two.pop_item()) == {"role": "user", "content": "Session 2 message 2"}
    assert run(one.get_items()) == [{"role": "user", "content": "Session 1 message"}]
    assert run(two.get_items()) == [{"role": "user", "content": "Session 2 message 1"}]


def test_i2_sdk_get_items_with_limit(operator_session: FermixSession) -> None:
    """test_sqlite_session_get_items_with_limit."""
    items: list[TResponseInputItem] = []
    for i in (1, 2, 3):
        items += [
            {"role": "user", "content": f"Message {i}"},
            {"role": "assistant", "content": f"Response {i}"},
        ]
    run(operator_session.add_items(items))
    assert run(operator_session.get_items()) == items
    assert run(operator_session.get_items(limit=2)) == items[-2:]
    assert run(operator_session.get_items(limit=4)) == items[-4:]
    assert run(operator_session.get_items(limit=10)) == items
    assert run(operator_session.get_items(limit=0)) == []


def test_i2_sdk_list_input_is_appended_to_the_history_by_default(
    operator_session: FermixSession, model_server: ModelServer
) -> None:
    """test_session_memory_appends_list_input_by_default."""
    initial: list[TResponseInputItem] = [
        {"role": "user", "content": "Earlier message"},
        {"role": "assistant", "content": "Saved reply"},
    ]
    run(operator_session.add_items(initial))
    model_server.reply("This should run")

    async def go() -> None:
        async with agent_for(operator_session, model_server) as agent:
            await Runner.run(
                agent, [{"role": "user", "content": "Test message"}], session=operator_session
            )

    run(go())
    assert model_server.requests[-1]["messages"][1:] == [
        *initial,
        {"role": "user", "content": "Test message"},
    ]


def test_i2_sdk_session_input_callback_shapes_the_input_and_the_history_does_not_grow(
    operator_session: FermixSession, model_server: ModelServer
) -> None:
    """test_session_callback_prepared_input and
    test_session_callback_repeating_history_does_not_grow_session."""
    run(
        operator_session.add_items(
            [
                {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "Hi, I'm here to assist you."},
            ]
        )
    )

    def users_only(history: list[Any], new: list[Any]) -> list[Any]:
        return [item for item in history if item.get("role") == "user"] + new

    def repeat_first(history: list[Any], new: list[Any]) -> list[Any]:
        return [*history, history[0], *new]

    async def go(callback: Any, text: str) -> None:
        async with agent_for(operator_session, model_server) as agent:
            await Runner.run(
                agent,
                text,
                session=operator_session,
                run_config=RunConfig(session_input_callback=callback),
            )

    model_server.reply("I'm gpt-4o")
    run(go(users_only, "What your name?"))
    assert model_server.requests[-1]["messages"][1:] == [
        {"role": "user", "content": "Hello there."},
        {"role": "user", "content": "What your name?"},
    ]
    for turn in range(2):
        run(go(repeat_first, f"user {turn}"))
    users = [i.get("content") for i in run(operator_session.get_items()) if i.get("role") == "user"]
    assert users == ["Hello there.", "What your name?", "user 0", "user 1"]
    assert len(run(operator_session.get_items())) == 8


def test_i2_sdk_unicode_and_sql_looking_text_round_trip(operator_session: FermixSession) -> None:
    """test_sqlite_session_unicode_content and
    test_sqlite_session_special_characters_and_sql_injection."""
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "こんにちは"},
        {"role": "assistant", "content": "😊👍"},
        {"role": "user", "content": "O'Reilly"},
        {"role": "assistant", "content": "Robert'); DROP TABLE students;--"},
        {"role": "user", "content": '"SELECT * FROM users WHERE name = "admin";"'},
    ]
    run(operator_session.add_items(items))
    assert run(operator_session.get_items()) == items


def test_i2_sdk_concurrent_adds_from_threads_are_all_kept(operator_session: FermixSession) -> None:
    """test_sqlite_session_concurrent_access: each thread its own event loop."""
    items = [{"role": "user", "content": f"Message {i}"} for i in range(10)]

    def add(item: Any) -> None:
        asyncio.run(operator_session.add_items([item]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, items))
    contents = {item.get("content") for item in run(operator_session.get_items())}
    assert contents == {f"Message {i}" for i in range(10)}


def test_i2_sdk_session_settings(memory: Memory) -> None:
    """test_session_settings_default, _constructor, _constructor_normalizes_dictionary,
    _rejects_unknown_dictionary_fields, test_get_items_uses_session_settings_limit and
    test_get_items_explicit_limit_overrides_session_settings."""
    default = FermixSession(memory, "assistant", "cli", "d", owner_id="me", trust="operator")
    assert isinstance(default.session_settings, SessionSettings)
    assert default.session_settings.limit is None
    limited = FermixSession(
        memory,
        "assistant",
        "cli",
        "l",
        owner_id="me",
        trust="operator",
        session_settings=SessionSettings(limit=3),
    )
    assert limited.session_settings is not None and limited.session_settings.limit == 3
    normalized = FermixSession(
        memory,
        "assistant",
        "cli",
        "n",
        owner_id="me",
        trust="operator",
        session_settings={"limit": 0},
    )
    assert isinstance(normalized.session_settings, SessionSettings)
    assert normalized.session_settings.limit == 0
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        FermixSession(
            memory, "assistant", "cli", "x", owner_id="me", session_settings={"limitt": 1}
        )
    items: list[TResponseInputItem] = [
        {"role": "user", "content": f"Message {i}"} for i in range(5)
    ]
    run(limited.add_items(items))
    assert run(limited.get_items()) == items[-3:]
    assert run(limited.get_items(limit=2)) == items[-2:]


def test_i2_sdk_run_config_session_settings_override_the_sessions(
    memory: Memory, model_server: ModelServer
) -> None:
    """test_runner_with_session_settings_override and test_session_limit_zero."""
    session = FermixSession(
        memory,
        "assistant",
        "cli",
        "o",
        owner_id="me",
        trust="operator",
        session_settings=SessionSettings(limit=100),
    )
    run(session.add_items([{"role": "user", "content": f"Turn {i}"} for i in range(10)]))

    async def go(limit: int) -> None:
        async with agent_for(session, model_server) as agent:
            await Runner.run(
                agent,
                "New question",
                session=session,
                run_config=RunConfig(session_settings=SessionSettings(limit=limit)),
            )

    run(go(2))
    assert [m["content"] for m in model_server.requests[-1]["messages"][1:]] == [
        "Turn 8",
        "Turn 9",
        "New question",
    ]
    run(go(0))
    assert [m["content"] for m in model_server.requests[-1]["messages"][1:]] == ["New question"]


def test_i2_sdk_a_limit_cutting_a_tool_pair_drops_the_unmatched_output(
    operator_session: FermixSession, model_server: ModelServer
) -> None:
    """test_session_limit_drops_unmatched_history_function_call_output: the session gives
    the items as stored; the Runner drops the output whose call is cut off."""
    history: list[TResponseInputItem] = [
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
        },
    ]  # type: ignore[list-item]
    run(operator_session.add_items(history))
    assert run(operator_session.get_items(limit=2)) == history[-2:]

    async def go() -> None:
        async with agent_for(operator_session, model_server) as agent:
            await Runner.run(
                agent,
                "What about tomorrow?",
                session=operator_session,
                run_config=RunConfig(session_settings=SessionSettings(limit=2)),
            )

    model_server.reply("Tomorrow is sunny too.")
    run(go())
    assert model_server.requests[-1]["messages"][1:] == [
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "What about tomorrow?"},
    ]


# -- the docs' host runs as written (I6) -----------------------------------------------------


def doc_host(heading: str) -> str:
    """The one ```python block of a section of docs/integrations.md."""
    blocks = re.findall(r"```python\n(.*?)```", section(heading), re.DOTALL)
    assert len(blocks) == 1
    return blocks[0]


def doc_env(model_server: ModelServer, home: Path) -> dict[str, str]:
    """What the host is given: the model server as OpenAI, the test's home."""
    env = {
        "PATH": "/usr/bin:/bin",
        "FERMIX_HOME": str(home),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": model_server.url,
        "OPENAI_API_BASE": model_server.url,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    if "PYTHONPATH" in os.environ:  # a worktree's fermix, not the installed one
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


@pytest.mark.slow  # a fresh python importing the SDK and litellm
def test_i2_the_docs_host_runs_as_written_with_a_memory_tool_call(
    model_server: ModelServer, home: Path
) -> None:
    model_server.reply_tool_call("memory_store", {"key": "job", "value": "nurse in Porto"})
    model_server.reply("Nice to meet you, Ana!")
    done = subprocess.run(
        [sys.executable, "-c", doc_host("OpenAI Agents SDK (I2)")],
        capture_output=True,
        text=True,
        env=doc_env(model_server, home),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Nice to meet you, Ana!"
    assert [m["role"] for m in model_server.requests[1]["messages"]][-3:] == [
        "user",
        "assistant",
        "tool",
    ]
    with Memory(home) as memory:
        conv = memory.conversation("assistant", "telegram", "42", owner_id="me")
        assert [(m.role, m.trust) for m in conv.history()] == [
            ("user", "operator"),
            ("assistant", "operator"),
            ("tool", "operator"),
            ("assistant", "operator"),
        ]
        assert [r.value for r in memory.list_rows(agent_id="assistant", key="job")] == [
            "nurse in Porto"
        ]


def test_i2_p1_a_runs_first_call_takes_the_files_read_with_the_window_the_next_reads_afresh(
    start_memory: StartMemory, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = start_memory(config_for(model_server))
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    script_review_during_a_turn(model_server, memory, session.conversation, monkeypatch)
    hops = ThreadHops(monkeypatch)

    assert run(turns(session, model_server, "What do I drink?")) == ["Tea it is."]

    # The window with the files in one worker call; the second model call's files read
    # afresh; no hop of the first call's own. (The SDK saves the input, then the rest.)
    assert hops.names.count("memory_files") == 1
    assert hops.names.index("memory_files") > hops.names.index("run_then_review")
    assert hops.names.count("_get_items") == 1 and hops.names[0] == "_get_items"
    assert_learned_from_the_second_request(model_server, AGENT_MODEL, session.conversation, SYSTEM)


def test_i2_p1_files_read_ahead_and_not_taken_are_dropped_at_the_commit(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn whose instructions were never asked after get_items (a host that ran
    another agent) leaves nothing for a later turn: its files are read again."""
    session = FermixSession(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    instructions = session.instructions(SYSTEM)
    run(session.get_items())
    run(session.add_items([{"role": "assistant", "content": "hi"}]))  # the reply: a commit
    hops = ThreadHops(monkeypatch)

    text = run(instructions(None, None))  # type: ignore[arg-type]

    assert hops.names == ["memory_files"]
    assert text == composer.instructions(SYSTEM, *session.conversation.memory_files())


@ANY_METADATA
@given(values=values_under(["items", "text", "role", "content"]))
def test_i2_any_value_under_the_adapters_key_reads_back_as_items_of_its_own(
    memory: Memory, values: list[Any]
) -> None:
    """Whatever a writer put under the adapter's key, a stored message reads as a list of
    items without an error, and the items are each read's own: changing them changes
    nothing stored."""
    window = stored_under(memory, META_KEY, values)
    for message in window:
        read = items_of(message)
        assert isinstance(read, list)
        again = json.loads(json.dumps(read))
        for item in read:
            if isinstance(item, dict):
                item.clear()
        assert items_of(message) == again
