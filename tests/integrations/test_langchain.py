"""LangChain's chat history over a fermix conversation (I3): FermixChatMessageHistory.

Driven through langchain-core's own ``RunnableWithMessageHistory`` with its
``GenericFakeChatModel`` (langchain-openai is not installed; the LangGraph tests put a real
model call on the loopback server). langchain-tests has no standard suite for chat
histories (its ``base_store`` suite is LangChain's byte/key-value ``BaseStore``, not a
chat history), so none runs here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from factories import config_for
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from model_server import ModelServer
from server_fixtures import ServerProcess

from fermix.api import Memory
from fermix.config import MemoryConfig
from fermix.errors import AccessDeniedError, InvalidInputError
from fermix.integrations.langchain import FermixChatMessageHistory
from fermix.surface import ConversationSurface

AGENT = "assistant"

pytestmark = pytest.mark.filterwarnings(
    # langchain-core 1.8 deprecates it for LangGraph's persistence; hosts still use it.
    "ignore:RunnableWithMessageHistory is deprecated"
)


def history_of(memory: Any, chat_id: str, **keywords: Any) -> FermixChatMessageHistory:
    return FermixChatMessageHistory(
        memory.conversation(
            AGENT, "web", chat_id, owner_id=keywords.pop("owner_id", "alice"), **keywords
        )
    )


def chain_with_history(
    replies: list[AIMessage], histories: dict[str, FermixChatMessageHistory]
) -> tuple[RunnableWithMessageHistory, list[list[BaseMessage]]]:
    """A prompt and a fake chat model wrapped in RunnableWithMessageHistory; the messages
    each model call was given."""
    seen: list[list[BaseMessage]] = []

    def record(prompt: Any) -> Any:
        seen.append(list(prompt.to_messages()))
        return prompt

    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{input}")]
    )
    model = GenericFakeChatModel(messages=iter(replies))
    chain = prompt | RunnableLambda(record) | model
    runnable = RunnableWithMessageHistory(
        chain,  # type: ignore[arg-type]
        lambda session_id: histories[session_id],
        input_messages_key="input",
        history_messages_key="history",
    )
    return runnable, seen


def test_i3_runnable_with_message_history_keeps_turns_in_fermix(memory: Memory) -> None:
    histories = {"s1": history_of(memory, "rwmh")}
    runnable, seen = chain_with_history(
        [AIMessage("Hello Alice."), AIMessage("You said your name is Alice.")], histories
    )
    config: Any = {"configurable": {"session_id": "s1"}}
    assert runnable.invoke({"input": "I am Alice"}, config).content == "Hello Alice."
    runnable.invoke({"input": "Who am I?"}, config)
    # The second call saw the first turn, read back from fermix.
    assert [m.content for m in seen[1]] == [
        "You are helpful.",
        "I am Alice",
        "Hello Alice.",
        "Who am I?",
    ]
    stored = memory.conversation(AGENT, "web", "rwmh", owner_id="alice").history()
    assert [(m.role, m.owner_id, m.trust, m.content) for m in stored] == [
        ("user", "alice", "guest", "I am Alice"),
        ("assistant", "alice", "guest", "Hello Alice."),
        ("user", "alice", "guest", "Who am I?"),
        ("assistant", "alice", "guest", "You said your name is Alice."),
    ]
    assert all(isinstance(m.id, str) and m.id.isdigit() for m in histories["s1"].messages)


def test_i3_tool_calls_round_trip_and_compose_as_openai_messages(memory: Memory) -> None:
    history = history_of(memory, "tools")
    call = {"name": "lookup", "args": {"city": "Porto"}, "id": "call_1", "type": "tool_call"}
    history.add_messages(
        [
            HumanMessage("Weather in Porto?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("sunny", tool_call_id="call_1", name="lookup"),
            AIMessage("It is sunny in Porto."),
        ]
    )
    back = history.messages
    assert [type(m).__name__ for m in back] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert isinstance(back[1], AIMessage) and back[1].tool_calls == [call]
    assert isinstance(back[2], ToolMessage) and back[2].tool_call_id == "call_1"
    composed = history.conversation.compose("sys")
    assert composed[2]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"city": "Porto"}'},
        }
    ]
    assert composed[3] == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "call_1",
        "name": "lookup",
    }


def test_i3_the_ai_reply_commits_the_turn_and_the_reviewer_runs(
    start_memory: Any, model_server: ModelServer
) -> None:
    """E1, K3: an AIMessage without tool calls is ``commit``: its input tokens are the
    turn's peak, and the reviewer is dispatched after it as for a hand-written host."""
    memory = start_memory(config_for(model_server, memory=MemoryConfig()))
    model_server.reply("Nothing to save.")
    history = history_of(memory, "commit")
    reply = AIMessage(
        "Noted.", usage_metadata={"input_tokens": 321, "output_tokens": 2, "total_tokens": 323}
    )
    history.add_messages([HumanMessage("I live in Porto"), reply])
    assert model_server.wait_for_requests(1, timeout=10.0)
    state = history.conversation.state()
    assert state is not None and state.peak_prompt_tokens == 321
    assert "I live in Porto" in str(model_server.requests[0]["messages"])


def test_i3_m1_a_speaker_named_in_a_group_chat_stays_a_guest(memory: Memory) -> None:
    history = history_of(memory, "group", trust="operator")
    history.add_messages(
        [
            HumanMessage("Set the rules", additional_kwargs={}),
            HumanMessage("I like tea", name="bob", additional_kwargs={"owner_id": "bob"}),
        ]
    )
    stored = history.conversation.history()
    assert [(m.owner_id, m.trust, m.sender) for m in stored] == [
        ("alice", "operator", "alice"),
        ("bob", "guest", "bob"),
    ]


def test_i3_a_message_fermix_cannot_store_is_refused_and_nothing_of_the_batch_is(
    memory: Memory,
) -> None:
    history = history_of(memory, "refused")
    for bad in (
        SystemMessage("You are a pirate"),
        HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}]),
        AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": None}]),
    ):
        with pytest.raises(InvalidInputError):
            history.add_messages([HumanMessage("first"), bad])
    assert history.messages == []


def test_i3_k4_clear_is_fermix_clear_for_the_operator_and_refused_for_a_guest(
    memory: Memory,
) -> None:
    guest = history_of(memory, "guest-clear")
    guest.add_messages([HumanMessage("hello"), AIMessage("hi")])
    with pytest.raises(AccessDeniedError):
        guest.clear()
    assert len(guest.messages) == 2

    operator = history_of(memory, "op-clear", owner_id="root", trust="operator")
    operator.add_messages([HumanMessage("hello"), AIMessage("hi")])
    kept = operator.conversation.history()
    operator.clear()
    assert operator.messages == []
    # K5: the messages stay in SQLite, out of the window.
    assert all(memory.get_message(m.id) is not None for m in kept)


def test_i3_async_forms_store_and_read_the_same_conversation(memory: Memory) -> None:
    history = history_of(memory, "async", owner_id="root", trust="operator")

    async def run() -> list[BaseMessage]:
        await history.aadd_messages([HumanMessage("async hello"), AIMessage("async hi")])
        read = await history.aget_messages()
        await history.aclear()
        return read

    read = asyncio.run(run())
    assert [m.content for m in read] == ["async hello", "async hi"]
    assert history.messages == []


def test_i3_the_history_is_a_langchain_chat_history() -> None:
    assert issubclass(FermixChatMessageHistory, BaseChatMessageHistory)


@pytest.fixture
def remote_history(server: ServerProcess) -> Iterator[tuple[ServerProcess, Any]]:
    yield server, server.client()


@pytest.mark.slow
def test_i3_n4_the_history_over_a_client_keeps_turns_and_a_host_token_stays_guest(
    remote_history: tuple[ServerProcess, Any],
) -> None:
    _server, client = remote_history
    conv: ConversationSurface = client.conversation(AGENT, "web", "remote", owner_id="alice")
    histories = {"r": FermixChatMessageHistory(conv)}
    runnable, seen = chain_with_history([AIMessage("one"), AIMessage("two")], histories)
    config: Any = {"configurable": {"session_id": "r"}}
    runnable.invoke({"input": "first"}, config)
    runnable.invoke({"input": "second"}, config)
    assert [m.content for m in seen[1]][1:] == ["first", "one", "second"]
    stored = conv.history()
    assert [(m.role, m.trust) for m in stored] == [
        ("user", "guest"),
        ("assistant", "guest"),
        ("user", "guest"),
        ("assistant", "guest"),
    ]
    with pytest.raises(AccessDeniedError):
        histories["r"].clear()
