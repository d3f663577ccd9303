"""fermix beside its peers on the same LoCoMo data in one run: mem0 OSS and LangChain's
``SQLChatMessageHistory`` (issue 25, item 1).

Usage: ``python bench/peers.py [--quick] [--data PATH]``

**Data.** Every turn of ``locomo-dev.json`` (``../shared/data/``, read where it is, never
copied into the repository; loaded by :mod:`_recall_data`, as bench/recall.py does), five
conversations, 2,760 turns, and their questions of categories 1-4 (``--quick``: the first
conversation only). Each conversation is one scope in every system: a conversation key in
fermix, a ``user_id`` in mem0, a ``session_id`` in LangChain.

**The systems**, each in a fresh temporary directory on the same file system, each with its
own default durability:

- **fermix**, as a host uses it: ``Memory(home)`` with the default configuration (SQLite,
  WAL; the background embedder on with the offline wordllama model), one
  ``conversation(...).append_user(text, sender=speaker)`` per turn. *Time until
  searchable* runs from the first append until the embedder has stored a vector for every
  turn: fermix's own wait (``Indexer.wait_idle``, the background embedder's idle event),
  then checked with its index status (``Reads.vector_coverage``, what ``fermix index
  status`` prints: every message has a vector, or the run fails). Recall and search times
  are bench/recall.py's shipped figures, measured here again: the same turns stored with
  their LoCoMo times (a host appending a months-long chat as it happens stores each turn at
  its time; ``append_user`` here stores them all within seconds, so a second figure,
  ``fermix_wallclock_r10``, asks the store built by the appends, whose turns all fall in
  one session), embedded by the same indexer code, searched by
  :func:`fermix.runtime.recall.search_history` (limit 20), as ``memory_recall`` searches
  a conversation's history.
- **mem0 OSS** (``mem0ai``, pinned by ``bin/venv-mem0``), in its own venv (its LangChain
  embedder needs ``langchain`` below 1.0, whose ``langchain-core`` clashes with the dev
  venv's 1.8), run as a subprocess (:mod:`_peers_mem0`) streaming JSON lines back.
  ``infer=False``: one ``Memory.add`` per turn, which embeds and stores before it returns,
  so its add rate is its rate until searchable. Qdrant in local mode on disk in the temp
  dir, mem0's history database there too. Two text variants: the turn alone
  (``plain``) and ``"Speaker: text"`` (``speaker``); the better one is the comparison's.
  ``search(question, top_k=20, filters={"user_id": ...}, threshold=0.0)``: no score cut,
  so it always returns 20 as fermix does.
- **LangChain** ``SQLChatMessageHistory`` (langchain-community) on a SQLite file, one
  ``add_message(HumanMessage(text, name=speaker))`` per turn, as a user gets it
  (SQLAlchemy's defaults). It has no search: its recall and search times are null.

**The same embedder.** mem0 gets fermix's wordllama embedder (its 256-dimension token
table and tokenizer, :class:`fermix.embedding.WordLlamaEmbedder`) wrapped as a LangChain
``Embeddings`` for its ``langchain`` embedder provider, so both embed with the same model
and code. mem0 embeds one text at a time and keeps no per-scope token counts, so its tokens
are pooled with equal weight (mean pooling, normalised); fermix's indexer weighs them by
their rarity in the conversation from counts it stores (that weighting is fermix's).

**What was off for mem0, and why**: its BM25 keyword search (needs ``fastembed``, which
downloads the ``Qdrant/bm25`` model at run time), its spaCy lemmatizer and entity
extraction and hence its entity boost (``spacy`` would download ``en_core_web_sm``), and
rerankers (all models from the network). None of them is installed in its venv; mem0 logs
a warning and goes on without them (its documented fallback). ``MEM0_TELEMETRY=False``
(set before the import: no PostHog client is made). Nothing is downloaded: no NLTK, no
tokenizer, no price map (``LITELLM_LOCAL_MODEL_COST_MAP=True``). Its dense search is
Qdrant local mode's brute force.

**Model cost** (per 1,000 user messages). Each system's model is a loopback model server
of this process (``tests/model_server.py``), one per system, which records every request;
calls and prompt tokens are counted there, in the same way for both: the tiktoken count
(``gpt-4o-mini``'s encoding) of each message's content plus 4 per message, plus the
``response_format`` and ``tools`` sent (fermix's review sends a JSON schema; mem0 asks for
``json_object``).

- mem0 with ``infer=True`` (its real mode): every exchange, two turns, in one ``add``
  with each speaker's name (as mem0's own LoCoMo evaluation adds them, which halves its
  calls against one ``add`` per turn), answered always with the same valid answer of its
  additive extraction prompt (``{"memory": [{"id": "0", "text": ...}]}``, read from
  ``mem0/configs/prompts.py``); being the same fact each time, mem0 stores it once and its
  later prompts show few existing memories (in mem0's favour).
- fermix, as a host triggers it: every turn appended with ``append_user`` (``sender`` the
  speaker), and at the end of each LoCoMo session the host's reply committed
  (``commit(reply, usage)``, the prompt tokens of ``compose`` as its usage) with the model's
  ``context_window`` at 8,192 tokens (a small local model: compaction comes often, against
  fermix), the memory's clock at the turns' LoCoMo times (reviews are due once the 24-hour
  review interval passed, the default), and the reviews and compactions the commit
  dispatched waited for with ``Memory.review(conv, force=False)`` and
  ``Memory.compact(conv, force=False)`` (each queues behind the dispatched one and finds
  nothing left to do). At the end the clock moves past the interval and ``Memory.tick()``
  sweeps until nothing is due. The timer's own sweep is off (``sweep_interval_s = 0``) so
  that only the host's calls dispatch. Reviews are answered with one valid ``add`` op,
  compactions with a fixed summary.

**Ingest, in interleaved rounds.** The ingest comparison is run again in
:data:`INGEST_ROUNDS` rounds (``--quick``: one), each system in a fresh process as in the
first measurement (fermix's tokenizer cache and mem0's as cold), each round in an order of
its own: fermix until searchable, mem0 ``plain``, mem0 ``speaker``. A round's ratio is
fermix's rate until searchable over the faster mem0 variant's add rate of the same round,
so that a change in the shared machine's speed (it comes and goes over minutes) falls on
both sides alike; ``ingest_ratio_vs_mem0`` is the median of the rounds' ratios, the rates
beside it the medians of each side's rates (``ingest_rounds`` has every round).

**Targets** (issue 25), in the last JSON line: ``ingest_ratio_vs_mem0`` (fermix's turns per
second until searchable over mem0's best ``infer=False`` add rate, >= 10, from the rounds),
``r10_minus_mem0`` (fermix's turn R@10 minus mem0's best variant's, points, >= 30),
``search_p99_ratio_vs_mem0`` (fermix's search p99 over mem0's best variant's, <= 0.3) and
``model_tokens_ratio_vs_mem0`` (fermix's prompt tokens per 1,000 user messages over mem0
``infer=True``'s, <= 0.1). Bytes on disk per turn: every file the system left in its
directory, after it closed. The systems run one after another, never two at once; the
one-minute load average at start and end is in the JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _recall_data import (
    CATEGORIES,
    CATEGORY_NAMES,
    DEFAULT_DATA,
    KS,
    LIMIT,
    Conversation,
    Question,
    Score,
    Turn,
    ask,
    load,
    seed,
)
from _timing import percentile
from model_server import ModelServer, Step, json_reply, text_reply
from rich.console import Console
from rich.table import Table

from fermix import Memory
from fermix.config import Config
from fermix.home import Home
from fermix.runtime import indexing, recall
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage.sqlite.database import Database
from fermix.token_counts import MESSAGE_OVERHEAD_TOKENS, count_tokens

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
AGENT, CHANNEL = "bench", "locomo"
INGEST_ROUNDS = 3
"""Rounds of the interleaved ingest comparison (``--quick``: 1; see the docstring)."""
TOKENIZER_MODEL = "gpt-4o-mini"
"""Whose tiktoken encoding counts every system's prompt tokens at the loopback server."""
CONTEXT_WINDOW = 8_192
"""The context window fermix's host declares for the cost run (compaction at 0.85 x it)."""
HOUR_MS = 3_600_000
TARGET_INGEST, TARGET_R10, TARGET_P99, TARGET_TOKENS = 10.0, 30.0, 0.3, 0.1
MEM0_ANSWER = {"memory": [{"id": "0", "text": "Talked about their week and plans"}]}
"""mem0's additive extraction answer (``mem0/configs/prompts.py``), the same every time."""
REVIEW_ANSWER = {
    "operations": [
        {
            "op": "add",
            "speaker": "S1",
            "category": "interest",
            "key": "week",
            "value": "Talked about their week and plans",
        }
    ]
}
"""A valid review answer (:mod:`fermix.core.review_answer`), the same every time."""
SUMMARY = "The speakers caught up on their weeks, their families, work and plans."
REPLY = "Thanks for sharing!"
_SESSION = re.compile(r"D(\d+):")


# -- the loopback model servers --------------------------------------------------------


@dataclass
class Loopback(ModelServer):
    """The loopback model server, answering each request by what it asks for: a review
    (it sends a ``response_format``) or anything else."""

    answer: Callable[[dict[str, Any]], Step] | None = None

    def _take(self, body: dict[str, Any], headers: dict[str, str]) -> Step:
        step = super()._take(body, headers)
        return step if self.answer is None else self.answer(body)


def prompt_tokens(body: dict[str, Any]) -> int:
    """One request's prompt tokens as counted for every system: each message's content
    plus its framing, and the ``response_format`` and ``tools`` it sends."""
    total = 0
    for message in body.get("messages", []):
        content = message.get("content") or ""
        text = content if isinstance(content, str) else json.dumps(content)
        total += count_tokens(text, TOKENIZER_MODEL) + MESSAGE_OVERHEAD_TOKENS
    for extra in ("response_format", "tools"):
        if body.get(extra):
            total += count_tokens(json.dumps(body[extra]), TOKENIZER_MODEL)
    return total


@dataclass(frozen=True)
class Cost:
    """Model calls and prompt tokens spent on some user messages."""

    user_messages: int
    calls: int
    prompt_tokens: int
    detail: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(server: ModelServer, user_messages: int, **detail: int) -> Cost:
        """What ``server`` saw for ``user_messages``."""
        bodies = list(server.requests)
        return Cost(user_messages, len(bodies), sum(prompt_tokens(b) for b in bodies), detail)

    @property
    def calls_per_1k(self) -> float:
        """Model calls per 1,000 user messages."""
        return round(1000 * self.calls / self.user_messages, 1)

    @property
    def tokens_per_1k(self) -> float:
        """Prompt tokens per 1,000 user messages."""
        return round(1000 * self.prompt_tokens / self.user_messages, 1)


# -- what each system measured ---------------------------------------------------------


@dataclass
class Side:
    """One system's figures on the LoCoMo turns."""

    name: str
    turns: int
    ingest_s: float
    add_ns: list[int]
    searchable_s: float | None
    disk_bytes: int
    score: Score | None = None

    @property
    def ingest_rate(self) -> float:
        """Turns per second, appends or adds only."""
        return self.turns / self.ingest_s

    @property
    def searchable_rate(self) -> float | None:
        """Turns per second until every turn can be found."""
        return None if self.searchable_s is None else self.turns / self.searchable_s

    def add_ms(self, q: float) -> float:
        """The q-th percentile of one append or add, in ms."""
        return round(percentile([ns / 1e6 for ns in self.add_ns], q), 3)

    def search_ms(self, q: float) -> float | None:
        """The q-th percentile of one search, in ms; None without search."""
        return None if self.score is None else self.score.percentile_ms(q)

    def recall(self, k: int, category: int | None = None) -> float | None:
        """Turn recall@k in percent, over every question or one category."""
        return None if self.score is None else self.score.recall(k, category=category)


def loadavg() -> float:
    """The one-minute load average."""
    return round(os.getloadavg()[0], 2)


def home_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed_turns(
    convs: Sequence[Conversation], append: Callable[[Conversation, Turn], object]
) -> list[int]:
    """Call ``append`` on every turn of ``convs`` in order; each call's time in ns."""
    latencies: list[int] = []
    clock = time.perf_counter_ns
    for conv in convs:
        for turn in conv.turns:
            t0 = clock()
            append(conv, turn)
            latencies.append(clock() - t0)
    return latencies


def run_fermix_ingest(convs: list[Conversation], *, recall: bool = True) -> tuple[Side, Score]:
    """Every turn through ``append_user``, timed, then the wait until every vector is
    stored; the store's own recall (turns at wall-clock times) for the second figure, unless
    ``recall`` is false (an ingest round: its score is left empty)."""
    with tempfile.TemporaryDirectory(prefix="fermix-bench-peers-") as tmp:
        memory = Memory(tmp)
        with memory:
            services = memory._runtime.services  # the embedder; no public equivalent
            indexer = services.indexer
            assert indexer is not None, "embedding is off in the default configuration"
            if not indexer.wait_idle(120):  # the model loaded and recorded, untimed
                raise RuntimeError("the background embedder did not start within 120 s")
            handles = {c.sample_id: memory.conversation(AGENT, CHANNEL, c.sample_id) for c in convs}
            ids: dict[int, str] = {}

            def append(conv: Conversation, turn: Turn) -> None:
                message = handles[conv.sample_id].append_user(turn.content, sender=turn.speaker)
                ids[message.id] = turn.dia

            start = time.perf_counter_ns()
            latencies = timed_turns(convs, append)
            appended = time.perf_counter_ns()
            if not indexer.wait_idle(600):
                raise RuntimeError("the background embedder did not finish within 600 s")
            searchable = time.perf_counter_ns()
            with services.storage.read() as reads:
                coverage = reads.vector_coverage()
            turns = sum(len(c.turns) for c in convs)
            if coverage.message_vectors != coverage.messages or coverage.messages != turns:
                raise RuntimeError(f"not every turn has a vector: {coverage}")
            wallclock = Score("fermix, turns at wall-clock times")
            if recall:
                keys = {sid: h.key for sid, h in handles.items()}
                ask(wallclock, services.storage, convs, keys, ids, hybrid)
        side = Side(
            "fermix",
            turns,
            (appended - start) / 1e9,
            latencies,
            (searchable - start) / 1e9,
            home_bytes(Path(tmp)),
        )
    return side, wallclock


def hybrid(reads: Any, text: str, key: Any) -> list[int]:
    """fermix's shipped search of one conversation's history, as ``memory_recall`` runs it."""
    return [h.message.id for h in recall.search_history(reads, text, key=key, limit=LIMIT)]


def run_fermix_recall(convs: list[Conversation]) -> Score:
    """bench/recall.py's shipped figure: the turns stored with their LoCoMo times through
    the storage port, embedded by the indexer's code, asked with ``search_history``."""
    with tempfile.TemporaryDirectory(prefix="fermix-bench-peers-recall-") as tmp:
        home = Home(Path(tmp))
        db = Database(home.db_path)
        try:
            writer = Writer(db, PromptFiles(home, db))
            keys, ids = seed(db, convs)
            indexer = indexing.Indexer.from_config(db, writer, Config().embedding)
            assert indexer is not None, "embedding is off in the default configuration"
            indexer.catch_up()
            indexing.register(db, indexer)
            try:
                score = Score("fermix")
                ask(score, db, convs, keys, ids, hybrid)
            finally:
                indexing.unregister(db, indexer)
        finally:
            db.close()
    return score


def sessions(conv: Conversation) -> list[list[Turn]]:
    """The turns of ``conv`` by LoCoMo session, in order."""
    out: dict[str, list[Turn]] = {}
    for turn in conv.turns:
        match = _SESSION.match(turn.dia)
        out.setdefault(match.group(1) if match else "", []).append(turn)
    return list(out.values())


def fermix_answer(body: dict[str, Any]) -> Step:
    """A review gets :data:`REVIEW_ANSWER`, a compaction :data:`SUMMARY`."""
    return json_reply(REVIEW_ANSWER) if body.get("response_format") else text_reply(SUMMARY)


def run_fermix_cost(convs: list[Conversation]) -> Cost:
    """fermix's reviews and compactions as a host triggers them (see the docstring)."""
    now = [0]
    base = Config()
    config = dataclasses.replace(
        base, memory=dataclasses.replace(base.memory, sweep_interval_s=0.0)
    )
    with (
        Loopback(answer=fermix_answer) as server,
        tempfile.TemporaryDirectory(prefix="fermix-bench-peers-cost-") as tmp,
    ):
        memory = Memory(
            tmp,
            config=config,
            model="openai/bench",
            api_base=server.url,
            context_window=CONTEXT_WINDOW,
            clock=lambda: now[0],
        )
        users = commits = 0
        with memory:
            for conv in convs:
                handle = memory.conversation(AGENT, CHANNEL, conv.sample_id)
                for session in sessions(conv):
                    for turn in session:
                        now[0] = turn.created_at
                        handle.append_user(turn.content, sender=turn.speaker)
                        users += 1
                    window = handle.compose("You are a helpful assistant in a group chat.")
                    used = sum(
                        count_tokens(str(m.get("content") or ""), TOKENIZER_MODEL)
                        + MESSAGE_OVERHEAD_TOKENS
                        for m in window
                    )
                    handle.commit(REPLY, {"prompt_tokens": used})
                    commits += 1
                    memory.review(handle, force=False)
                    memory.compact(handle, force=False)
            now[0] = max(t.created_at for c in convs for t in c.turns) + 25 * HOUR_MS
            sweeps = 0
            while memory.tick():
                sweeps += 1
                for conv in convs:
                    handle = memory.conversation(AGENT, CHANNEL, conv.sample_id)
                    memory.review(handle, force=False)
            rows = len(memory.list_rows())
        reviews = sum(1 for body in server.requests if body.get("response_format"))
        return Cost.of(
            server,
            users,
            reviews=reviews,
            compactions=len(server.requests) - reviews,
            commits=commits,
            final_sweeps=sweeps,
            rows=rows,
        )


# -- LangChain -------------------------------------------------------------------------


def run_langchain(convs: list[Conversation]) -> Side | None:
    """Every turn through ``SQLChatMessageHistory.add_message``; None without LangChain."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # langchain-community announces its sunset
            from langchain_community.chat_message_histories import SQLChatMessageHistory
            from langchain_core.messages import HumanMessage
            from sqlalchemy import create_engine
    except ImportError:
        return None
    with tempfile.TemporaryDirectory(prefix="fermix-bench-peers-lc-") as tmp:
        engine = create_engine(f"sqlite:///{Path(tmp) / 'history.db'}")
        try:
            histories = {
                c.sample_id: SQLChatMessageHistory(session_id=c.sample_id, connection=engine)
                for c in convs
            }

            def append(conv: Conversation, turn: Turn) -> None:
                message = HumanMessage(content=turn.content, name=turn.speaker)
                histories[conv.sample_id].add_message(message)

            start = time.perf_counter_ns()
            latencies = timed_turns(convs, append)
            elapsed = (time.perf_counter_ns() - start) / 1e9
        finally:
            engine.dispose()
        turns = sum(len(c.turns) for c in convs)
        return Side("LangChain", turns, elapsed, latencies, None, home_bytes(Path(tmp)))


# -- mem0, in its own venv -------------------------------------------------------------


@dataclass
class Mem0Run:
    """What mem0's subprocess reported."""

    variants: dict[str, Side]
    infer_messages: int
    infer_adds: int
    infer_s: float
    versions: dict[str, str]


def mem0_python() -> Path:
    """The Python of mem0's venv, made or reused by ``bin/venv-mem0``."""
    made = subprocess.run(
        ["bash", str(REPO / "bin/venv-mem0")], check=True, capture_output=True, text=True
    )
    return Path(made.stdout.strip()) / "bin/python"


def score_of(name: str, found: dict[str, list[list[Any]]], times_ms: list[float]) -> Score:
    """A :class:`Score` rebuilt from the subprocess's JSON."""
    score = Score(name)
    for sid, items in found.items():
        for text, category, evidence, dias in items:
            score.found.setdefault(sid, []).append(
                (Question(text, category, frozenset(evidence)), list(dias))
            )
    score.times_ms = list(times_ms)
    return score


def mem0_command(
    python: Path, data: Path, quick: bool, model_url: str, workdir: str, *extra: str
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of mem0's side (``_peers_mem0.py`` with ``extra``
    arguments) in its venv, offline, its files under ``workdir``."""
    command = [str(python), str(BENCH / "_peers_mem0.py"), "--data", str(data)]
    command += ["--workdir", workdir, "--model-url", model_url, *extra]
    command += ["--quick"] if quick else []
    env = {**os.environ, "MEM0_TELEMETRY": "False", "MEM0_DIR": str(Path(workdir) / "mem0")}
    return command, env


@contextlib.contextmanager
def mem0_process(
    python: Path, data: Path, quick: bool, model_url: str
) -> Iterator[subprocess.Popen[str]]:
    """mem0's side running in its venv; its stderr goes to this process's."""
    with tempfile.TemporaryDirectory(prefix="fermix-bench-peers-mem0-") as tmp:
        command, env = mem0_command(python, data, quick, model_url, tmp)
        with subprocess.Popen(
            command, cwd=BENCH, stdout=subprocess.PIPE, text=True, env=env
        ) as process:
            try:
                yield process
            finally:
                if process.poll() is None:
                    process.kill()


def run_mem0(data: Path, quick: bool) -> tuple[Mem0Run, Cost]:
    """mem0's ``infer=False`` variants and its ``infer=True`` ingest, the latter's model
    calls counted at this process's loopback server."""
    python = mem0_python()
    variants: dict[str, Side] = {}
    infer: dict[str, Any] = {}
    versions: dict[str, str] = {}
    with Loopback() as server:
        server.default = json_reply(MEM0_ANSWER)
        with mem0_process(python, data, quick, server.url) as process:
            assert process.stdout is not None
            for line in process.stdout:
                part = json.loads(line)
                name = part.pop("part")
                print(f"mem0 {name}: done", file=sys.stderr, flush=True)
                if name == "versions":
                    part.pop("ks", None)
                    versions = part
                elif name == "infer":
                    infer = part
                else:
                    variants[name] = Side(
                        f"mem0 {name}",
                        part["turns"],
                        part["ingest_s"],
                        [int(ms * 1e6) for ms in part["add_ms"]],
                        part["ingest_s"],
                        part["bytes"],
                        score_of(f"mem0 {name}", part["found"], part["search_ms"]),
                    )
            if process.wait() != 0:
                raise RuntimeError(f"mem0's side exited {process.returncode}")
        cost = Cost.of(server, infer["user_messages"], adds=infer["adds"])
    run = Mem0Run(variants, infer["user_messages"], infer["adds"], infer["ingest_s"], versions)
    return run, cost


# -- ingest rounds ----------------------------------------------------------------------


def last_line(command: list[str], **keywords: Any) -> dict[str, Any]:
    """The JSON object ``command`` prints last (its stderr passes through)."""
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, **keywords)
    value: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return value


def fermix_round(data: Path, quick: bool) -> float:
    """fermix's turns per second until searchable, in a fresh process (``--ingest-round``)."""
    command = [sys.executable, str(Path(__file__)), "--ingest-round", "--data", str(data)]
    found = last_line(command + (["--quick"] if quick else []), cwd=BENCH)
    return float(found["turns"]) / float(found["searchable_s"])


def mem0_round(python: Path, data: Path, quick: bool, variant: str) -> float:
    """mem0's ``infer=False`` adds per second in ``variant``, in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="fermix-bench-peers-mem0-") as tmp:
        no_model = "http://127.0.0.1:9/v1"  # infer=False calls no model
        command, env = mem0_command(python, data, quick, no_model, tmp, "--ingest-only", variant)
        found = last_line(command, cwd=BENCH, env=env)
    return float(found["turns"]) / float(found["ingest_s"])


def ingest_rounds(python: Path, data: Path, quick: bool) -> list[dict[str, float]]:
    """The interleaved ingest comparison (see the docstring): each round's rates and ratio."""
    systems: list[tuple[str, Callable[[], float]]] = [
        ("fermix", lambda: fermix_round(data, quick)),
        *(
            (f"mem0_{v}", lambda v=v: mem0_round(python, data, quick, v))
            for v in ("plain", "speaker")
        ),
    ]
    rounds = []
    for r in range(1 if quick else INGEST_ROUNDS):
        shift = r % len(systems)
        rates = {name: measure() for name, measure in systems[shift:] + systems[:shift]}
        fastest = max(rates["mem0_plain"], rates["mem0_speaker"])
        rounds.append(
            {
                "fermix_searchable_turns_s": round(rates["fermix"], 1),
                "mem0_plain_turns_s": round(rates["mem0_plain"], 1),
                "mem0_speaker_turns_s": round(rates["mem0_speaker"], 1),
                "ratio": round(rates["fermix"] / fastest, 2),
            }
        )
        print(f"ingest round {r + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    return rounds


def rounds_figures(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The JSON line's keys of the ingest rounds: their medians, and every round."""
    fastest = [max(r["mem0_plain_turns_s"], r["mem0_speaker_turns_s"]) for r in rounds]
    return {
        "ingest_ratio_vs_mem0": round(statistics.median(r["ratio"] for r in rounds), 2),
        "fermix_searchable_turns_s_rounds": round(
            statistics.median(r["fermix_searchable_turns_s"] for r in rounds), 1
        ),
        "mem0_fastest_turns_s_rounds": round(statistics.median(fastest), 1),
        "ingest_rounds": rounds,
    }


# -- the report ------------------------------------------------------------------------


def _f(value: float | None, spec: str = ",.1f") -> str:
    return "—" if value is None else format(value, spec)


def render(console: Console, sides: Sequence[Side], costs: dict[str, Cost]) -> None:
    """The peers' table, recall by category, and the model cost."""
    table = Table(title="LoCoMo dev, every turn: ingest, search, recall, disk")
    for column in (
        "system",
        "turns/s",
        "until searchable",
        "add p50/p99 ms",
        "search p50/p99 ms",
        "R@5/10/20",
        "bytes/turn",
    ):
        table.add_column(column, justify="left" if column == "system" else "right")
    for s in sides:
        table.add_row(
            s.name,
            _f(s.ingest_rate, ",.0f"),
            _f(s.searchable_rate, ",.0f"),
            f"{s.add_ms(50):.2f} / {s.add_ms(99):.2f}",
            f"{_f(s.search_ms(50), '.2f')} / {_f(s.search_ms(99), '.2f')}",
            "/".join(_f(s.recall(k)) for k in KS),
            _f(s.disk_bytes / s.turns, ",.0f"),
        )
    console.print(table)
    cats = Table(title="turn R@10 (%) by LoCoMo category")
    cats.add_column("system")
    for c in CATEGORIES:
        cats.add_column(f"{c} {CATEGORY_NAMES[c]}", justify="right")
    for s in sides:
        if s.score is not None:
            cats.add_row(s.name, *(_f(s.recall(10, c)) for c in CATEGORIES))
    console.print(cats)
    money = Table(title="model cost on loopback, per 1,000 user messages")
    for column in ("system", "user messages", "calls", "calls/1k", "prompt tokens/1k"):
        money.add_column(column, justify="left" if column == "system" else "right")
    for name, cost in costs.items():
        money.add_row(
            name,
            f"{cost.user_messages:,}",
            f"{cost.calls:,}",
            _f(cost.calls_per_1k),
            _f(cost.tokens_per_1k, ",.0f"),
        )
    console.print(money)


def side_figures(prefix: str, side: Side) -> dict[str, Any]:
    """One system's keys of the JSON line."""
    out: dict[str, Any] = {
        f"{prefix}_turns_s": round(side.ingest_rate, 1),
        f"{prefix}_searchable_turns_s": None
        if side.searchable_rate is None
        else round(side.searchable_rate, 1),
        f"{prefix}_add_p50_ms": side.add_ms(50),
        f"{prefix}_add_p99_ms": side.add_ms(99),
        f"{prefix}_search_p50_ms": side.search_ms(50),
        f"{prefix}_search_p99_ms": side.search_ms(99),
        f"{prefix}_bytes_per_turn": round(side.disk_bytes / side.turns, 1),
    }
    for k in KS:
        out[f"{prefix}_r{k}"] = side.recall(k)
    for c in CATEGORIES:
        out[f"{prefix}_r10_cat{c}"] = side.recall(10, c)
    return out


def figures(
    fermix: Side, wallclock: Score, langchain: Side | None, fermix_cost: Cost
) -> dict[str, Any]:
    """The JSON line's keys of fermix and LangChain."""
    return {
        "turns": fermix.turns,
        "questions": fermix.score.count if fermix.score else 0,
        **side_figures("fermix", fermix),
        "fermix_wallclock_r10": wallclock.recall(10),
        "fermix_model_calls_per_1k": fermix_cost.calls_per_1k,
        "fermix_prompt_tokens_per_1k": fermix_cost.tokens_per_1k,
        "fermix_cost_detail": fermix_cost.detail,
        **(side_figures("langchain", langchain) if langchain else {"langchain_turns_s": None}),
        "versions": {
            "fermix": importlib.metadata.version("fermix"),
            **{
                name: importlib.metadata.version(name)
                for name in ("langchain-community", "langchain-core", "SQLAlchemy")
                if langchain is not None
            },
        },
    }


TARGET_KEYS = (
    "ingest_ratio_vs_mem0",
    "r10_minus_mem0",
    "search_p99_ratio_vs_mem0",
    "model_tokens_ratio_vs_mem0",
)


def mem0_figures(fermix: Side, fermix_cost: Cost, mem0: Mem0Run, mem0_cost: Cost) -> dict[str, Any]:
    """The JSON line's keys of mem0, and three of the four target keys (the ingest ratio is
    the rounds', :func:`rounds_figures`; see the docstring)."""
    best_add = max(mem0.variants.values(), key=lambda s: s.ingest_rate)
    best_recall = max(mem0.variants.values(), key=lambda s: s.recall(10) or 0.0)
    out: dict[str, Any] = {}
    for name, side in mem0.variants.items():
        out |= side_figures(f"mem0_{name}", side)
    out |= side_figures("mem0_best", best_recall)
    out |= {
        "mem0_best_variant": best_recall.name,
        "mem0_fastest_variant": best_add.name,
        "mem0_fastest_turns_s": round(best_add.ingest_rate, 1),
        "mem0_infer_model_calls_per_1k": mem0_cost.calls_per_1k,
        "mem0_infer_prompt_tokens_per_1k": mem0_cost.tokens_per_1k,
        "mem0_infer_adds": mem0.infer_adds,
        "mem0_infer_turns_s": round(mem0.infer_messages / mem0.infer_s, 1),
        "mem0_versions": mem0.versions,
    }
    fermix_r10, searchable = fermix.recall(10), fermix.searchable_rate
    mem0_r10 = best_recall.recall(10)
    p99, best_p99 = fermix.search_ms(99), best_recall.search_ms(99)
    out |= {
        "ingest_ratio_vs_mem0_single": None
        if searchable is None
        else round(searchable / best_add.ingest_rate, 2),
        "r10_minus_mem0": None
        if fermix_r10 is None or mem0_r10 is None
        else round(fermix_r10 - mem0_r10, 1),
        "search_p99_ratio_vs_mem0": None
        if p99 is None or not best_p99
        else round(p99 / best_p99, 3),
        "model_tokens_ratio_vs_mem0": round(fermix_cost.tokens_per_1k / mem0_cost.tokens_per_1k, 4),
    }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run every system on the same data, print the tables and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="the first conversation only")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--ingest-round", action="store_true", help="fermix's ingest alone (one round)"
    )
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    load_start = loadavg()
    convs = load(args.data, quick=args.quick)
    if args.ingest_round:
        side, _ = run_fermix_ingest(convs, recall=False)
        print(json.dumps({"turns": side.turns, "searchable_s": side.searchable_s}))
        return 0
    console.print(f"{sum(len(c.turns) for c in convs):,} turns, {len(convs)} conversations")
    fermix, wallclock = run_fermix_ingest(convs)
    fermix.score = run_fermix_recall(convs)
    console.print("fermix: done")
    langchain = run_langchain(convs)
    console.print("LangChain: done")
    try:
        mem0: Mem0Run | None
        mem0, mem0_cost = run_mem0(args.data, args.quick)
    except subprocess.CalledProcessError as exc:  # no venv for mem0 (offline, no PyPI)
        mem0, mem0_error = None, f"bin/venv-mem0 failed: {str(exc.stderr).strip()[-500:]}"
    fermix_cost = run_fermix_cost(convs)
    console.print("fermix model cost: done")
    costs = {"fermix": fermix_cost}
    sides = [fermix, *([langchain] if langchain else [])]
    out = figures(fermix, wallclock, langchain, fermix_cost)
    if mem0 is None:
        out |= dict.fromkeys(TARGET_KEYS) | {"mem0_error": mem0_error}
        console.print(f"[red]mem0 not measured[/]: {mem0_error}")
    else:
        costs["mem0 infer=True"] = mem0_cost
        sides[1:1] = mem0.variants.values()
        out |= mem0_figures(fermix, fermix_cost, mem0, mem0_cost)
        out |= rounds_figures(ingest_rounds(mem0_python(), args.data, args.quick))
    render(console, sides, costs)
    out |= {"quick": args.quick, "load_1min_start": load_start, "load_1min_end": loadavg()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
