"""The synthetic scale case of bench/recall.py (issue 14, item 4).

A helper module (its name starts with ``_``): bench/run.py does not run it.

1,000,000 messages (``--quick``: 100,000) of recycled LoCoMo turns in conversations of 500,
five conversations per owner, one agent, sessions of 25 interleaved across conversations,
each turn with its LoCoMo speaker as ``sender``. Two files are kept in
``$XDG_CACHE_HOME/fermix-bench`` (or ``~/.cache/fermix-bench``), outside the repository, so
that each is built once:

- the messages alone, written through fermix's own storage, under a name keyed by the
  schema version and a hash of schema.sql, the data and the parameters (a schema change
  builds it again);
- a copy of it with every message's vector, computed by the background embedder's code
  (:class:`fermix.runtime.indexing.Indexer`: the same pooling, token counts and int8
  BLOBs a host stores, in batches of :data:`EMBED_BATCH` instead of 32), under the first
  one's name plus a hash of the model's name and dimension and of fermix's embedding code.

Timed on the file with vectors, p50 / p99 over :data:`SCALE_QUESTIONS` LoCoMo questions,
each asked in one conversation drawn with a fixed seed, in a rotating order after a
warm-up that is not counted:

- hybrid, as ``memory_recall`` searches history with this process's embedder registered
  (:func:`fermix.runtime.recall.search_history`): one conversation (``key=``, 500
  messages) and the owner's five conversations (``agent_id=, owner_id=``, 2,500);
- lexical, fermix's full-text search as a process without an embedder runs it
  (``Reads.search_messages``, which ``search_history`` calls then): the same two scopes;
- ``memory_recall`` of ``source=history, scope=owner`` as a tool call runs it
  (:func:`fermix.runtime.recall.recall`, hybrid).

Each query's wall time and its thread's CPU time are kept: on a machine busy with
something else the wall time grows and the CPU time much less, which tells the two apart
(the table also gives the load average before and after). And the file's bytes per
message, without vectors and with them.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import apsw
from _recall_data import LIMIT, Conversation, Score
from rich.console import Console
from rich.table import Table

from fermix.model import ConversationKey, NewMessage
from fermix.storage.sqlite import migrations
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.migrations import open_database

SCALE_MESSAGES = 1_000_000
SCALE_QUICK_MESSAGES = 100_000
SCALE_PER_CONVERSATION = 500
SCALE_CONVERSATIONS_PER_OWNER = 5
SCALE_SESSION = 25
SCALE_QUESTIONS = 300
SCALE_WARMUP = 20
SCALE_BATCH = 20_000
SCALE_LAYOUT = 2  # bump when the builder below changes what it writes (2: senders, times)
SCALE_AGENT, SCALE_CHANNEL = "bench", "scale"
SCALE_START_MS = 1_700_000_000_000
SESSION_SPACING_MS = 60_000
"""Sessions start a minute apart across the database (a conversation's next session comes
some 40 sessions later), so each session is a session to the fusion's 30-minute gap."""
EMBED_BATCH = 4_096


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
    """The cached database for ``messages`` messages of ``data``'s text, without vectors.

    Its name carries the schema version and a hash of what the file holds: schema.sql,
    the data file, the scale parameters and :data:`SCALE_LAYOUT`. A change to any of them
    names another file, which is built afresh.
    """
    digest = hashlib.sha256()
    digest.update(resources.files("fermix.storage.sqlite").joinpath("schema.sql").read_bytes())
    digest.update(data.read_bytes())
    digest.update(
        repr(
            (messages, SCALE_PER_CONVERSATION, SCALE_CONVERSATIONS_PER_OWNER, SCALE_SESSION)
        ).encode()
        + repr((SCALE_LAYOUT, SESSION_SPACING_MS)).encode()
    )
    name = f"scale-{messages}-v{migrations.latest_version()}-{digest.hexdigest()[:16]}.db"
    return cache_root() / name


def vectors_path(base: Path, model: str, dimension: int) -> Path:
    """The cached copy of ``base`` with every message's vector of ``model``.

    Keyed by ``base`` (so by the schema version and what it holds), the model's name and
    dimension, and the source of fermix's embedding code (pooling, token counts, storage):
    a change to any of them builds it again.
    """
    from fermix import embedding
    from fermix.runtime import indexing
    from fermix.storage import vectors as shared_vectors
    from fermix.storage.sqlite import vectors

    digest = hashlib.sha256(f"{model}\x1f{dimension}".encode())
    for module in (embedding, indexing, shared_vectors, vectors):
        digest.update(inspect.getsource(module).encode())
    return base.with_name(f"{base.stem}-vectors-{digest.hexdigest()[:16]}.db")


def scale_order(conversations: int, sessions: int) -> list[int]:
    """The order conversations write their sessions in: shuffled with a fixed seed, each
    conversation's own sessions in turn, so conversations interleave in the rowid space
    as they do in a shared database (each session a short run of consecutive rows)."""
    order = [c for c in range(conversations) for _ in range(sessions)]
    random.Random(14).shuffle(order)
    return order


def _fresh(path: Path) -> Path:
    """A ``.building`` file beside ``path``, with no leftover of an interrupted build."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".building")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    return tmp


def build_scale(convs: list[Conversation], messages: int, path: Path, console: Console) -> None:
    """Write ``messages`` messages of recycled LoCoMo turns into a new database at ``path``.

    ``messages // 500`` conversations of 500 messages, five per owner, one agent. The
    turns are taken in order, conversation ``c`` starting at turn ``500 c`` (modulo the
    number of turns), so each conversation reads as a stretch of real dialogue, each turn
    with its speaker as sender. Sessions of 25 messages interleave across conversations
    (:func:`scale_order`), a second apart within a session and
    :data:`SESSION_SPACING_MS` between sessions. Rows are written by fermix's own storage
    (:func:`fermix.storage.open_database`, the message insert of
    :mod:`fermix.storage.sqlite.messages`, conversation rows by
    :mod:`~fermix.storage.conversations`)
    in transactions of :data:`SCALE_BATCH` messages, into a temporary file renamed into
    place once complete.
    """
    from fermix.storage import conversations as conversation_rows
    from fermix.storage.sqlite import messages as message_rows
    from fermix.storage.sqlite.sql import SqliteSql

    turns = [(t.speaker, t.content) for conv in convs for t in conv.turns]
    count = messages // SCALE_PER_CONVERSATION
    sessions = SCALE_PER_CONVERSATION // SCALE_SESSION
    tmp = _fresh(path)
    conn = open_database(tmp)
    written = [0] * count
    start = time.perf_counter()
    try:
        with transaction(conn):
            for c in range(count):
                conversation_rows.touch(
                    SqliteSql(conn), scale_key(c), owner_id=scale_owner(c), trust="operator"
                )
        pending = 0
        conn.execute("BEGIN IMMEDIATE")
        for n, c in enumerate(scale_order(count, sessions)):
            key, owner = scale_key(c), scale_owner(c)
            for j in range(SCALE_SESSION):
                i = written[c]
                speaker, text = turns[(c * SCALE_PER_CONVERSATION + i) % len(turns)]
                new = NewMessage(
                    key,
                    "user" if i % 2 == 0 else "assistant",
                    text,
                    owner_id=owner,
                    sender=speaker,
                    trust="operator",
                )
                created_at = SCALE_START_MS + n * SESSION_SPACING_MS + j * 1000
                message_rows.insert(conn, new, created_at=created_at)
                written[c] += 1
                pending += 1
            if pending >= SCALE_BATCH:
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                pending = 0
                console.print(
                    f"  built {sum(written):,} of {messages:,} messages"
                    f" ({time.perf_counter() - start:.0f} s)",
                    highlight=False,
                )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    tmp.replace(path)


def build_vectors(base: Path, path: Path, messages: int, console: Console) -> float:
    """Copy ``base`` to ``path`` with every message's vector; returns messages per second.

    The vectors are computed and stored by :class:`fermix.runtime.indexing.Indexer`
    (``catch_up``, as ``fermix index rebuild`` runs it) with the configured default model,
    in batches of :data:`EMBED_BATCH`.
    """
    from fermix.config import Config
    from fermix.home import Home
    from fermix.runtime import indexing
    from fermix.runtime.prompt_files import PromptFiles
    from fermix.runtime.writer import Writer
    from fermix.storage.sqlite.database import Database

    tmp = _fresh(path)
    shutil.copyfile(base, tmp)
    config = Config().embedding
    with tempfile.TemporaryDirectory(prefix="fermix-scale-home-") as home_dir:
        db = Database(tmp)
        try:
            writer = Writer(db, PromptFiles(Home(Path(home_dir)), db))
            indexer = indexing.Indexer.from_config(db, writer, config)
            assert indexer is not None, "embedding is off in the default configuration"
            indexer.batch_size = EMBED_BATCH
            indexer.record()
            done = 0
            last = start = time.perf_counter()

            def progress(n: int) -> None:
                nonlocal done, last
                done += n
                if time.perf_counter() - last > 15 or done == messages:
                    last = time.perf_counter()
                    console.print(
                        f"  embedded {done:,} of {messages:,} messages"
                        f" ({last - start:.0f} s, {done / (last - start):,.0f}/s)",
                        highlight=False,
                    )

            embedded = indexer.catch_up(progress)
            rate = embedded / max(time.perf_counter() - start, 1e-9)
        finally:
            db.close()
    conn = apsw.Connection(str(tmp))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    tmp.replace(path)
    return round(rate)


@dataclass
class Footprint:
    """Bytes per message of the whole file and of its parts."""

    total: float
    fts: float
    vectors: float


def footprint(path: Path, messages: int) -> Footprint:
    """Bytes per message of the whole file (pages in use), of the message FTS index's
    tables, and of the vector tables (vectors, token counts, their scopes)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)

    def value(sql: str) -> int:
        return int(conn.execute(sql).fetchall()[0][0])  # type: ignore[arg-type]

    try:
        page = value("PRAGMA page_size")
        size = (value("PRAGMA page_count") - value("PRAGMA freelist_count")) * page
        fts_bytes = value(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name LIKE 'messages_fts%'"
        )
        vector_bytes = value(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN (SELECT name FROM"
            " sqlite_schema WHERE tbl_name IN ('message_vectors', 'embedding_tokens',"
            " 'embedding_scopes'))"
        )
    finally:
        conn.close()
    return Footprint(
        round(size / messages, 1), round(fts_bytes / messages, 1), round(vector_bytes / messages, 1)
    )


@dataclass
class ScaleResult:
    """Query times of the scale case, and the database's footprint before and after."""

    messages: int
    conversation: Score
    owner: Score
    lexical_conversation: Score
    lexical_owner: Score
    memory_recall: Score
    before: Footprint
    after: Footprint
    build_s: float | None
    embed_per_s: int | None
    load: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average before and after the timed queries."""

    def timed(self) -> tuple[Score, ...]:
        """The timed searches, in the table's order."""
        return (
            self.lexical_conversation,
            self.conversation,
            self.lexical_owner,
            self.owner,
            self.memory_recall,
        )


def run_scale(
    convs: list[Conversation], data: Path, messages: int, console: Console
) -> ScaleResult:
    """Build (once) and time the scale case (see the module's doc)."""
    from fermix.config import Config
    from fermix.core.tool_calls import Recall
    from fermix.embedding import from_config
    from fermix.home import Home
    from fermix.runtime import indexing
    from fermix.runtime import recall as recall_tool
    from fermix.runtime.prompt_files import PromptFiles
    from fermix.runtime.writer import Writer
    from fermix.storage.sqlite.database import Database

    base = scale_path(data, messages)
    build_s = None
    if not base.exists():
        console.print(f"building the scale database ({messages:,} messages) in {base.parent}")
        start = time.perf_counter()
        build_scale(convs, messages, base, console)
        build_s = round(time.perf_counter() - start, 1)
    config = Config().embedding
    embedder = from_config(config.model, api_base=config.api_base, api_key_env=config.api_key_env)
    path = vectors_path(base, embedder.name, embedder.dimension())
    embed_per_s = None
    if not path.exists():
        console.print(f"embedding the scale database's messages ({embedder.name}) into {path}")
        embed_per_s = build_vectors(base, path, messages, console)
    before, after = footprint(base, messages), footprint(path, messages)

    count = messages // SCALE_PER_CONVERSATION
    questions = [q.text for conv in convs for q in conv.questions]
    rng = random.Random(4)
    asked = rng.sample(questions, min(SCALE_QUESTIONS, len(questions)))
    targets = [rng.randrange(count) for _ in asked]
    result = ScaleResult(
        messages,
        conversation=Score("hybrid: one conversation (500 messages)"),
        owner=Score("hybrid: owner scope (5 conversations)"),
        lexical_conversation=Score("lexical: one conversation (500 messages)"),
        lexical_owner=Score("lexical: owner scope (5 conversations)"),
        memory_recall=Score("memory_recall, history, owner scope (hybrid)"),
        before=before,
        after=after,
        build_s=build_s,
        embed_per_s=embed_per_s,
    )
    timed = result.timed()
    with tempfile.TemporaryDirectory(prefix="fermix-scale-home-") as home_dir:
        db = Database(path)
        writer = Writer(db, PromptFiles(Home(Path(home_dir)), db))
        indexer = indexing.Indexer(db, writer, embedder)
        indexer.record()  # the model is recorded already: nothing is dropped
        indexing.register(db, indexer)  # searches now fuse, as in a host that embeds
        try:

            def ask(which: Score, text: str, c: int) -> None:
                key, owner_id = scale_key(c), scale_owner(c)
                cpu = time.thread_time()
                start = time.perf_counter()
                if which is result.memory_recall:
                    call = Recall(query=text, key=None, scope="owner", source="history")
                    recall_tool.recall(db, recall_tool.ConversationCaller(key, owner_id), call)
                else:
                    with db.read() as reads:
                        if which is result.conversation:
                            recall_tool.search_history(reads, text, key=key, limit=LIMIT)
                        elif which is result.owner:
                            recall_tool.search_history(
                                reads, text, agent_id=SCALE_AGENT, owner_id=owner_id, limit=LIMIT
                            )
                        elif which is result.lexical_conversation:
                            reads.search_messages(text, key=key, limit=LIMIT)
                        else:
                            reads.search_messages(
                                text, agent_id=SCALE_AGENT, owner_id=owner_id, limit=LIMIT
                            )
                which.times_ms.append((time.perf_counter() - start) * 1000)
                which.cpu_ms.append((time.thread_time() - cpu) * 1000)

            for text, c in zip(asked[:SCALE_WARMUP], targets[:SCALE_WARMUP], strict=True):
                for which in timed:
                    ask(which, text, c)
            for which in timed:
                which.times_ms.clear()
                which.cpu_ms.clear()
            load_before = os.getloadavg()[0]
            for n, (text, c) in enumerate(zip(asked, targets, strict=True)):
                shift = n % len(timed)
                for which in timed[shift:] + timed[:shift]:
                    ask(which, text, c)
            result.load = (load_before, os.getloadavg()[0])
        finally:
            indexing.unregister(db, indexer)
            db.close()
    return result


def render_scale(console: Console, scale: ScaleResult) -> None:
    """The scale case's query times and footprint."""
    table = Table(
        title=f"scale: {scale.messages:,} messages, {scale.messages // SCALE_PER_CONVERSATION:,}"
        f" conversations of {SCALE_PER_CONVERSATION}, {SCALE_CONVERSATIONS_PER_OWNER} per owner"
        f" ({len(scale.conversation.times_ms)} questions; load average {scale.load[0]:.2f}"
        f" before, {scale.load[1]:.2f} after, on {os.cpu_count()} CPUs)"
    )
    table.add_column("search")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    table.add_column("CPU p50 ms", justify="right")
    table.add_column("CPU p99 ms", justify="right")
    table.add_column("target p99", justify="right")
    targets = {
        id(scale.conversation): "< 15",  # issue 25 (issue 14: < 25)
        id(scale.lexical_conversation): "< 25",
        id(scale.owner): "< 25",  # issue 25 (issue 14: < 50)
        id(scale.lexical_owner): "< 50",
    }
    for s in scale.timed():
        table.add_row(
            s.name,
            f"{s.percentile_ms(50):.2f}",
            f"{s.percentile_ms(99):.2f}",
            f"{s.percentile_ms(50, cpu=True):.2f}",
            f"{s.percentile_ms(99, cpu=True):.2f}",
            targets.get(id(s), ""),
        )
    console.print(table)
    built = "" if scale.build_s is None else f"; messages built in {scale.build_s} s"
    embedded = "" if scale.embed_per_s is None else f"; embedded at {scale.embed_per_s:,}/s"
    console.print(
        f"database bytes per message: {scale.before.total} without vectors (FTS index"
        f" {scale.before.fts}), {scale.after.total} with them (vectors and token counts"
        f" {scale.after.vectors}){built}{embedded}",
        highlight=False,
    )
