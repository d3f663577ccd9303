"""The time fermix adds to one memory review, against the model round trip of the same run.

Usage: ``python bench/review.py [--quick] [--reviews N] [--dir PATH]``

One review (E3-E6) reads 40 new user messages and 200 existing memory rows, asks the model
once and applies its answer. The model is ``tests/model_server.py``'s scripted server on
127.0.0.1, started in this process and answering at once, so the round trip is litellm,
the OpenAI client and loopback HTTP, nothing else. Each review goes through the path
``Memory.review(conv)`` takes, wired here as a process wires it (``Database``, ``Writer``,
``PromptFiles``, ``Reviewing``) and asked of the Reviewer actor: gate, claim, reads,
packing, prompt, the model call, parse, admission, one transaction, prompt files rebuilt
(fsync'd, a revision recorded). Every answer is real work on rows shown to that
review: three adds, two replaces and three archives, so the live rows stay at 200 and the
transaction and the rebuild write every time.

How it is measured: each review is timed whole, and the pieces inside it are timed where
they run by wrapping, for the run only, the functions the review calls:
``fermix.llm.complete`` (the model round trip), the writer's prompt-file rebuild
(``PromptFiles.rebuild_for_rows``), and ``Database.write`` for the review's claim and its
transaction. fermix's own time is
the whole review minus the model call. Target: under 50 ms (p50).

Baselines in the same run: right after each review, a bare ``llm.complete`` of the exact
prompt that review sent, answered with the same text (the round trip with no fermix
around it); and the pure phases (packing, prompt, parse, admission), each timed alone on
one more review's inputs. A warm-up of three rounds is not counted (litellm's import, the
first connection, tiktoken's encoding). The one-minute load average at start and end is
printed: on a busy machine every figure moves. The last line printed is one JSON object:
``fermix_ms`` and ``model_roundtrip_ms`` are p50s, with p50 and p99 of each beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import Stopwatch, percentile
from model_server import ModelServer
from rich.console import Console
from rich.table import Table

from fermix import llm, model
from fermix.actors.reviewer import Review, Reviewer
from fermix.config import Config, MemoryConfig, ModelConfig
from fermix.core import categories, review, review_admission, review_answer
from fermix.core.review import ReviewResult
from fermix.home import Home
from fermix.model import ConversationKey, MemoryRow, Message, NewMessage
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.reviewing import AGENT_TAG, Reviewing, shown_rows
from fermix.runtime.writer import Writer
from fermix.storage import Database, Writes

MESSAGES = 40
ROWS = 200
TARGET_MS = 50.0
WARMUP = 3
AGENT, OWNER = "agent", "alice"
_SAMPLE = (
    "I moved to Porto last spring and work night shifts as a nurse at the hospital near the "
    "river; on weekends I play piano, read about astronomy and train for a half marathon "
    "while my sister visits from Lisbon with her two kids and their very loud dog"
)
_WORDS = _SAMPLE.split()


def seed_rows(writer: Writer, rng: random.Random) -> None:
    """200 live rows the review is shown: the owner's profile and the agent's shared ones."""

    def unit(writes: Writes) -> list[MemoryRow]:
        rows = []
        for i in range(ROWS):
            profile = i < 140
            category = model.USER_CATEGORIES[i % 4] if profile else model.MEMORY_CATEGORIES[i % 2]
            scope, owner = categories.reviewer_scope(
                category, agent_id=AGENT, owner_id=OWNER, trust="operator"
            )
            rows.append(
                writes.upsert_row(
                    agent_id=AGENT,
                    owner_id=owner,
                    scope=scope,
                    category=category,
                    key=f"{category}_{i}",
                    value=" ".join(rng.choices(_WORDS, k=12)).capitalize(),
                    promote_target=model.TARGET_OF[category],
                )
            )
        return rows

    writer.write_rows(unit, label="seed", reason="seed", also=[(AGENT, OWNER)])


def review_inputs(db: Database, key: ConversationKey) -> tuple[list[Message], list[MemoryRow]]:
    """The pending user messages and the shown rows of the next review of ``key``."""
    with db.read() as reads:
        state = reads.conversation(key)
        assert state is not None
        pending = reads.messages(key, after_id=state.last_reviewed_message_id, role="user")
        return pending, shown_rows(reads, state)


def answer(rng: random.Random, ids: list[int], round_: int) -> str:
    """Three adds, two replaces and three archives, all of rows this review is shown."""
    picked = rng.sample(ids, 5)
    replaced, archived = picked[:2], picked[2:]
    words = " ".join(rng.choices(_WORDS, k=10)).capitalize()
    operations = [
        *(
            {"op": "add", "category": c, "key": f"r{round_}_{c}", "value": words}
            for c in ("identity", "goal", "context")
        ),
        *({"op": "replace", "id": i, "value": f"{words} (round {round_})"} for i in replaced),
        *({"op": "archive", "id": i, "reason": "stale"} for i in archived),
    ]
    return json.dumps({"operations": operations})


def say(writer: Writer, key: ConversationKey, rng: random.Random) -> None:
    for _ in range(MESSAGES):
        text = " ".join(rng.choices(_WORDS, k=rng.randint(15, 45)))
        writer.append(NewMessage(key, "user", text, owner_id=OWNER, sender=OWNER), trust="operator")


def timed_ms(work: Callable[[], object], repeat: int = 20) -> float:
    """Median wall time of ``work`` in milliseconds."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def pure_phases(
    pending: list[Message], shown: list[MemoryRow], text: str, model: str
) -> dict[str, float]:
    """The pure steps of one review, each timed alone on that review's inputs."""
    cfg = MemoryConfig()

    def pack() -> list[Message]:
        return review.pack_messages(
            pending,
            max_messages=cfg.review_max_messages,
            token_budget=cfg.review_input_token_budget,
            model=model,
        )

    packed = pack()
    operations = review_answer.parse(text)
    return {
        "pack_ms": timed_ms(pack),
        "prompt_ms": timed_ms(lambda: review.build_prompt(packed, shown)),
        "parse_ms": timed_ms(lambda: review_answer.parse(text)),
        "admit_ms": timed_ms(
            lambda: review_admission.admit(operations, shown=shown, trust="operator")
        ),
    }


def run(reviews: int, directory: str | None) -> dict[str, Any]:
    rng = random.Random(5)
    figures: dict[str, list[float]] = defaultdict(list)
    load = [os.getloadavg()[0]]
    watch = Stopwatch()
    with (
        ModelServer() as server,
        tempfile.TemporaryDirectory(dir=directory, prefix="fermix-bench-review-") as tmp,
    ):
        home = Path(tmp)
        config = Config(
            model=ModelConfig(primary="openai/bench", api_base=server.url, timeout_s=30)
        )
        db = Database(home / "memory.db")
        writer = Writer(db, PromptFiles(Home(home), db))
        reviewing = Reviewing(config, db, writer)
        actor = Reviewer.start(reviewing)
        try:
            seed_rows(writer, rng)
            route = reviewing.route
            key = ConversationKey(AGENT, "bench", "1")
            with ExitStack() as wrapped:
                wrapped.enter_context(watch.wrapping(llm, "complete", "model"))
                wrapped.enter_context(watch.wrapping(writer.files, "rebuild_for_rows", "rebuild"))
                wrapped.enter_context(
                    watch.wrapping(
                        db, "write", "writes", lambda *a, label="", **k: label.startswith("review")
                    )
                )
                for round_ in range(WARMUP + reviews):
                    say(writer, key, rng)
                    text = answer(rng, [r.id for r in review_inputs(db, key)[1]], round_)
                    server.reply(text)
                    mark = watch.mark()
                    started = time.perf_counter()
                    result: ReviewResult = actor.ask(Review(key, force=True))
                    total = (time.perf_counter() - started) * 1000
                    if result.status != "applied" or result.refused or result.messages != MESSAGES:
                        raise SystemExit(
                            f"review {round_} did not do the benchmark's work: {result}"
                        )
                    model = watch.since(mark, "model")
                    pieces = {name: watch.since(mark, name) for name in ("rebuild", "writes")}
                    # baseline, right after: the prompt this review sent, bare, same answer
                    prompt = server.requests[-1]["messages"]
                    server.reply(text)
                    started = time.perf_counter()
                    llm.complete(
                        route,
                        prompt,
                        agent=AGENT_TAG,
                        response_format=review_answer.RESPONSE_SCHEMA,
                    )
                    bare = (time.perf_counter() - started) * 1000
                    if round_ >= WARMUP:
                        figures["fermix_ms"].append(total - model)
                        figures["model_ms"].append(model)
                        figures["total_ms"].append(total)
                        figures["bare_ms"].append(bare)
                        figures["rebuild_ms"].append(pieces["rebuild"])
                        figures["writes_ms"].append(pieces["writes"])
                        figures["rest_ms"].append(total - model - sum(pieces.values()))
            shown = len(json.loads(prompt[1]["content"])["existing_rows"])
            say(writer, key, rng)
            pending, rows = review_inputs(db, key)
            phases = pure_phases(pending[-MESSAGES:], rows, text, route.primary or "")
        finally:
            actor.stop()
            db.close()
    load.append(os.getloadavg()[0])
    return {**figures, "phases": phases, "shown_rows": shown, "load": load}


ROWS_SHOWN = {
    "fermix_ms": "fermix's own time (whole review - model)",
    "  rebuild_ms": "prompt files rebuilt, fsync'd, revisions",
    "  writes_ms": "claim + the review's transaction",
    "  rest_ms": "reads, pack, prompt, parse, admit, actor",
    "model_ms": "the model call inside each review",
    "total_ms": "Reviewer.ask(Review(key)), whole",
    "bare_ms": "baseline: bare llm.complete, same prompt",
}


def render(console: Console, figures: dict[str, Any], reviews: int) -> None:
    title = f"one review: {MESSAGES} messages, {figures['shown_rows']} rows, {reviews} reviews"
    table = Table(title=title)
    for column in ("measure", "p50 ms", "p99 ms", "what"):
        table.add_column(column, justify="left" if column in ("measure", "what") else "right")
    for label, note in ROWS_SHOWN.items():
        values = figures[label.strip()]
        p50, p99 = percentile(values, 50), percentile(values, 99)
        table.add_row(label, f"{p50:.2f}", f"{p99:.2f}", note)
    for name, value in figures["phases"].items():
        table.add_row(f"  {name}", f"{value:.3f}", "", "pure phase, timed alone")
    console.print(table)
    ok = percentile(figures["fermix_ms"], 50) < TARGET_MS
    load = " -> ".join(f"{x:.2f}" for x in figures["load"])
    console.print(
        f"target: fermix_ms p50 < {TARGET_MS:g} ms: {'met' if ok else 'MISSED'}"
        f" (load average {load})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 reviews instead of 30")
    parser.add_argument("--reviews", type=int, help="number of timed reviews")
    parser.add_argument("--dir", help="where the temporary home goes (default: the system's)")
    args = parser.parse_args(argv)
    reviews = args.reviews or (5 if args.quick else 30)
    figures = run(reviews, args.dir)
    render(Console(), figures, reviews)

    def p(name: str, q: float) -> float:
        return round(percentile(figures[name], q), 3)

    summary = {
        "bench": "review",
        "reviews": reviews,
        "messages": MESSAGES,
        "shown_rows": figures["shown_rows"],
        "fermix_ms": p("fermix_ms", 50),
        "model_roundtrip_ms": p("model_ms", 50),
        "fermix_ms_p50": p("fermix_ms", 50),
        "fermix_ms_p99": p("fermix_ms", 99),
        "model_roundtrip_ms_p50": p("model_ms", 50),
        "model_roundtrip_ms_p99": p("model_ms", 99),
        "bare_model_roundtrip_ms_p50": p("bare_ms", 50),
        "bare_model_roundtrip_ms_p99": p("bare_ms", 99),
        "review_total_ms_p50": p("total_ms", 50),
        "rebuild_ms_p50": p("rebuild_ms", 50),
        "writes_ms_p50": p("writes_ms", 50),
        "rest_ms_p50": p("rest_ms", 50),
        "phases_ms": {k: round(v, 3) for k, v in figures["phases"].items()},
        "target_ms": TARGET_MS,
        "within_target": p("fermix_ms", 50) < TARGET_MS,
        "load_avg_1m": [round(x, 2) for x in figures["load"]],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
