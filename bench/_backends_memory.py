"""(e) of bench/backends.py: the reviewer's and the compactor's own work on ``fermix.Memory``
over each backend.

A helper module (its name starts with ``_``): bench/run.py does not run it.

Each backend gets a ``fermix.Memory`` on a temporary home, the PostgreSQL one with
``[fermix_core.storage] url`` set to a fresh database of the benchmark's server (SQLite:
``memory.db`` in the home), embedding off (no background embedder competing with the
measures), and the model of ``tests/model_server.py`` (imported by its path) on 127.0.0.1,
answering at once. fermix's own time is the whole ``Memory.review`` / ``Memory.compact``
minus the model call as it ran inside it (``fermix.llm.complete``, timed where it runs),
as bench/review.py and bench/compact.py count it:

- a review takes 40 new user messages (LoCoMo turns) of its conversation and applies three
  adds; a review is forced (``force=True``);
- a compaction summarizes a conversation of its own holding about 100,000 tokens in 400
  messages (LoCoMo turns joined), with the model's context window set to 120,000, forced.

The backends alternate round by round, in a rotating order, after warm-up rounds that are
not counted. A backend that cannot run it (the PostgreSQL adapter without the memory rows'
or prompt files' operations yet) gives no figures and the reason, in one line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from _timing import Stopwatch, percentile

from fermix import Memory, llm

REPO = Path(__file__).resolve().parents[1]
MODEL_SERVER = REPO / "tests" / "model_server.py"
AGENT, OWNER = "bench", "alice"
REVIEW_MESSAGES = 40
COMPACT_MESSAGES = 400
COMPACT_TOKENS = 100_000
CONTEXT_WINDOW = 120_000


def model_server_module() -> ModuleType:
    """``tests/model_server.py``, imported by its path (bench/ does not import tests/)."""
    found = sys.modules.get("model_server")
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location("model_server", MODEL_SERVER)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {MODEL_SERVER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_server"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class OwnWork:
    """One backend's review and compaction times (ms): fermix's own and the model's."""

    review_own: list[float] = field(default_factory=list)
    review_model: list[float] = field(default_factory=list)
    compact_own: list[float] = field(default_factory=list)
    compact_model: list[float] = field(default_factory=list)
    error: str | None = None

    def figures(self, name: str) -> dict[str, Any]:
        """This backend's keys of the JSON line (null when it could not run)."""

        def p(values: list[float], q: float) -> float | None:
            return round(percentile(values, q), 2) if values and self.error is None else None

        return {
            f"memory_review_own_ms_{name}": p(self.review_own, 50),
            f"memory_review_own_p99_ms_{name}": p(self.review_own, 99),
            f"memory_review_model_ms_{name}": p(self.review_model, 50),
            f"memory_compact_own_ms_{name}": p(self.compact_own, 50),
            f"memory_compact_own_p99_ms_{name}": p(self.compact_own, 99),
            f"memory_compact_model_ms_{name}": p(self.compact_model, 50),
            f"memory_error_{name}": self.error,
        }


def config_for(server_url: str, storage_url: str | None) -> Any:
    """The configuration of one backend's ``Memory``: the loopback model, no embedding,
    and the store (``storage_url`` None: ``memory.db`` in the home)."""
    from fermix.config import Config, EmbeddingConfig, ModelConfig, StorageConfig

    return Config(
        model=ModelConfig(primary="openai/bench", api_base=server_url, timeout_s=30),
        embedding=EmbeddingConfig(enabled=False),
        storage=StorageConfig(url=storage_url),
    )


def fill_review(conv: Any, texts: Sequence[str], start: int) -> None:
    """40 user messages for the next review, through the public API."""
    for i in range(REVIEW_MESSAGES):
        conv.append_user(texts[(start + i) % len(texts)])


def fill_compaction(conv: Any, texts: Sequence[str], start: int) -> None:
    """About :data:`COMPACT_TOKENS` tokens in :data:`COMPACT_MESSAGES` turns, alternating."""
    per_message = COMPACT_TOKENS * 4 // COMPACT_MESSAGES  # ~4 characters a token
    cursor = start
    for i in range(COMPACT_MESSAGES):
        parts: list[str] = []
        while sum(len(p) + 1 for p in parts) < per_message:
            parts.append(texts[cursor % len(texts)])
            cursor += 1
        text = " ".join(parts)
        if i % 2 == 0:
            conv.append_user(text)
        else:
            conv.append_assistant(text)


def review_answer(round_: int) -> str:
    """Three adds, new keys each round."""
    return json.dumps(
        {
            "operations": [
                {
                    "op": "add",
                    "category": category,
                    "key": f"r{round_}_{category}",
                    "value": f"Round {round_}: a fact about the user's {category}",
                }
                for category in ("identity", "goal", "context")
            ]
        }
    )


SUMMARY = " ".join(["The user and the assistant talked about plans, places and people."] * 30)


class Backend:
    """One backend's running ``Memory`` and its figures."""

    def __init__(self, name: str, memory: Memory, server: Any, work: OwnWork) -> None:
        self.name = name
        self.memory = memory
        self.server = server
        self.work = work
        self.review_conv = memory.conversation(
            AGENT, "review", "1", owner_id=OWNER, trust="operator"
        )

    def round(self, watch: Stopwatch, texts: Sequence[str], n: int, counted: bool) -> None:
        """One review and one compaction, each timed whole and its model call apart."""
        server = self.server
        fill_review(self.review_conv, texts, n * REVIEW_MESSAGES)
        server.reply(review_answer(n))
        mark = watch.mark()
        started = time.perf_counter()
        reviewed = self.memory.review(self.review_conv, force=True)
        total = (time.perf_counter() - started) * 1000
        if reviewed.status != "applied" or reviewed.added != 3:
            raise RuntimeError(f"review {n}: {reviewed.status} {reviewed.error or ''}")
        model = watch.since(mark, "model")
        if counted:
            self.work.review_own.append(total - model)
            self.work.review_model.append(model)
        conv = self.memory.conversation(AGENT, "compact", f"c{n}", owner_id=OWNER, trust="operator")
        fill_compaction(conv, texts, n * 997)
        server.reply(SUMMARY)
        mark = watch.mark()
        started = time.perf_counter()
        compacted = self.memory.compact(conv, force=True)
        total = (time.perf_counter() - started) * 1000
        if compacted.status != "compacted":
            raise RuntimeError(
                f"compaction {n}: {compacted.status} {compacted.reason} {compacted.error or ''}"
            )
        model = watch.since(mark, "model")
        if counted:
            self.work.compact_own.append(total - model)
            self.work.compact_model.append(model)


def own_work(
    storage_urls: dict[str, str | None], texts: Sequence[str], rounds: int, warmup: int
) -> dict[str, OwnWork]:
    """(e) on each backend of ``storage_urls`` (name: PostgreSQL URL, or None for SQLite)."""
    results = {name: OwnWork() for name in storage_urls}
    watch = Stopwatch()
    with contextlib.ExitStack() as stack:
        stack.enter_context(watch.wrapping(llm, "complete", "model"))
        backends: list[Backend] = []
        for name, url in storage_urls.items():
            try:
                # A model server of its own: a backend that fails leaves no answer queued.
                server = stack.enter_context(model_server_module().ModelServer())
                home = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix=f"fermix-bench-{name}-")
                )
                memory = Memory(
                    home, config=config_for(server.url, url), context_window=CONTEXT_WINDOW
                )
                stack.enter_context(_started(memory))
                backends.append(Backend(name, memory, server, results[name]))
            except Exception as exc:  # noqa: BLE001 - this backend cannot run (e): say why
                results[name].error = _reason(exc)
        for n in range(warmup + rounds):
            shift = n % max(1, len(backends))
            for backend in backends[shift:] + backends[:shift]:
                if backend.work.error is not None:
                    continue
                try:
                    backend.round(watch, texts, n, counted=n >= warmup)
                except Exception as exc:  # noqa: BLE001 - this backend cannot run (e): say why
                    backend.work.error = _reason(exc)
    return results


@contextlib.contextmanager
def _started(memory: Memory) -> Iterator[Memory]:
    with memory:
        yield memory


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
