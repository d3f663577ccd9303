"""LoCoMo for bench/recall.py: the turns and questions, the recall metric, the README
baselines, and the turns stored and asked through the storage port (either adapter).

A helper module (its name starts with ``_``): bench/run.py does not run it.

The data is ``locomo-dev.json`` of ``../shared/data/`` (CC BY-NC 4.0), read where it is and
never copied into the repository. Each turn is kept with its ``dia_id``, its speaker and
its time (its session's date, one second apart within the session); a caption of a shared
image is appended to its text, as the README's baselines do. Questions of categories 1-4
with at least one evidence turn in their conversation are kept.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import apsw

from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage import Reads, Storage, Writes

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/locomo-dev.json"
CATEGORIES = (1, 2, 3, 4)
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (5, 10, 20)
LIMIT = max(KS)
TUNE = ("conv-26", "conv-30", "conv-41")
"""Conversations 1-3 of the dev file: the only ones anything was tuned on (issue 14, item 6)."""
HELD = ("conv-42", "conv-43")
"""Conversations 4-5: held out, reported apart so that over-fitting shows."""
EVERY = TUNE + HELD
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
_WORD = re.compile(r"\w+")
# NLTK's English stopwords, fixed here so the baseline does not move with fermix's list.
BASELINE_STOPWORDS = frozenset(
    """
    a about above after again against ain all am an and any are aren as at be because been
    before being below between both but by can couldn d did didn do does doesn doing don
    down during each few for from further had hadn has hasn have haven having he her here
    hers herself him himself his how i if in into is isn it its itself just ll m ma me
    mightn more most mustn my myself needn no nor not now o of off on once only or other
    our ours ourselves out over own re s same shan she should shouldn so some such t than
    that the their theirs them themselves then there these they this those through to too
    under until up ve very was wasn we were weren what when where which while who whom why
    will with won wouldn y you your yours yourself yourselves
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


@dataclass(frozen=True)
class Question:
    """One QA item with the evidence turns that exist in its conversation."""

    text: str
    category: int
    evidence: frozenset[str]


@dataclass(frozen=True)
class Turn:
    """One turn: its dia_id, speaker, text (with an image's caption) and time (ms)."""

    dia: str
    speaker: str
    content: str
    created_at: int


@dataclass(frozen=True)
class Conversation:
    """One LoCoMo sample: its turns in order and its questions."""

    sample_id: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]


def parse_evidence(items: Iterable[str], known: set[str]) -> frozenset[str]:
    """Evidence ids as dia_ids; "D8:6; D9:17" holds two, "D:11:26" means D11:26."""
    found = {f"D{a}:{b}" for item in items for a, b in _EVIDENCE.findall(str(item))}
    return frozenset(found & known)


def session_time(text: str) -> int:
    """A session's date ("1:56 pm on 8 May, 2023") in ms since the epoch, UTC."""
    parsed = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def load(path: Path, *, quick: bool = False) -> list[Conversation]:
    """The conversations of ``path`` (only the first when ``quick``)."""
    samples = json.loads(path.read_text(encoding="utf-8"))
    if quick:
        samples = samples[:1]
    out = []
    for sample in samples:
        conv = sample["conversation"]
        sessions = sorted(
            (int(k.split("_")[1]), v)
            for k, v in conv.items()
            if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
        )
        turns: list[Turn] = []
        for n, session in sessions:
            start = session_time(conv[f"session_{n}_date_time"])
            for i, turn in enumerate(session):
                caption = turn.get("blip_caption")
                content = turn["text"] + (f" {caption}" if caption else "")
                turns.append(Turn(turn["dia_id"], turn["speaker"], content, start + i * 1000))
        known = {t.dia for t in turns}
        questions = []
        for qa in sample["qa"]:
            evidence = parse_evidence(qa.get("evidence", []), known)
            if qa["category"] in CATEGORIES and evidence:
                questions.append(Question(str(qa["question"]), qa["category"], evidence))
        out.append(Conversation(sample["sample_id"], tuple(turns), tuple(questions)))
    return out


@dataclass
class Score:
    """What one method found for each question, per conversation, and its query times."""

    name: str
    found: dict[str, list[tuple[Question, list[str]]]] = field(default_factory=dict)
    times_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    """The thread's CPU time per query, where measured (the scale case): beside the wall
    time, it tells a slow query from a machine busy with something else."""

    def add(self, sample_id: str, question: Question, dias: Sequence[str], ms: float) -> None:
        """Record one question's ranked dia_ids and its query time."""
        self.found.setdefault(sample_id, []).append((question, list(dias)))
        self.times_ms.append(ms)

    @property
    def count(self) -> int:
        """Questions asked."""
        return sum(len(v) for v in self.found.values())

    def recall(
        self, k: int, split: Sequence[str] | None = None, category: int | None = None
    ) -> float | None:
        """Mean turn recall@k in percent over the questions of ``split`` (every
        conversation asked when None) and ``category``; None when there are none."""
        values = [
            len(q.evidence & set(d[:k])) / len(q.evidence)
            for sid in (self.found if split is None else split)
            for q, d in self.found.get(sid, [])
            if category is None or q.category == category
        ]
        return round(100 * statistics.fmean(values), 1) if values else None

    def percentile_ms(self, q: float, *, cpu: bool = False) -> float:
        """The q-th percentile of query time (wall clock, or the thread's CPU time)."""
        ordered = sorted(self.cpu_ms if cpu else self.times_ms)
        if not ordered:
            return 0.0
        return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 2)


Method = Callable[[Reads, str, ConversationKey], list[int]]
"""A search under test: the ranked ids of a question's hits in one conversation."""


def seed(
    db: Storage, convs: list[Conversation]
) -> tuple[dict[str, ConversationKey], dict[int, str]]:
    """Store every turn as a message; the conversations' keys, and each id's dia_id."""
    ids: dict[int, str] = {}
    keys: dict[str, ConversationKey] = {}
    for conv in convs:
        key = keys[conv.sample_id] = ConversationKey("bench", "locomo", conv.sample_id)
        news = [NewMessage(key, "user", t.content, sender=t.speaker) for t in conv.turns]

        def insert(
            w: Writes, news: list[NewMessage] = news, turns: tuple[Turn, ...] = conv.turns
        ) -> list[Message]:
            return [
                w.insert_message(n, created_at=t.created_at)
                for n, t in zip(news, turns, strict=True)
            ]

        for m, t in zip(db.write(insert, label="bench seed"), conv.turns, strict=True):
            ids[m.id] = t.dia
    return keys, ids


def ask(
    score: Score,
    db: Storage,
    convs: list[Conversation],
    keys: dict[str, ConversationKey],
    ids: dict[int, str],
    method: Method,
) -> None:
    """Ask every question of ``convs`` with ``method`` in its own read unit, timed; record
    the hits as dia_ids in ``score``."""
    for conv in convs:
        key = keys[conv.sample_id]
        for question in conv.questions:
            start = time.perf_counter()
            with db.read() as reads:
                found = method(reads, question.text, key)
            elapsed = (time.perf_counter() - start) * 1000
            score.add(conv.sample_id, question, [ids[i] for i in found], elapsed)


def words_query(text: str, stopwords: frozenset[str] = frozenset()) -> str | None:
    """Every word of ``text`` (minus ``stopwords``) quoted and OR-ed: the README baselines."""
    words = dict.fromkeys(w.lower() for w in _WORD.findall(text) if w.lower() not in stopwords)
    return " OR ".join(f'"{w}"' for w in words) or None


def run_baseline(
    convs: list[Conversation], name: str, tokenizer: str, query: Callable[[str], str | None]
) -> Score:
    """Plain FTS5 with bm25, one table per conversation (``shared/data/README.md``)."""
    conn = apsw.Connection(":memory:")
    score = Score(name)
    for n, conv in enumerate(convs):
        table = f"turns_{n}"
        conn.execute(
            f"CREATE VIRTUAL TABLE {table} USING fts5(content, dia UNINDEXED,"
            f" tokenize = '{tokenizer}')"
        )
        with conn:
            conn.executemany(
                f"INSERT INTO {table} (dia, content) VALUES (?, ?)",
                [(t.dia, t.content) for t in conv.turns],
            )
        for question in conv.questions:
            start = time.perf_counter()
            match = query(question.text)
            rows = (
                []
                if match is None
                else conn.execute(
                    f"SELECT dia FROM {table} WHERE {table} MATCH ? ORDER BY bm25({table}) LIMIT ?",
                    (match, LIMIT),
                ).fetchall()
            )
            elapsed = (time.perf_counter() - start) * 1000
            score.add(conv.sample_id, question, [str(r[0]) for r in rows], elapsed)
    conn.close()
    return score


def readme_baselines(convs: list[Conversation]) -> tuple[Score, Score]:
    """The README's two baselines: words OR-ed over unicode61, and minus NLTK's stopwords
    over porter."""
    unicode = run_baseline(convs, "baseline: words OR-ed, unicode61", "unicode61", words_query)
    porter = run_baseline(
        convs,
        "baseline: minus stopwords, porter",
        "porter unicode61",
        lambda text: words_query(text, BASELINE_STOPWORDS),
    )
    return unicode, porter
