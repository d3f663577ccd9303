"""The time fermix adds to one memory review, against the model round trip of the same run.

Usage: ``python bench/review.py [--quick] [--reviews N] [--dir PATH]``

Two cases. **One owner**: one review (E3-E6) reads 40 new user messages and the rows of 200
that fit its rows budget (M6), asks the model once and applies its answer. **1,000 owners
sharing an agent** (M6): the same review, whose answer changes shared rows, so every owner's
MEMORY.md changes; see :func:`run_shared` below.

The one-owner case: The model is ``tests/model_server.py``'s scripted server on
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
printed: on a busy machine every figure moves.

The 1,000-owner case: an agent whose 1,000 owners all have prompt files, 200 shared rows, and
a conversation of one of them (an operator) whose review answer adds, replaces and archives
shared rows. Each review is a background review (``Review(key)`` as the dispatch after a
turn sends it, its clock moved past the interval): the conversation's own owner and the
agent's default owner are rebuilt at once, the other 999 owners by the prompt files'
background thread (M6). Timed: fermix's own work per review (whole review minus the model
call, target under 50 ms p50); how long the background rebuilds take; one owner's rebuild;
and the latency of appends that a second thread makes to another conversation about every
millisecond while the review and the background rebuilds run, against the same appends
with nothing else running just before (idle, half a second per review). The target: appends
during the review and the background rebuilds are not delayed by more than one rebuild: the
p99 of their latency, minus the idle p99, is at most the p99 of one owner's rebuild (a p99
against a p99: an append that arrives during a rebuild waits for what is left of it). The
same delays against one rebuild's p50 are printed too. Baseline in the same run: the same
review with every owner rebuilt at once on the reviewer's thread, as before M6
(``Reviewing(defer_other_owners=False)``), and the appends during it; and, as a yardstick,
the appends while another thread runs pure Python (no fermix) for as long as a review
takes: what the GIL alone costs an append beside any CPU-bound work of a host's process.

The last line printed is one JSON object: ``fermix_ms`` and ``model_roundtrip_ms`` are p50s
of the one-owner case, with p50 and p99 of each beside them; the ``shared_*`` and
``append_*`` keys are the 1,000-owner case's, ``eager_*`` its baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
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
from fermix.runtime.review_inputs import shown_rows
from fermix.runtime.reviewing import AGENT_TAG, Reviewing
from fermix.runtime.writer import Writer
from fermix.storage import Writes
from fermix.storage.sqlite.database import Database

MESSAGES = 40
ROWS = 200
TARGET_MS = 50.0
WARMUP = 3
OWNERS = 1000
SHARED_ROWS = 200
APPEND_EVERY_S = 0.001
IDLE_S = 0.5
HOUR_MS = 3_600_000
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


def review_inputs(
    db: Database, key: ConversationKey, config: Config
) -> tuple[list[Message], list[MemoryRow]]:
    """The user messages and the shown rows of the next review of ``key``, chosen as that
    review chooses them (M5, M6)."""
    cfg, model_name = config.memory, config.model.primary
    with db.read() as reads:
        state = reads.conversation(key)
        assert state is not None
        pending, _count = reads.review_backlog(
            key,
            after_id=state.last_reviewed_message_id,
            up_to=reads.newest_user_message_id(key),
            limit=cfg.review_max_messages,
        )
        packed = review.pack_backlog(
            pending,
            max_messages=cfg.review_max_messages,
            token_budget=cfg.review_input_token_budget,
            model=model_name,
        ).messages
        rows = shown_rows(
            reads, state, packed, token_budget=cfg.review_rows_token_budget, model_name=model_name
        )
        return packed, rows


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


def say(writer: Writer, key: ConversationKey, rng: random.Random, owner: str = OWNER) -> None:
    for _ in range(MESSAGES):
        text = " ".join(rng.choices(_WORDS, k=rng.randint(15, 45)))
        writer.append(NewMessage(key, "user", text, owner_id=owner, sender=owner), trust="operator")


def timed_ms(work: Callable[[], object], repeat: int = 20) -> float:
    """Median wall time of ``work`` in milliseconds."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def pure_phases(
    pending: list[Message],
    shown: list[MemoryRow],
    text: str,
    model: str,
    select: Callable[[], list[MemoryRow]],
) -> dict[str, float]:
    """The pure steps of one review, each timed alone on that review's inputs, and the
    reads of its inputs (the messages, and its rows chosen by full-text search, the newest
    and the budget)."""
    cfg = MemoryConfig()

    def pack() -> review.Packed:
        return review.pack_backlog(
            pending,
            max_messages=cfg.review_max_messages,
            token_budget=cfg.review_input_token_budget,
            model=model,
        )

    packed = pack().messages
    operations = review_answer.parse(text)
    return {
        "pack_ms": timed_ms(pack),
        "read_inputs_ms": timed_ms(select),
        "prompt_ms": timed_ms(lambda: review.build_prompt(packed, shown)),
        "parse_ms": timed_ms(lambda: review_answer.parse(text)),
        "admit_ms": timed_ms(
            lambda: review_admission.admit(operations, shown=shown, trust="operator")
        ),
    }


def run(reviews: int, directory: str | None) -> dict[str, Any]:
    """The one-owner case."""
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
                    text = answer(rng, [r.id for r in review_inputs(db, key, config)[1]], round_)
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
            pending, rows = review_inputs(db, key, config)
            phases = pure_phases(
                pending, rows, text, route.primary or "", lambda: review_inputs(db, key, config)[1]
            )
        finally:
            actor.stop()
            db.close()
    load.append(os.getloadavg()[0])
    return {**figures, "phases": phases, "shown_rows": shown, "load": load}


# -- 1,000 owners sharing an agent (M6) -------------------------------------------------

CROWD = "crowd"


def seed_crowd(db: Database, files: PromptFiles, rng: random.Random, owners: int) -> None:
    """``owners`` owners of agent ``crowd`` with two profile rows each and prompt files, and
    :data:`SHARED_ROWS` shared rows every one of them renders."""

    def unit(writes: Writes) -> list[MemoryRow]:
        rows = []
        for i in range(SHARED_ROWS):
            category = model.MEMORY_CATEGORIES[i % 2]
            rows.append(
                writes.upsert_row(
                    agent_id=CROWD,
                    owner_id="",
                    scope=categories.agent_scope(CROWD),
                    category=category,
                    key=f"shared_{i}",
                    value=" ".join(rng.choices(_WORDS, k=10)).capitalize(),
                    promote_target=model.TARGET_OF[category],
                )
            )
        for n in range(owners):
            owner = f"user{n:04d}"
            for category in ("identity", "preference"):
                rows.append(
                    writes.upsert_row(
                        agent_id=CROWD,
                        owner_id=owner,
                        scope=categories.owner_scope(owner),
                        category=category,
                        key=category,
                        value=f"{owner} " + " ".join(rng.choices(_WORDS, k=6)),
                        promote_target=model.TARGET_OF[category],
                    )
                )
        return rows

    db.write(unit, label="seed")
    files.rebuild_agent(CROWD, reason="seed")


def shared_answer(rng: random.Random, shown: list[MemoryRow], round_: int) -> str:
    """An add, a replace and an archive of shared rows: every owner's MEMORY.md changes."""
    shared = [r for r in shown if r.owner_id == "" and r.category == "context"]
    replaced, archived = rng.sample([r.id for r in shared], 2)
    words = " ".join(rng.choices(_WORDS, k=8)).capitalize()
    return json.dumps(
        {
            "operations": [
                {"op": "add", "category": "context", "key": f"r{round_}", "value": words},
                {"op": "replace", "id": replaced, "value": f"{words} (round {round_})"},
                {"op": "archive", "id": archived, "reason": "stale"},
            ]
        }
    )


class Appender:
    """Appends to its own conversation about every :data:`APPEND_EVERY_S` on a thread of its
    own, recording when each append started and how long it took (ms)."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._key = ConversationKey(CROWD, "bench", "appender")
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="appender")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            new = NewMessage(self._key, "user", f"append {n}", owner_id="user0001")
            started = time.perf_counter()
            self._writer.append(new, trust="operator")
            self.samples.append((started, (time.perf_counter() - started) * 1000))
            n += 1
            self._stop.wait(APPEND_EVERY_S)

    def __enter__(self) -> Appender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[float]:
        """Latencies (ms) of the appends started in ``[start, end)``."""
        return [ms for at, ms in self.samples if start <= at < end]


def run_shared(rounds: int, eager_rounds: int, directory: str | None) -> dict[str, Any]:
    """The 1,000-owner case: background reviews whose rows every owner shares, then the
    same reviews with every owner rebuilt at once (the baseline)."""
    rng = random.Random(7)
    figures: dict[str, list[float]] = defaultdict(list)
    watch = Stopwatch()
    clock = [time.time_ns() // 1_000_000]
    with (
        ModelServer() as server,
        tempfile.TemporaryDirectory(dir=directory, prefix="fermix-bench-review-shared-") as tmp,
    ):
        home = Path(tmp)
        config = Config(
            model=ModelConfig(primary="openai/bench", api_base=server.url, timeout_s=30)
        )
        db = Database(home / "memory.db")
        files = PromptFiles(Home(home), db)
        writer = Writer(db, files)
        started = time.perf_counter()
        seed_crowd(db, files, rng, OWNERS)
        setup_s = time.perf_counter() - started
        key = ConversationKey(CROWD, "bench", "review")
        lazy = Reviewing(config, db, writer, clock=lambda: clock[0])
        eager = Reviewing(config, db, writer, clock=lambda: clock[0], defer_other_owners=False)
        actors = {"lazy": Reviewer.start(lazy), "eager": Reviewer.start(eager)}
        try:
            with ExitStack() as wrapped, Appender(writer) as appender:
                wrapped.enter_context(watch.wrapping(llm, "complete", "model"))
                wrapped.enter_context(watch.wrapping(files, "rebuild", "rebuild"))
                plan = [("lazy", WARMUP + rounds), ("eager", eager_rounds)]
                for number, mode in enumerate(m for m, n in plan for _ in range(n)):
                    say(writer, key, rng, owner="user0000")
                    _, shown = review_inputs(db, key, config)
                    server.reply(shared_answer(rng, shown, number))
                    clock[0] += 25 * HOUR_MS  # a background review, past its interval
                    time.sleep(IDLE_S)  # the appender alone: the idle figures
                    mark = watch.mark()
                    began = time.perf_counter()
                    result: ReviewResult = actors[mode].ask(Review(key))
                    ended = time.perf_counter()
                    if result.status != "applied" or result.refused or result.messages != MESSAGES:
                        raise SystemExit(f"{mode} review {number} did not do its work: {result}")
                    while files.queued:  # the other owners' rebuilds, on their thread
                        time.sleep(0.005)
                    drained = time.perf_counter()
                    if number < WARMUP:
                        continue
                    total = (ended - began) * 1000
                    model_ms = watch.since(mark, "model")
                    rebuilds = watch.ms["rebuild"][mark.get("rebuild", 0) :]
                    figures[f"{mode}_total_ms"].append(total)
                    figures[f"{mode}_fermix_ms"].append(total - model_ms)
                    figures[f"{mode}_model_ms"].append(model_ms)
                    figures[f"{mode}_rebuilds"].append(len(rebuilds))
                    figures["append_idle"] += appender.between(began - IDLE_S, began)
                    figures[f"append_{mode}_review"] += appender.between(began, ended)
                    if mode == "lazy":
                        figures["background_s"].append(drained - ended)
                        figures["rebuild_one_ms"] += rebuilds
                        figures["append_background"] += appender.between(ended, drained)
                # Yardstick: the same appends while this thread runs pure Python for as long
                # as a review takes, touching nothing of fermix (the GIL alone).
                busy_s = statistics.median(figures["lazy_total_ms"]) / 1000
                for _ in range(max(rounds, 10)):
                    time.sleep(IDLE_S / 5)
                    began = time.perf_counter()
                    while time.perf_counter() - began < busy_s:
                        sum(range(1000))
                    figures["append_cpu"] += appender.between(began, time.perf_counter())
        finally:
            for actor in actors.values():
                actor.stop()
            files.settle()
            db.close()
    figures["setup_s"] = [setup_s]
    return figures


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


SHARED_SHOWN = {
    "lazy_fermix_ms": "fermix's own work per review (whole - model)",
    "lazy_model_ms": "the model call inside each review",
    "eager_fermix_ms": "baseline: every owner rebuilt at once",
    "rebuild_one_ms": "one owner's rebuild (any thread)",
    "append_idle": "append, nothing else running (idle)",
    "append_lazy_review": "append during a review",
    "append_background": "append during the background rebuilds",
    "append_eager_review": "baseline: append during an eager review",
    "append_cpu": "yardstick: append while pure Python runs as long",
}


def shared_summary(figures: dict[str, list[float]]) -> dict[str, Any]:
    """The 1,000-owner case's figures, and whether its targets are met."""

    def p(name: str, q: float) -> float | None:
        values = figures.get(name)
        return round(percentile(values, q), 3) if values else None

    idle = p("append_idle", 99) or 0.0
    one = p("rebuild_one_ms", 99) or 0.0
    delay = {
        phase: round((p(f"append_{phase}", 99) or 0.0) - idle, 3)
        for phase in ("lazy_review", "background", "eager_review")
    }
    fermix = p("lazy_fermix_ms", 50)
    return {
        "shared_owners": OWNERS,
        "shared_rows": SHARED_ROWS,
        "shared_reviews": len(figures["lazy_fermix_ms"]),
        "shared_fermix_ms": fermix,
        "shared_fermix_ms_p99": p("lazy_fermix_ms", 99),
        "shared_model_roundtrip_ms": p("lazy_model_ms", 50),
        "shared_rebuilds_per_review": p("lazy_rebuilds", 50),
        "shared_background_rebuilds_s": p("background_s", 50),
        "rebuild_one_ms_p50": p("rebuild_one_ms", 50),
        "rebuild_one_ms_p99": one,
        "append_idle_ms_p50": p("append_idle", 50),
        "append_idle_ms_p99": idle,
        "append_during_review_ms_p50": p("append_lazy_review", 50),
        "append_during_review_ms_p99": p("append_lazy_review", 99),
        "append_during_review_ms_max": p("append_lazy_review", 100),
        "append_during_background_ms_p50": p("append_background", 50),
        "append_during_background_ms_p99": p("append_background", 99),
        "append_during_background_ms_max": p("append_background", 100),
        "append_delay_p99_review_ms": delay["lazy_review"],
        "append_delay_p99_background_ms": delay["background"],
        "eager_reviews": len(figures.get("eager_fermix_ms", [])),
        "eager_fermix_ms": p("eager_fermix_ms", 50),
        "eager_rebuilds_per_review": p("eager_rebuilds", 50),
        "append_during_eager_review_ms_p50": p("append_eager_review", 50),
        "append_during_eager_review_ms_p99": p("append_eager_review", 99),
        "append_during_eager_review_ms_max": p("append_eager_review", 100),
        "append_delay_p99_eager_review_ms": delay["eager_review"],
        "append_during_cpu_ms_p99": p("append_cpu", 99),
        "append_during_cpu_ms_max": p("append_cpu", 100),
        "append_delay_p99_cpu_ms": round((p("append_cpu", 99) or 0.0) - idle, 3),
        "shared_within_target": fermix is not None and fermix < TARGET_MS,
        "appends_within_one_rebuild": delay["lazy_review"] <= one and delay["background"] <= one,
        "shared_setup_s": round(figures["setup_s"][0], 1),
    }


def render_shared(
    console: Console, figures: dict[str, list[float]], summary: dict[str, Any]
) -> None:
    title = (
        f"{OWNERS} owners sharing an agent: {summary['shared_reviews']} background reviews,"
        f" {summary['eager_reviews']} eager (baseline)"
    )
    table = Table(title=title)
    for column in ("measure", "p50 ms", "p99 ms", "max ms", "n", "what"):
        table.add_column(column, justify="left" if column in ("measure", "what") else "right")
    for name, note in SHARED_SHOWN.items():
        values = figures.get(name) or []
        if not values:
            continue
        table.add_row(
            name,
            f"{percentile(values, 50):.2f}",
            f"{percentile(values, 99):.2f}",
            f"{max(values):.2f}",
            str(len(values)),
            note,
        )
    console.print(table)
    console.print(
        f"other owners rebuilt in the background in {summary['shared_background_rebuilds_s']} s"
        f" per review ({summary['shared_rebuilds_per_review']:g} rebuilds)"
    )
    console.print(
        f"target: fermix's own work p50 < {TARGET_MS:g} ms:"
        f" {'met' if summary['shared_within_target'] else 'MISSED'}"
        f" ({summary['shared_fermix_ms']} ms; eager baseline {summary['eager_fermix_ms']} ms)"
    )
    console.print(
        "target: appends delayed by at most one rebuild (p99 minus idle p99 <= one rebuild's"
        f" p99, {summary['rebuild_one_ms_p99']} ms; its p50 is {summary['rebuild_one_ms_p50']}"
        f" ms): {'met' if summary['appends_within_one_rebuild'] else 'MISSED'}"
        f" (review {summary['append_delay_p99_review_ms']} ms, background"
        f" {summary['append_delay_p99_background_ms']} ms; eager baseline"
        f" {summary['append_delay_p99_eager_review_ms']} ms; pure Python on another thread"
        f" for as long as a review, {summary['append_delay_p99_cpu_ms']} ms)"
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
    shared_rounds = 3 if args.quick else 10
    shared = run_shared(shared_rounds, 1 if args.quick else 2, args.dir)
    shared_figures = shared_summary(shared)
    render_shared(Console(), shared, shared_figures)

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
        **shared_figures,
        "load_avg_1m": [round(x, 2) for x in [*figures["load"], os.getloadavg()[0]]],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
