"""The soak's host: the real actor tree under a mixed workload, until it is killed.

Run in a child forked by :mod:`soak.zygote` as ``main([HOME, MODEL_URL, SEED, ROUND])``.
Every acknowledged write is printed (one line, flushed) before anything else happens, so
what the test reads before it kills the process is a lower bound of what must survive:

- ``started`` once the tree runs;
- ``c <chat> <expiry>`` then ``C <chat> <status> <skip>``: a review claim left by the
  previous (killed) host, taken over by a ``Reviewing`` whose clock reads its expiry (E2); a
  claim taken that way expires ``CLAIM_TTL_MS`` after that clock, not after the real one;
- ``A <chat> <message id> <content>``: an acknowledged append (user message or reply);
- ``w <key> <value>`` before a memory write, ``W <key> <value> <row id>`` once acknowledged
  (``tool-*`` keys through ``memory_store``, ``write-*`` keys through the host's writer,
  ``Writer.write_rows``, which rebuilds the prompt files they show in);
- ``R <chat> <status> <skip> <error>``, ``K <chat> <status> <reason> <error>``: reviews
  and compactions (only their invariants are checked);
- ``E <where> <error>``: an error that reached a caller; the soak fails on any.

Fields are tab-separated. Threads: appenders over eight conversations of four owners (a
fifth of the turns are replies committed with a prompt-token peak, which dispatches the
post-delivery reviewer and compactor), a memory writer, a reviewer and a compactor. The
model is the loopback server; the context window is small so that compactions summarize.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from factories import config_for

from fermix import llm
from fermix.api import Conversation, Memory
from fermix.config import CompactionConfig, Config, ModelConfig
from fermix.core import categories
from fermix.errors import ModelError
from fermix.model import MemoryRow
from fermix.runtime.reviewing import Reviewing
from fermix.storage import Writes
from fermix.token_counts import count_tokens

AGENT = "soak"
CHATS = [f"c{i}" for i in range(8)]
OWNERS = [f"o{i}" for i in range(4)]
APPENDERS = 3
CONTEXT_WINDOW = 800
WORDS = ["tea", "harbour", "Porto", "nurse", "marathon", "violin", "garden", "train", "quartz"]

_out_lock = threading.Lock()


def _warm_up() -> None:
    """Load, in the zygote, what a host's first model call would load (litellm and its
    lazy imports, the token encoding): a forked host then calls the model at full speed.
    The call goes to a port nothing listens on, and fails at once."""
    count_tokens("load the encoding before forking", "openai/soak")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    route = llm.Route.from_config(
        ModelConfig(primary="openai/soak", api_base=f"http://127.0.0.1:{port}/v1", timeout_s=5)
    )
    try:
        llm.complete(route, [{"role": "user", "content": "warm up"}], agent="soak")
    except ModelError:
        pass


_warm_up()


def emit(*fields: object) -> None:
    """Print one tab-separated line and flush it before returning."""
    line = "\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def config(model_url: str) -> Config:
    """Background review off (reviews run when asked); a small context window."""
    return config_for(
        model_url,
        primary="openai/soak",
        context_window=CONTEXT_WINDOW,
        timeout_s=20,
        compaction=CompactionConfig(threshold=0.85),
    )


def conversation(memory: Memory, chat: str) -> Conversation:
    owner = OWNERS[CHATS.index(chat) % len(OWNERS)]
    return memory.conversation(AGENT, "chat", chat, owner_id=owner)


def take_over_claims(memory: Memory) -> None:
    """Review every conversation whose claim a killed reviewer left, with a clock at its
    expiry, as ``fermix memory review --now`` would then: a ``Reviewing`` of its own, on this
    host's database and writer, whose clock reads the expiry (only these reviews see it)."""
    runtime = memory._runtime
    with runtime.services.storage.read() as reads:
        claimed = [s for s in reads.conversations() if s.review_claim_token]
    for state in claimed:
        expires = state.review_claim_expires_at or 0
        services = runtime.services
        reviewing = Reviewing(
            memory.config, services.storage, services.writer, clock=lambda expires=expires: expires
        )
        emit("c", state.chat_id, expires)
        result = reviewing.review(state.key, force=True)
        emit("C", state.chat_id, result.status, result.skip, result.error)


def guarded(where: str, stop: threading.Event, work: Callable[[], None]) -> Callable[[], None]:
    """Run ``work`` until stopped; an exception that escapes it is printed as ``E``."""

    def loop() -> None:
        while not stop.is_set():
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
                emit("E", where, f"{type(exc).__name__}: {exc}")
                traceback.print_exc()
                stop.wait(0.1)

    return loop


def main(argv: list[str]) -> int:
    home, model_url, seed, round_ = argv[0], argv[1], argv[2], int(argv[3])
    memory = Memory(home, config=config(model_url)).start()
    emit("started")
    threading.Thread(target=take_over_claims, args=(memory,), daemon=True).start()
    stop = threading.Event()

    def appender(n: int) -> Callable[[], None]:
        rng = random.Random(f"{seed}/{round_}/append/{n}")
        counter = iter(range(1 << 62))

        def step() -> None:
            chat = rng.choice(CHATS)
            conv = conversation(memory, chat)
            text = f"r{round_}-t{n}-{next(counter)} " + " ".join(rng.choices(WORDS, k=6))
            if rng.random() < 0.2:
                usage = {"prompt_tokens": rng.randint(100, CONTEXT_WINDOW)}
                stored = conv.commit(text, usage=usage)
            else:
                stored = conv.append_user(text)
            emit("A", chat, stored.id, stored.content)
            stop.wait(rng.uniform(0, 0.02))

        return step

    writer_rng = random.Random(f"{seed}/{round_}/write")
    writes = iter(range(1 << 62))

    def write_step() -> None:
        chat = writer_rng.choice(CHATS)
        conv = conversation(memory, chat)
        value = f"r{round_}-{next(writes)}"
        if writer_rng.random() < 0.5:
            key = f"tool-{chat}-{writer_rng.randrange(4)}"
            emit("w", key, value)
            arguments = json.dumps({"key": key, "value": value})
            call = {"id": "call", "function": {"name": "memory_store", "arguments": arguments}}
            answer: dict[str, Any] = json.loads(memory.tools.run(call, conv))
            if "error" in answer:
                raise RuntimeError(f"memory_store refused: {answer['error']}")
            emit("W", key, value, answer["stored"]["id"])
        else:
            key = f"write-{chat}-{writer_rng.randrange(4)}"
            emit("w", key, value)

            def work(writes: Writes) -> list[MemoryRow]:
                row = writes.upsert_row(
                    agent_id=AGENT,
                    owner_id=conv.owner_id,
                    scope=categories.conversation_scope(conv.key),
                    category="context",
                    key=key,
                    value=value,
                    promote_target=None,
                )
                return [row]

            written = memory._runtime.services.writer.write_rows(work, label="soak write")
            emit("W", key, value, written.rows[0].id)
        stop.wait(writer_rng.uniform(0, 0.02))

    review_rng = random.Random(f"{seed}/{round_}/review")

    def review_step() -> None:
        chat = review_rng.choice(CHATS)
        result = memory.review(conversation(memory, chat))
        if result.status == "failed":
            raise RuntimeError(f"review of {chat} failed: {result.error}")
        emit("R", chat, result.status, result.skip, result.error)
        stop.wait(review_rng.uniform(0, 0.05))

    compact_rng = random.Random(f"{seed}/{round_}/compact")

    def compact_step() -> None:
        chat = compact_rng.choice(CHATS)
        result = memory.compact(conversation(memory, chat), force=True)
        if result.status == "failed":
            raise RuntimeError(f"compaction of {chat} failed: {result.error}")
        emit("K", chat, result.status, result.reason, result.error)
        stop.wait(compact_rng.uniform(0, 0.05))

    workers = [(f"append {n}", appender(n)) for n in range(APPENDERS)]
    workers += [("write", write_step), ("review", review_step), ("compact", compact_step)]
    threads = [
        threading.Thread(target=guarded(name, stop, step), name=name, daemon=True)
        for name, step in workers
    ]
    for thread in threads:
        thread.start()
    # Until the soak kills the process; should the test runner die first, its end of
    # stdin closes and the host ends instead of running on as an orphan.
    sys.stdin.read()
    return 0
