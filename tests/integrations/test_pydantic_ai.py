"""The Pydantic AI adapter (I4): ``FermixHistory`` around a pydantic-ai ``Agent`` whose
model is ``OpenAIChatModel`` on the loopback model server, embedded and through a real
memory server: history in and out with ``ModelMessagesTypeAdapter``, the prompt files as
instructions, fermix's memory tools as a toolset.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
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
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from fermix.api import Memory
from fermix.core import composer
from fermix.core.compaction import NOTICE
from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.integrations.pydantic_ai import (
    META_KEY,
    FermixHistory,
    memory_instructions,
    memory_toolset,
    model_messages,
)

T = TypeVar("T")
AGENT_MODEL = "agent"
"""The agent's model name on the model server (fermix's own compactor is ``test``)."""
SYSTEM = "You are a helpful assistant."


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def agent_on(model_server: ModelServer, **keywords: Any) -> Agent[None, Any]:
    provider = OpenAIProvider(base_url=model_server.url, api_key="sk-test")
    return Agent(OpenAIChatModel(AGENT_MODEL, provider=provider), **keywords)


async def turns(history: FermixHistory, model_server: ModelServer, *texts: str) -> list[Any]:
    """One ``history.run`` per text with fermix's instructions and tools; the results."""
    agent = agent_on(model_server)
    results = []
    for text in texts:
        results.append(
            await history.run(
                agent,
                text,
                instructions=history.instructions(SYSTEM),
                toolsets=[history.toolset()],
            )
        )
    return results


def saved(messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """What :meth:`FermixHistory.save` keeps of ``messages``: requests lose their
    instructions (each run gets fresh ones)."""
    return [
        dataclasses.replace(m, instructions=None) if isinstance(m, ModelRequest) else m
        for m in messages
    ]


def as_json(messages: Sequence[ModelMessage]) -> Any:
    """``messages`` as ``ModelMessagesTypeAdapter`` dumps them: the history's round trip is
    exact in JSON (as Pydantic AI's own is: a datetime inside a response's free-form
    ``provider_details`` comes back from JSON as its string)."""
    return ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")


# -- the agent over several turns, a tool call, a restart (I4) -----------------------------


def test_i4_agent_turns_with_a_memory_tool_call_round_trip_through_fermix(
    memory: Memory, model_server: ModelServer
) -> None:
    history = FermixHistory(memory, "assistant", "cli", "42", owner_id="ana", trust="operator")
    script_turns(model_server)

    first, second = run(turns(history, model_server, "I am a nurse in Porto.", "What do I do?"))

    assert [first.output, second.output] == ["Noted, Ana.", "You are a nurse in Porto."]
    assert_turns_stored(history.conversation, memory)
    expected = saved(first.new_messages()) + saved(second.new_messages())
    assert as_json(run(history.messages(preflight=False))) == as_json(expected)
    sent = model_server.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[3]["tool_call_id"] == sent[2]["tool_calls"][0]["id"]
    assert sent[0]["content"] == SYSTEM


def test_i4_the_history_reads_back_after_a_restart_and_the_next_turn_sees_it(
    home: Path, model_server: ModelServer
) -> None:
    with Memory(home) as memory:
        history = FermixHistory(memory, "assistant", "cli", "42", owner_id="ana", trust="operator")
        script_turns(model_server)
        results = run(turns(history, model_server, "I am a nurse in Porto.", "What do I do?"))
        expected = [m for r in results for m in saved(r.new_messages())]

    with Memory(home) as reopened:
        again = FermixHistory(reopened, "assistant", "cli", "42", owner_id="ana", trust="operator")
        assert as_json(run(again.messages())) == as_json(expected)
        model_server.reply("Still a nurse.")
        (result,) = run(turns(again, model_server, "And now?"))
        assert result.output == "Still a nurse."
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


@pytest.mark.slow  # a memory server process
def test_i4_through_fermix_client_against_a_real_server_a_guest_stays_a_guest(
    model_server: ModelServer, start_server: Any
) -> None:
    server = start_server()
    client = server.client()
    with pytest.raises(AccessDeniedError):
        FermixHistory(client, "assistant", "cli", "42", owner_id="ana", trust="operator")
    history = FermixHistory(client, "assistant", "cli", "42", owner_id="ana")
    script_turns(model_server)

    results = run(turns(history, model_server, "I am a nurse in Porto.", "What do I do?"))

    assert_turns_stored(history.conversation, client)
    assert {m.trust for m in history.conversation.history() if m.role == "user"} == {"guest"}
    server.restart()
    again = FermixHistory(server.client(), "assistant", "cli", "42", owner_id="ana")
    assert as_json(run(again.messages())) == as_json(
        [m for r in results for m in saved(r.new_messages())]
    )


def test_i4_a_guest_turn_stays_a_guest(memory: Memory, model_server: ModelServer) -> None:
    """M1, M2: trust None is fermix's default (a guest), never the operator's."""
    history = FermixHistory(memory, "assistant", "tg", "group", owner_id="bob")
    model_server.reply("Hi Bob.")
    run(turns(history, model_server, "hello"))
    assert [(m.role, m.owner_id, m.trust) for m in history.conversation.history()] == [
        ("user", "bob", "guest"),
        ("assistant", "bob", "guest"),
    ]
    assert (
        run(history.command("/clear")) == "Only the operator can use /clear. Nothing was changed."
    )
    assert run(history.command("hello again")) is None
    assert len(run(history.messages(preflight=False))) == 2


class City(BaseModel):
    name: str


def test_i4_a_structured_output_run_commits_its_final_response_in_order(
    memory: Memory, model_server: ModelServer
) -> None:
    """The output tool's call is the reply (``commit``); its return is stored after it."""
    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    model_server.reply_tool_call("final_result", {"name": "Porto"}, prompt_tokens=77)
    result = run(history.run(agent_on(model_server, output_type=City), "Where do I live?"))
    assert result.output == City(name="Porto")
    window = history.conversation.history()
    assert [m.role for m in window] == ["user", "assistant", "tool"]
    assert window[1].metadata["tool_calls"][0]["function"]["name"] == "final_result"
    state = history.conversation.state()
    assert state is not None and state.peak_prompt_tokens == 77  # the commit recorded it
    assert as_json(run(history.messages(preflight=False))) == as_json(saved(result.new_messages()))


# -- instructions, tools -----------------------------------------------------------------------


def test_i4_p1_instructions_carry_the_fenced_memory_block_of_the_owner(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server))
    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    history.conversation.append_user("I am a nurse.")
    op = {"op": "add", "category": "preference", "key": "drink", "value": "Likes zanzibartea"}
    model_server.reply_json({"operations": [op]})
    memory.review(history.conversation)  # type: ignore[arg-type]
    model_server.reply("Tea it is.")

    run(turns(history, model_server, "What do I like?"))

    system = model_server.requests[-1]["messages"][0]
    expected = composer.compose(SYSTEM, *history.conversation.memory_files(), [])
    assert system == {"role": "system", "content": "\n\n".join(m["content"] for m in expected)}
    assert composer.FENCE_OPEN in system["content"] and "zanzibartea" in system["content"]


def test_i4_t4_a_refused_tool_call_is_the_tools_return_and_the_turn_goes_on(
    memory: Memory, model_server: ModelServer
) -> None:
    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    model_server.reply_tool_call("memory_recall", {"scope": "owner", "source": "history"})
    model_server.reply("Nothing found.")
    (result,) = run(turns(history, model_server, "recall"))
    assert result.output == "Nothing found."
    tool = history.conversation.history()[2]
    assert tool.role == "tool" and tool.metadata["name"] == "memory_recall"
    assert json.loads(tool.content)  # fermix's JSON answer, passed through as the return


# -- compaction, hand-written turns, bad input ---------------------------------------------


def test_i4_k3_the_window_after_a_preflight_compaction_starts_at_the_checkpoint(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server, context_window=2_000))
    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    conv = history.conversation
    for i in range(30):
        conv.append_user(f"marker{i:03d} I keep asking about the harbour in Porto, {i}.")
        conv.append_assistant(f"The harbour in Porto is busy in May, {i}.")
    conv.append("assistant", "the last reply", peak_prompt_tokens=1_700)
    model_server.reply("The user asked about Porto many times.", for_model="test")
    model_server.reply("Porto again.", for_model=AGENT_MODEL)

    (result,) = run(turns(history, model_server, "and Porto?"))

    assert result.output == "Porto again." and history.notice == NOTICE
    first = run(history.messages(preflight=False))[0]
    checkpoint = f"{composer.CHECKPOINT_LABEL}\nThe user asked about Porto many times."
    assert isinstance(first, ModelRequest)
    assert first.parts == [SystemPromptPart(checkpoint, timestamp=first.parts[0].timestamp)]
    sent = model_server.requests[-1]["messages"]
    assert {"role": "system", "content": checkpoint} in sent
    assert not any("marker000" in str(m.get("content")) for m in sent)


def test_i4_a_hand_written_turn_reads_as_model_messages_the_agent_accepts(
    memory: Memory, model_server: ModelServer
) -> None:
    conv = memory.conversation("assistant", "cli", "1", owner_id="ana", trust="operator")
    conv.append_user("weather?")
    calls = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
    conv.append("assistant", "", metadata={"tool_calls": calls})
    conv.append("tool", "sunny", metadata={"tool_call_id": "c1", "name": "lookup"})
    conv.commit("It is sunny.")
    messages = model_messages(conv.history())
    assert [type(m) for m in messages] == [ModelRequest, ModelResponse, ModelRequest, ModelResponse]
    assert isinstance(messages[0].parts[0], UserPromptPart)
    call = messages[1].parts[0]
    assert isinstance(call, ToolCallPart) and (call.tool_name, call.tool_call_id) == (
        "lookup",
        "c1",
    )
    ret = messages[2].parts[0]
    assert isinstance(ret, ToolReturnPart) and (ret.tool_name, ret.content) == ("lookup", "sunny")
    assert isinstance(messages[3].parts[0], TextPart)

    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    model_server.reply("Still sunny.")
    run(turns(history, model_server, "and now?"))
    sent = model_server.requests[-1]["messages"]
    assert [(m["role"], m.get("content") or "") for m in sent[1:]] == [
        ("user", "weather?"),
        ("assistant", ""),
        ("tool", "sunny"),
        ("assistant", "It is sunny."),
        ("user", "and now?"),
    ]


def test_i4_a_batch_fermix_would_refuse_is_refused_whole_and_nothing_is_stored(
    memory: Memory,
) -> None:
    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    batch: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("fine")]),
        ModelResponse(parts=[TextPart("x" * 2_000_000)]),
    ]
    with pytest.raises(InvalidInputError):
        run(history.save(batch))
    with pytest.raises(InvalidInputError):
        run(history.save(["not a message"]))  # type: ignore[list-item]
    assert history.conversation.history() == []


# -- the docs' host runs as written (I6) -----------------------------------------------------


@pytest.mark.slow  # a fresh python importing pydantic-ai and litellm
def test_i4_the_docs_host_runs_as_written_with_a_memory_tool_call(
    model_server: ModelServer, home: Path
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", section("Pydantic AI (I4)"), re.DOTALL)
    assert len(blocks) == 1
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
    model_server.reply_tool_call("memory_store", {"key": "job", "value": "nurse in Porto"})
    model_server.reply("Nice to meet you, Ana!")
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]], capture_output=True, text=True, env=env, timeout=120
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


def test_i4_p1_a_runs_first_request_takes_the_files_read_with_the_window_the_next_afresh(
    start_memory: StartMemory, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = start_memory(config_for(model_server))
    history = FermixHistory(memory, "assistant", "cli", "1", owner_id="ana", trust="operator")
    script_review_during_a_turn(model_server, memory, history.conversation, monkeypatch)
    hops = ThreadHops(monkeypatch)

    (result,) = run(turns(history, model_server, "What do I drink?"))

    assert result.output == "Tea it is."
    # The window and the files in one worker call, the tool, the second request's files
    # read afresh, the save: no hop of its own for the first request's files.
    assert hops.names == ["_messages", "run_then_review", "memory_files", "_write"]
    assert_learned_from_the_second_request(model_server, AGENT_MODEL, history.conversation, SYSTEM)


def test_i4_p1_without_the_historys_run_each_request_reads_the_files_itself(
    start_memory: StartMemory, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory_instructions alone (a host that keeps its own history) reads no files ahead."""
    memory = start_memory(config_for(model_server))
    conversation = memory.conversation("assistant", "cli", "1", owner_id="ana", trust="operator")
    script_review_during_a_turn(model_server, memory, conversation, monkeypatch)
    hops = ThreadHops(monkeypatch)
    agent = agent_on(model_server)

    result = run(
        agent.run(
            "What do I drink?",
            instructions=memory_instructions(conversation, SYSTEM),
            toolsets=[memory_toolset(memory, conversation)],
        )
    )

    assert result.output == "Tea it is."
    assert hops.names == ["memory_files", "run_then_review", "memory_files"]
    assert_learned_from_the_second_request(model_server, AGENT_MODEL, conversation, SYSTEM)


def test_i4_a_saved_message_this_version_cannot_read_is_read_as_its_litellm_form(
    memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    """A head from another version (a part kind unknown here) and the part that points at
    it come back as their litellm forms, logged, as does a part whose head is no id and a
    value that is no mapping; a well-formed head beside them (with other keys) whole."""
    conv = memory.conversation("assistant", "cli", "1", owner_id="ana", trust="operator")
    future = {"kind": "response", "parts": [{"part_kind": "hologram", "content": "x"}]}
    conv.append("assistant", "From the future.", metadata={META_KEY: {"message": future}})
    head = conv.history()[-1].id
    conv.append("tool", "its part", metadata={META_KEY: {"part_of": head}, "tool_call_id": "c"})
    conv.append("assistant", "Odd part_of.", metadata={META_KEY: {"part_of": "not an id"}})
    conv.append("assistant", "Not a mapping.", metadata={META_KEY: ["a", "list"]})
    good = ModelResponse(parts=[TextPart("Whole.")])
    dumped = ModelMessagesTypeAdapter.dump_python([good], mode="json")[0]
    conv.append("assistant", "Whole.", metadata={META_KEY: {"message": dumped}, "other": 1})

    future_read, part, odd, not_mapping, whole = model_messages(conv.history())

    for read, text in (
        (future_read, "From the future."),
        (odd, "Odd part_of."),
        (not_mapping, "Not a mapping."),
    ):
        assert isinstance(read, ModelResponse) and read.parts == [TextPart(text)]
    assert isinstance(part, ModelRequest)
    (returned,) = part.parts
    assert isinstance(returned, ToolReturnPart)
    assert (returned.content, returned.tool_call_id) == ("its part", "c")
    assert as_json([whole]) == as_json([good])
    assert f"message {head} is read as its litellm form" in caplog.text


@ANY_METADATA
@given(values=values_under(["message", "part_of", "kind", "parts"]))
def test_i4_any_value_under_the_adapters_key_reads_back_as_one_message_each(
    memory: Memory, values: list[Any]
) -> None:
    """Whatever a writer put under the adapter's key, the window reads without an error,
    each message as one ModelMessage (none of these is a head this version reads)."""
    window = stored_under(memory, META_KEY, values)
    assert len(model_messages(window)) == len(values)


def test_i4_a_part_pointing_at_its_head_by_a_string_or_a_bool_is_its_own_message(
    memory: Memory,
) -> None:
    """Only an id points a part at its head: ``"<id>"`` or ``true`` (``== 1``) does not."""
    conv = memory.conversation("assistant", "cli", "1", owner_id="ana", trust="operator")
    good = ModelResponse(parts=[TextPart("Whole.")])
    dumped = ModelMessagesTypeAdapter.dump_python([good], mode="json")[0]
    conv.append("assistant", "Whole.", metadata={META_KEY: {"message": dumped}})
    head = conv.history()[-1].id
    assert head == 1
    conv.append("assistant", "By string.", metadata={META_KEY: {"part_of": str(head)}})
    conv.append("assistant", "By bool.", metadata={META_KEY: {"part_of": True}})
    conv.append("assistant", "By id.", metadata={META_KEY: {"part_of": head}})

    messages = model_messages(conv.history())

    assert [m.parts for m in messages] == [
        good.parts,
        [TextPart("By string.")],
        [TextPart("By bool.")],
    ]
