"""What a turn costs through each framework adapter, against the same turn through fermix's
API, in one run, with the model's time taken out (issue 23, I2-I4).

Usage: ``python bench/integrations.py [--quick]``

Every system runs on one embedded ``Memory`` in a temporary home (reviews off, so no model
is called behind the turns), with a model that answers at once in the process: the
framework's own test model where it has one (Pydantic AI's ``FunctionModel``, LangChain's
``GenericFakeChatModel``), a ``Model`` of the Agents SDK's interface that returns a fixed
message. Turns go round-robin over the systems (``--quick``: 40 each, else 400), each
round in an order of its own (seeded), each system in conversations of its own that grow
to 20 turns, so every window is as long.

- ``api_turn_ms``: the README's hand-written turn: ``preflight``, ``append_user``,
  ``compose`` (the system prompt, the fenced memory block, the window), the model,
  ``commit``; ``api_async_turn_ms``: the same turn as an asyncio host writes it, each of
  the four calls through ``asyncio.to_thread`` (fermix's calls wait for a commit, so an
  event loop must not make them itself), the baseline of the two asyncio frameworks;
- for each adapter, its turn through the framework's own loop (``<adapter>_turn_ms``),
  the same loop with no fermix (``<adapter>_alone_ms``: no session, history or store, the
  system prompt as its instructions), and the adapter's own cost: the time the turn spent
  inside the adapter's entry points that the framework calls, fermix's calls included
  (``<adapter>_cost_ms``; what the framework does with what they return, such as the
  Agents SDK copying the history items, is the framework's, as it would be with its own
  memory); its ratio is that cost over the hand-written turn of the same kind of host,
  ``api_async_turn_ms`` for the Agents SDK and Pydantic AI (asyncio), ``api_turn_ms`` for
  LangChain (target <= 1.2 each):
  - ``openai_agents``: ``Runner.run`` with ``FermixSession``: ``get_items`` (preflight,
    the window), ``add_items`` (the input, the reply and the commit) and its instructions
    (the memory block);
  - ``pydantic_ai``: ``FermixHistory.run``: ``messages`` (preflight, the window),
    ``save`` (the new messages and the commit) and its instructions;
  - ``langchain``: ``RunnableWithMessageHistory`` over ``FermixChatMessageHistory``:
    ``messages`` and ``add_messages`` (the framework alone over LangChain's
    ``InMemoryChatMessageHistory``); it has no memory block to compose;
  - ``langgraph``: a turn of a host's store use, a search of the owner's items and a put,
    through ``FermixStore.batch`` against the same two calls on ``Memory``
    (``recall_rows`` with the store's filters, ``put_row``).

Hermes Agent's provider runs in a venv of its own and the TypeScript middleware in Node:
neither is measured here yet (their tests drive them end to end).

The last line printed is one JSON object: each ``<adapter>_ratio_vs_api`` and
``max_ratio_vs_api``, the worst of them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.store.base import PutOp, SearchOp
from openai.types.responses import ResponseOutputMessage, ResponseOutputText
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, TextPart
from pydantic_ai.messages import ModelResponse as PydanticResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from rich.console import Console

from fermix.api import Memory
from fermix.config import Config, MemoryConfig
from fermix.integrations.langchain import FermixChatMessageHistory
from fermix.integrations.langgraph import FermixStore
from fermix.integrations.openai_agents import FermixSession
from fermix.integrations.pydantic_ai import FermixHistory
from fermix.model import Scope

AGENT = "assistant"
SYSTEM = "You are a helpful assistant."
REPLY = "Noted: the harbour trains leave at nine."
TURNS_PER_CHAT = 20


def _text(i: int) -> str:
    return f"message {i}: I take the harbour train at nine and my sister lives in Porto"


class _InstantModel(Model):
    """The Agents SDK's model interface, answering every call with :data:`REPLY` at once."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        text = ResponseOutputText(type="output_text", text=REPLY, annotations=[])
        message = ResponseOutputMessage(
            id="msg_bench", type="message", role="assistant", status="completed", content=[text]
        )
        usage = Usage(requests=1, input_tokens=200, output_tokens=10, total_tokens=210)
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the benchmark does not stream")


def _instant(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
    return PydanticResponse(parts=[TextPart(REPLY)])


class Stopwatch:
    """The time spent inside the wrapped calls since :meth:`reset`, in seconds."""

    def __init__(self) -> None:
        self.spent = 0.0

    def reset(self) -> None:
        self.spent = 0.0

    def sync(self, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - started

        return timed

    def coroutine(self, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)  # the SDK reads the wrapped method's signature (wrapper=)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                self.spent += time.perf_counter() - started

        return timed


class _TimedHistory(FermixChatMessageHistory):
    """The LangChain history with its two entry points timed."""

    watch: Stopwatch

    @property
    def messages(self) -> list[Any]:  # type: ignore[override]
        started = time.perf_counter()
        try:
            return super().messages
        finally:
            self.watch.spent += time.perf_counter() - started

    def add_messages(self, messages: Any) -> None:
        started = time.perf_counter()
        try:
            super().add_messages(messages)
        finally:
            self.watch.spent += time.perf_counter() - started


class Systems:
    """Each system's turn for chat ``chat`` and message ``i``."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.watch = Stopwatch()
        self.loop = asyncio.new_event_loop()
        self.agents_model = _InstantModel()
        self.pydantic_agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(_instant))
        self.store = FermixStore(memory, AGENT)
        self.plain: dict[str, InMemoryChatMessageHistory] = {}
        prompt = ChatPromptTemplate.from_messages(
            [("system", SYSTEM), MessagesPlaceholder("history"), ("human", "{input}")]
        )
        chat_model = GenericFakeChatModel(messages=itertools.repeat(AIMessage(REPLY)))
        self.fermix_chain = RunnableWithMessageHistory(
            prompt | chat_model,
            self._history,
            input_messages_key="input",
            history_messages_key="history",
        )
        self.plain_chain = RunnableWithMessageHistory(
            prompt | chat_model,
            lambda chat: self.plain.setdefault(chat, InMemoryChatMessageHistory()),
            input_messages_key="input",
            history_messages_key="history",
        )

    def _history(self, chat: str) -> FermixChatMessageHistory:
        conv = self.memory.conversation(AGENT, "langchain", chat, owner_id=f"owner-{chat}")
        history = _TimedHistory(conv)
        history.watch = self.watch
        return history

    def api(self, chat: str, i: int) -> None:
        conv = self.memory.conversation(AGENT, "api", chat, owner_id=f"owner-{chat}")
        conv.preflight()
        conv.append_user(_text(i))
        conv.compose(system=SYSTEM)
        conv.commit(REPLY, usage={"prompt_tokens": 200})

    def api_async(self, chat: str, i: int) -> None:
        conv = self.memory.conversation(AGENT, "api-async", chat, owner_id=f"owner-{chat}")

        async def turn() -> None:
            await asyncio.to_thread(conv.preflight)
            await asyncio.to_thread(conv.append_user, _text(i))
            await asyncio.to_thread(conv.compose, SYSTEM)
            await asyncio.to_thread(conv.commit, REPLY, {"prompt_tokens": 200})

        self.loop.run_until_complete(turn())

    def openai_agents(self, chat: str, i: int) -> None:
        watch = self.watch
        session = watch.sync(FermixSession)(
            self.memory, AGENT, "agents", chat, owner_id=f"owner-{chat}"
        )
        session.get_items = watch.coroutine(session.get_items)  # type: ignore[method-assign]
        session.add_items = watch.coroutine(session.add_items)  # type: ignore[method-assign]
        instructions = watch.coroutine(session.instructions(SYSTEM))
        agent = Agent(name="bench", model=self.agents_model, instructions=instructions)
        self.loop.run_until_complete(Runner.run(agent, _text(i), session=session))

    def openai_agents_alone(self, chat: str, i: int) -> None:
        agent = Agent(name="bench", model=self.agents_model, instructions=SYSTEM)
        self.loop.run_until_complete(Runner.run(agent, _text(i)))

    def pydantic_ai(self, chat: str, i: int) -> None:
        watch = self.watch
        history = watch.sync(FermixHistory)(
            self.memory, AGENT, "pydantic", chat, owner_id=f"owner-{chat}"
        )
        history.messages = watch.coroutine(history.messages)  # type: ignore[method-assign]
        history.save = watch.coroutine(history.save)  # type: ignore[method-assign]
        instructions = watch.coroutine(history.instructions(SYSTEM))
        run = history.run(self.pydantic_agent, _text(i), instructions=instructions)
        self.loop.run_until_complete(run)

    def pydantic_ai_alone(self, chat: str, i: int) -> None:
        self.loop.run_until_complete(self.pydantic_agent.run(_text(i), instructions=SYSTEM))

    def langchain(self, chat: str, i: int) -> None:
        config = {"configurable": {"session_id": chat}}
        self.fermix_chain.invoke({"input": _text(i)}, config=config)  # type: ignore[arg-type]

    def langchain_alone(self, chat: str, i: int) -> None:
        config = {"configurable": {"session_id": chat}}
        self.plain_chain.invoke({"input": _text(i)}, config=config)  # type: ignore[arg-type]

    def langgraph(self, chat: str, i: int) -> None:
        namespace = ("owner", f"owner-store-{chat}")  # as the API's: an owner with rows only
        self.store.batch(
            [
                SearchOp(namespace, query=_text(i), limit=5),
                PutOp(namespace, f"note-{i}", {"text": _text(i)}),
            ]
        )

    def langgraph_api(self, chat: str, i: int) -> None:
        owner = f"owner-api-{chat}"
        scope = Scope("owner", owner)
        self.memory.recall_rows(_text(i), agent_id=AGENT, owner_id=owner, scope=scope, limit=5)
        self.memory.put_row(
            AGENT,
            f"note-{i}",
            json.dumps({"text": _text(i)}),
            scope=scope,
            owner_id=owner,
        )


def measure(turns: int, console: Console) -> dict[str, Any]:
    """Every figure (see the module's docstring)."""
    set_tracing_disabled(True)
    config = Config(memory=MemoryConfig(review_interval_hours=0))
    with tempfile.TemporaryDirectory(prefix="fermix-integrations-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        with Memory(home, config=config) as memory:
            systems = Systems(memory)
            runs: dict[str, Callable[[str, int], None]] = {
                "api": systems.api,
                "api_async": systems.api_async,
                "openai_agents": systems.openai_agents,
                "openai_agents_alone": systems.openai_agents_alone,
                "pydantic_ai": systems.pydantic_ai,
                "pydantic_ai_alone": systems.pydantic_ai_alone,
                "langchain": systems.langchain,
                "langchain_alone": systems.langchain_alone,
                "langgraph": systems.langgraph,
                "langgraph_api": systems.langgraph_api,
            }
            times: dict[str, list[float]] = {name: [] for name in runs}
            inside: dict[str, list[float]] = {name: [] for name in runs}
            for run in runs.values():  # warm every path once: imports, first reads
                run("warm", 0)
            names = list(runs)
            order = random.Random(23)
            for i in range(turns):
                chat = f"c{i // TURNS_PER_CHAT}"
                # Each round in another order: what one system leaves running in the
                # background (the indexer embedding its messages) falls on every other alike.
                order.shuffle(names)
                for name in names:
                    run = runs[name]
                    systems.watch.reset()
                    started = time.perf_counter()
                    run(chat, i)
                    times[name].append((time.perf_counter() - started) * 1000)
                    inside[name].append(systems.watch.spent * 1000)
                if (i + 1) % 100 == 0:
                    console.print(f"  {i + 1} turns of each")
            systems.loop.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    median_inside = {name: statistics.median(values) for name, values in inside.items()}
    figures: dict[str, Any] = {
        "turns": turns,
        "api_turn_ms": round(median["api"], 3),
        "api_async_turn_ms": round(median["api_async"], 3),
    }
    ratios = {}
    baseline = {"openai_agents": "api_async", "pydantic_ai": "api_async", "langchain": "api"}
    for adapter, against in baseline.items():
        alone = median[f"{adapter}_alone"]
        cost = median_inside[adapter]
        figures[f"{adapter}_turn_ms"] = round(median[adapter], 3)
        figures[f"{adapter}_alone_ms"] = round(alone, 3)
        figures[f"{adapter}_cost_ms"] = round(cost, 3)
        ratios[adapter] = cost / median[against]
    figures["langgraph_store_ms"] = round(median["langgraph"], 3)
    figures["langgraph_api_ms"] = round(median["langgraph_api"], 3)
    ratios["langgraph"] = median["langgraph"] / median["langgraph_api"]
    for adapter, ratio in ratios.items():
        figures[f"{adapter}_ratio_vs_api"] = round(ratio, 3)
    figures["max_ratio_vs_api"] = round(max(ratios.values()), 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 turns of each, not 400")
    args = parser.parse_args()
    console = Console(stderr=True)
    figures = measure(40 if args.quick else 400, console)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
