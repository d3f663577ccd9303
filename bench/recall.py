"""Turn-level retrieval recall of fermix's history search on LoCoMo, with its baselines (T2).

Usage: ``python bench/recall.py [--data PATH] [--quick]``

Every turn of every conversation in ``locomo-dev.json`` (read from ``../shared/data/``,
never copied into the repository: CC BY-NC 4.0) is stored as a message through the
storage port (:class:`fermix.storage.Database`), one conversation key per sample, in a
database in a temporary directory. Each question of categories 1-4 is searched as the
memory tools search a conversation's history (``search_messages(question, key=...,
limit=20)`` in a read session); turn recall@k is the share of the question's evidence
turns found in the top k, averaged over questions.

The baselines, all in the same process and run, answer the same questions over the same
turns with the same metric:

- the two of ``shared/data/README.md``, on plain FTS5 tables of their own (one per
  conversation, so bm25 sees only that conversation, as in the README): every question
  word quoted and OR-ed over ``unicode61``, and the same minus NLTK's English stopwords
  over ``porter unicode61``. They are the published reference for recall (the 58.8 target
  is the porter one's R@10); their tables are not fermix's index, so no latency is
  compared with them;
- fermix's own MATCH expression on the same ``messages_fts`` index of the same database,
  ranked by FTS5's ``bm25()`` alone, on a raw apsw connection, returning the same top 20
  whole messages: recall against it shows what fermix's scoped re-ranking adds, and its
  query time is the floor for fermix's (``p50_ratio_vs_plain_fts5`` is fermix's p50 over
  its p50; the two alternate question by question).

Then the scale case (issue 14): 1,000,000 messages (``--quick``: 100,000; ``--scale N``;
0 skips it) of recycled LoCoMo turns in conversations of 500, five conversations per owner,
one agent, sessions of 25 interleaved across conversations. It is built once through
fermix's own storage into ``$XDG_CACHE_HOME/fermix-bench`` (or ``~/.cache/fermix-bench``),
outside the repository, under a name keyed by the schema version and a hash of schema.sql,
the data and the parameters, so a schema change builds it again. Timed: a search of one
conversation, of one owner's conversations, and ``memory_recall`` of the owner's history,
p50 / p99 over 300 LoCoMo questions; and the file's bytes per message.

The last line printed is one JSON object with the headline numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import apsw
from rich.console import Console
from rich.table import Table

from fermix.model import ConversationKey, Message, NewMessage
from fermix.storage import Database, Writes, fts, migrations, open_database, transaction
from fermix.storage.messages import SearchScope

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/locomo-dev.json"
CATEGORIES = (1, 2, 3, 4)
KS = (5, 10, 20)
LIMIT = max(KS)
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
_WORD = re.compile(r"\w+")
MESSAGE_COLUMNS = ", ".join(f"m.{f.name}" for f in dataclasses.fields(Message))
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
class Conversation:
    """One LoCoMo sample: its turns in order (dia_id, content) and its questions."""

    sample_id: str
    turns: tuple[tuple[str, str], ...]
    questions: tuple[Question, ...]


def parse_evidence(items: Iterable[str], known: set[str]) -> frozenset[str]:
    """Evidence ids as dia_ids; "D8:6; D9:17" holds two, "D:11:26" means D11:26."""
    found = {f"D{a}:{b}" for item in items for a, b in _EVIDENCE.findall(str(item))}
    return frozenset(found & known)


def load(path: Path, *, quick: bool) -> list[Conversation]:
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
        turns = []
        for _, session in sessions:
            for turn in session:
                caption = turn.get("blip_caption")
                content = turn["text"] + (f" {caption}" if caption else "")
                turns.append((turn["dia_id"], content))
        known = {dia for dia, _ in turns}
        questions = []
        for qa in sample["qa"]:
            evidence = parse_evidence(qa.get("evidence", []), known)
            if qa["category"] in CATEGORIES and evidence:
                questions.append(Question(str(qa["question"]), qa["category"], evidence))
        out.append(Conversation(sample["sample_id"], tuple(turns), tuple(questions)))
    return out


@dataclass
class Score:
    """Recall sums and query times of one method."""

    name: str
    sums: dict[int, float]
    by_category: dict[int, list[float]]
    times_ms: list[float]
    count: int = 0

    @classmethod
    def named(cls, name: str) -> Score:
        """An empty score."""
        return cls(name, dict.fromkeys(KS, 0.0), {c: [] for c in CATEGORIES}, [])

    def add(self, question: Question, found: Sequence[str], elapsed_ms: float) -> None:
        """Record one question's ranked dia_ids."""
        self.count += 1
        self.times_ms.append(elapsed_ms)
        for k in KS:
            self.sums[k] += len(question.evidence & set(found[:k])) / len(question.evidence)
        self.by_category[question.category].append(
            len(question.evidence & set(found[:10])) / len(question.evidence)
        )

    def recall(self, k: int) -> float:
        """Mean recall@k in percent."""
        return round(100 * self.sums[k] / max(self.count, 1), 1)

    def percentile_ms(self, q: float) -> float:
        """The q-th percentile of query time."""
        ordered = sorted(self.times_ms)
        return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 2)


def run_fermix(convs: list[Conversation], workdir: Path) -> tuple[Score, Score]:
    """fermix's search, and fermix's words ranked by FTS5's bm25 alone, on one index.

    fermix's search runs as the memory tools run it (a read session of
    :class:`~fermix.storage.Database`, ``search_messages``); the baseline asks the same
    ``messages_fts`` index of the same database, on a raw apsw connection, for the same
    MATCH expression (:func:`fermix.storage.fts.build_query`) ranked by ``bm25()`` alone
    and returns the same answer: the top ``LIMIT`` messages of the conversation, every
    column. The two alternate, question by question, in a rotating order.
    """
    db = Database(workdir / "bench.db")
    raw = apsw.Connection(str(workdir / "bench.db"))
    ids: dict[str, dict[int, str]] = {}
    keys: dict[str, ConversationKey] = {}
    try:
        for conv in convs:
            key = ConversationKey("bench", "locomo", conv.sample_id)
            keys[conv.sample_id] = key
            news = [NewMessage(key, "user", content) for _, content in conv.turns]

            def insert(w: Writes, news: list[NewMessage] = news) -> list[Message]:
                return [w.insert_message(new, created_at=i) for i, new in enumerate(news)]

            stored = db.write(insert, label="bench seed")
            ids[conv.sample_id] = {
                m.id: dia for m, (dia, _) in zip(stored, conv.turns, strict=True)
            }
        fermix = Score.named("fermix: search_messages")
        plain = Score.named("fermix words, FTS5 bm25 alone, same index")
        n = 0
        for conv in convs:
            key, by_id = keys[conv.sample_id], ids[conv.sample_id]
            for question in conv.questions:
                for score in (fermix, plain) if n % 2 == 0 else (plain, fermix):
                    start = time.perf_counter()
                    if score is fermix:
                        with db.read() as reads:
                            hits = reads.search_messages(question.text, key=key, limit=LIMIT)
                        found = [h.message.id for h in hits]
                    else:
                        found = plain_search(raw, question.text, key)
                    elapsed = (time.perf_counter() - start) * 1000
                    score.add(question, [by_id[i] for i in found], elapsed)
                n += 1
    finally:
        raw.close()
        db.close()
    return fermix, plain


def plain_search(conn: apsw.Connection, text: str, key: ConversationKey) -> list[int]:
    """Ids of the top ``LIMIT`` messages of ``key`` for ``text``, by FTS5's bm25 alone.

    The same MATCH expression as fermix's search (the conversation's scope token and the
    words, :class:`fermix.storage.messages.SearchScope`), and the whole rows, as its hits
    carry; bm25 weighs the text column only.
    """
    words = fts.build_query(text)
    if words is None:
        return []
    scope = SearchScope.of(key=key)
    sql = (
        f"SELECT {MESSAGE_COLUMNS} FROM messages_fts JOIN messages AS m"
        f" ON m.id = messages_fts.rowid WHERE messages_fts MATCH ? AND {scope.clause()}"
        " ORDER BY bm25(messages_fts, 1.0, 0.0) LIMIT ?"
    )
    return [Message(*r).id for r in conn.execute(sql, (scope.match(words), *scope.params, LIMIT))]


def words_query(text: str, stopwords: frozenset[str] = frozenset()) -> str | None:
    """Every word of ``text`` (minus ``stopwords``) quoted and OR-ed: the README baselines."""
    words = dict.fromkeys(w.lower() for w in _WORD.findall(text) if w.lower() not in stopwords)
    return " OR ".join(f'"{w}"' for w in words) or None


def run_baseline(
    convs: list[Conversation], name: str, tokenizer: str, query: Callable[[str], str | None]
) -> Score:
    """Plain FTS5 with bm25, one table per conversation."""
    conn = apsw.Connection(":memory:")
    score = Score.named(name)
    for n, conv in enumerate(convs):
        table = f"turns_{n}"
        conn.execute(
            f"CREATE VIRTUAL TABLE {table} USING fts5(content, dia UNINDEXED,"
            f" tokenize = '{tokenizer}')"
        )
        with conn:
            conn.executemany(f"INSERT INTO {table} (dia, content) VALUES (?, ?)", conv.turns)
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
            score.add(question, [str(r[0]) for r in rows], elapsed)
    conn.close()
    return score


def render(console: Console, scores: list[Score], questions: int, conversations: int) -> None:
    """The recall table and fermix's recall@10 by category."""
    table = Table(title=f"LoCoMo turn recall, {questions} questions, {conversations} conversations")
    table.add_column("method")
    for k in KS:
        table.add_column(f"R@{k}", justify="right")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    for s in scores:
        table.add_row(
            s.name,
            *(f"{s.recall(k):.1f}" for k in KS),
            f"{s.percentile_ms(50):.2f}",
            f"{s.percentile_ms(99):.2f}",
        )
    console.print(table)
    cats = Table(title="R@10 by category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop)")
    cats.add_column("method")
    for c in CATEGORIES:
        cats.add_column(str(c), justify="right")
    for s in scores:
        cats.add_row(
            s.name,
            *(f"{100 * statistics.fmean(s.by_category[c] or [0.0]):.1f}" for c in CATEGORIES),
        )
    console.print(cats)


# ---------------------------------------------------------------------------------------
# The synthetic scale case (issue 14, item 4)

SCALE_MESSAGES = 1_000_000
SCALE_QUICK_MESSAGES = 100_000
SCALE_PER_CONVERSATION = 500
SCALE_CONVERSATIONS_PER_OWNER = 5
SCALE_SESSION = 25
SCALE_QUESTIONS = 300
SCALE_BATCH = 20_000
SCALE_LAYOUT = 1  # bump when the builder below changes what it writes
SCALE_AGENT, SCALE_CHANNEL = "bench", "scale"


def cache_root() -> Path:
    """Where built scale databases are kept: ``$XDG_CACHE_HOME/fermix-bench`` (or
    ``~/.cache/fermix-bench``), outside the repository, so they are built once."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fermix-bench"


def scale_key(index: int) -> ConversationKey:
    """The key of scale conversation ``index``."""
    return ConversationKey(SCALE_AGENT, SCALE_CHANNEL, f"c{index:05d}")


def scale_owner(index: int) -> str:
    """The owner of scale conversation ``index``: five conversations per owner."""
    return f"o{index // SCALE_CONVERSATIONS_PER_OWNER:05d}"


def scale_path(data: Path, messages: int) -> Path:
    """The cached database for ``messages`` messages of ``data``'s text.

    Its name carries the schema version and a hash of what the file holds: schema.sql,
    the data file, the scale parameters and :data:`SCALE_LAYOUT`. A change to any of them
    names another file, which is built afresh.
    """
    digest = hashlib.sha256()
    digest.update(resources.files("fermix").joinpath("schema.sql").read_bytes())
    digest.update(data.read_bytes())
    digest.update(
        repr(
            (messages, SCALE_PER_CONVERSATION, SCALE_CONVERSATIONS_PER_OWNER, SCALE_SESSION)
        ).encode()
        + repr(SCALE_LAYOUT).encode()
    )
    name = f"scale-{messages}-v{migrations.latest_version()}-{digest.hexdigest()[:16]}.db"
    return cache_root() / name


def scale_order(conversations: int, sessions: int) -> list[int]:
    """The order conversations write their sessions in: shuffled with a fixed seed, each
    conversation's own sessions in turn, so conversations interleave in the rowid space
    as they do in a shared database (each session a short run of consecutive rows)."""
    order = [c for c in range(conversations) for _ in range(sessions)]
    random.Random(14).shuffle(order)
    return order


def build_scale(convs: list[Conversation], messages: int, path: Path, console: Console) -> None:
    """Write ``messages`` messages of recycled LoCoMo turns into a new database at ``path``.

    ``messages // 500`` conversations of 500 messages, five per owner, one agent. The
    turns are taken in order, conversation ``c`` starting at turn ``500 c`` (modulo the
    number of turns), so each conversation reads as a stretch of real dialogue. Sessions
    of 25 messages interleave across conversations (:func:`scale_order`). Rows are written
    by fermix's own storage (:func:`fermix.storage.open_database`, the message insert of
    :mod:`fermix.storage.messages`, conversation rows by :mod:`~fermix.storage.conversations`)
    in transactions of :data:`SCALE_BATCH` messages, into a temporary file renamed into
    place once complete.
    """
    from fermix.storage import conversations as conversation_rows
    from fermix.storage import messages as message_rows

    turns = [content for conv in convs for _, content in conv.turns]
    count = messages // SCALE_PER_CONVERSATION
    sessions = SCALE_PER_CONVERSATION // SCALE_SESSION
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".building")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    conn = open_database(tmp)
    written = [0] * count
    start = time.perf_counter()
    try:
        with transaction(conn):
            for c in range(count):
                conversation_rows.touch(
                    conn, scale_key(c), owner_id=scale_owner(c), trust="operator"
                )
        pending = 0
        conn.execute("BEGIN IMMEDIATE")
        for n, c in enumerate(scale_order(count, sessions)):
            key, owner = scale_key(c), scale_owner(c)
            for _ in range(SCALE_SESSION):
                i = written[c]
                text = turns[(c * SCALE_PER_CONVERSATION + i) % len(turns)]
                new = NewMessage(
                    key,
                    "user" if i % 2 == 0 else "assistant",
                    text,
                    owner_id=owner,
                    trust="operator",
                )
                message_rows.insert(conn, new, created_at=1_700_000_000_000 + n * 1000 + i)
                written[c] += 1
                pending += 1
            if pending >= SCALE_BATCH:
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                pending = 0
                done = sum(written)
                console.print(
                    f"  built {done:,} of {messages:,} messages"
                    f" ({time.perf_counter() - start:.0f} s)",
                    highlight=False,
                )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    tmp.replace(path)


@dataclass
class ScaleResult:
    """Query times of the scale case, and the database's footprint."""

    messages: int
    conversation: Score
    owner: Score
    memory_recall: Score
    bytes_per_message: float
    fts_bytes_per_message: float
    build_s: float | None


def footprint(path: Path, messages: int) -> tuple[float, float]:
    """Bytes per message of the whole file, and of the message FTS index's tables."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)

    def value(sql: str) -> int:
        return int(conn.execute(sql).fetchall()[0][0])  # type: ignore[arg-type]

    try:
        page = value("PRAGMA page_size")
        size = (value("PRAGMA page_count") - value("PRAGMA freelist_count")) * page
        fts_bytes = value(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name LIKE 'messages_fts%'"
        )
    finally:
        conn.close()
    return round(size / messages, 1), round(fts_bytes / messages, 1)


def run_scale(
    convs: list[Conversation], data: Path, messages: int, console: Console
) -> ScaleResult:
    """Build (once) and time the scale case.

    :data:`SCALE_QUESTIONS` LoCoMo questions (a fixed sample), each asked in one
    conversation drawn with a fixed seed: ``search_messages(question, key=...)`` (one
    conversation, 500 messages), ``search_messages(question, agent_id=..., owner_id=...)``
    (the owner's five conversations, 2,500 messages) and ``memory_recall`` of
    ``source=history, scope=owner`` for that conversation's caller, as a tool call runs
    it (:func:`fermix.runtime.recall.recall`). The three alternate in a rotating order,
    after a warm-up that is not counted.
    """
    from fermix.core.tool_calls import Recall
    from fermix.runtime import recall as recall_tool

    path = scale_path(data, messages)
    build_s = None
    if not path.exists():
        console.print(f"building the scale database ({messages:,} messages) in {path.parent}")
        start = time.perf_counter()
        build_scale(convs, messages, path, console)
        build_s = round(time.perf_counter() - start, 1)
    per_message, fts_per_message = footprint(path, messages)
    count = messages // SCALE_PER_CONVERSATION
    questions = [q.text for conv in convs for q in conv.questions]
    rng = random.Random(4)
    asked = rng.sample(questions, min(SCALE_QUESTIONS, len(questions)))
    targets = [rng.randrange(count) for _ in asked]
    conversation = Score.named("one conversation (500 messages)")
    owner = Score.named("owner scope (5 conversations)")
    tool = Score.named("memory_recall, history, owner scope")
    db = Database(path)
    try:

        def ask(which: Score, text: str, c: int) -> None:
            key, owner_id = scale_key(c), scale_owner(c)
            start = time.perf_counter()
            if which is tool:
                call = Recall(query=text, key=None, scope="owner", source="history")
                recall_tool.recall(db, recall_tool.ConversationCaller(key, owner_id), call)
            else:
                with db.read() as reads:
                    if which is conversation:
                        reads.search_messages(text, key=key, limit=LIMIT)
                    else:
                        reads.search_messages(
                            text, agent_id=SCALE_AGENT, owner_id=owner_id, limit=LIMIT
                        )
            which.times_ms.append((time.perf_counter() - start) * 1000)

        for text, c in zip(asked[:20], targets[:20], strict=True):  # warm-up
            for which in (conversation, owner, tool):
                ask(which, text, c)
        for which in (conversation, owner, tool):
            which.times_ms.clear()
        order = (conversation, owner, tool)
        for n, (text, c) in enumerate(zip(asked, targets, strict=True)):
            for which in order[n % 3 :] + order[: n % 3]:
                ask(which, text, c)
    finally:
        db.close()
    return ScaleResult(messages, conversation, owner, tool, per_message, fts_per_message, build_s)


def render_scale(console: Console, scale: ScaleResult) -> None:
    """The scale case's query times and footprint."""
    table = Table(
        title=f"scale: {scale.messages:,} messages, {scale.messages // SCALE_PER_CONVERSATION:,}"
        f" conversations of {SCALE_PER_CONVERSATION}, {SCALE_CONVERSATIONS_PER_OWNER} per owner"
        f" ({len(scale.conversation.times_ms)} questions)"
    )
    table.add_column("search")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    for s in (scale.conversation, scale.owner, scale.memory_recall):
        table.add_row(s.name, f"{s.percentile_ms(50):.2f}", f"{s.percentile_ms(99):.2f}")
    console.print(table)
    built = "" if scale.build_s is None else f", built in {scale.build_s} s"
    console.print(
        f"database: {scale.bytes_per_message} bytes per message, of which the FTS index"
        f" {scale.fts_bytes_per_message}{built}",
        highlight=False,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table, then the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="locomo-dev.json")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"only the first conversation; a scale case of {SCALE_QUICK_MESSAGES:,} messages",
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=None,
        metavar="N",
        help=f"messages of the scale case (default {SCALE_MESSAGES:,}; 0 skips it)",
    )
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(f"no data at {args.data} (see shared/data/README.md)", file=sys.stderr)
        return 2
    console = Console()
    convs = load(args.data, quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="fermix-recall-") as tmp:
        fermix, plain = run_fermix(convs, Path(tmp))
    unicode = run_baseline(convs, "baseline: words OR-ed, unicode61", "unicode61", words_query)
    porter = run_baseline(
        convs,
        "baseline: minus stopwords, porter",
        "porter unicode61",
        lambda text: words_query(text, BASELINE_STOPWORDS),
    )
    scores = [unicode, porter, plain, fermix]
    render(console, scores, fermix.count, len(convs))
    scale_messages = args.scale
    if scale_messages is None:
        scale_messages = SCALE_QUICK_MESSAGES if args.quick else SCALE_MESSAGES
    scale = None
    if scale_messages > 0:
        scale = run_scale(load(args.data, quick=False), args.data, scale_messages, console)
        render_scale(console, scale)
    result = {
        "questions": fermix.count,
        "turn_r5": fermix.recall(5),
        "turn_r10": fermix.recall(10),
        "turn_r20": fermix.recall(20),
        "p50_ms": fermix.percentile_ms(50),
        "p99_ms": fermix.percentile_ms(99),
        "baseline_porter_r10": porter.recall(10),
        "baseline_unicode_r10": unicode.recall(10),
        "plain_fts5_r10": plain.recall(10),
        "plain_fts5_p50_ms": plain.percentile_ms(50),
        "plain_fts5_p99_ms": plain.percentile_ms(99),
        "p50_ratio_vs_plain_fts5": round(
            fermix.percentile_ms(50) / max(plain.percentile_ms(50), 0.01), 2
        ),
        "scale_messages": scale.messages if scale else 0,
        "scale_conversation_p50_ms": scale.conversation.percentile_ms(50) if scale else None,
        "scale_conversation_p99_ms": scale.conversation.percentile_ms(99) if scale else None,
        "scale_owner_p50_ms": scale.owner.percentile_ms(50) if scale else None,
        "scale_owner_p99_ms": scale.owner.percentile_ms(99) if scale else None,
        "scale_memory_recall_p50_ms": scale.memory_recall.percentile_ms(50) if scale else None,
        "scale_memory_recall_p99_ms": scale.memory_recall.percentile_ms(99) if scale else None,
        "scale_bytes_per_message": scale.bytes_per_message if scale else None,
        "scale_fts_bytes_per_message": scale.fts_bytes_per_message if scale else None,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
