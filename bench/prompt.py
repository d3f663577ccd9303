"""Prompt-file rebuild and prompt composition, each against the same work done by hand (C4, P1).

Usage: ``python bench/prompt.py [--quick] [--rows N] [--messages N]``

A home in a temporary directory gets 10,000 memory rows of one agent and owner, spread
over the six categories at the scopes the reviewer uses (SC2), and a conversation of 200
messages. Every ratio below divides fermix's time by a baseline that does the same work,
gives the same result (checked), and runs in the same process and run: the two are timed
in alternating pairs, in a rotating order, so that a change in the machine's load hits
both alike (medians of the repetitions).

- ``rebuild_ms`` against ``rebuild_by_hand_ms``, after one shown row changed (so USER.md
  gets a new revision and is replaced; MEMORY.md is unchanged):
  :meth:`fermix.runtime.prompt_files.PromptFiles.rebuild` against a rebuild by hand at the
  floor on one raw apsw connection: the same indexed reads of the same rows (each
  section's newest, ``LIMIT`` its cap, the filters of
  :func:`fermix.core.categories.render_queries`), rendered by the same pure renderer
  (:func:`fermix.core.render.render_files`, so the texts are equal, which is checked), one
  ``BEGIN IMMEDIATE`` transaction that reads each file's current revision and records a
  new one only where the text changed, then the same atomic replacement (temp file, fsync,
  rename, fsync of the directory) of each file whose bytes differ. What the baseline leaves
  out is what fermix adds: the read session from the pool, the group-commit writer's
  thread hop, the pair's lock (a thread lock and a ``flock``), the memory-version check
  that re-renders under the write lock if a row changed meanwhile, and the retries.
- ``rebuild_unchanged_ms`` against ``rebuild_unchanged_by_hand_ms``: the same two, from
  unchanged rows (both read, render, compare with the current revisions in a write
  transaction and with the bytes on disk, and write nothing).
- ``read_rows_ms`` against ``read_rows_raw_ms``: every live row of the agent through the
  storage port (``Reads.rows``, dataclasses) against the very SQL it runs, on a raw apsw
  connection, fetched as tuples.
- ``compose_ms`` against ``compose_by_hand_ms``: :meth:`fermix.Conversation.compose` on a
  hot conversation of a running :class:`fermix.Memory` (the window from the conversation's
  actor, the files from a cache that checks them on disk) against the same message list
  built by hand at the floor with no cache: the conversation's window (its state row, then
  its messages, on the same index) read with raw apsw, both files read from disk, fenced
  (:func:`fermix.core.composer.memory_block` without its cache) and every message turned
  into its dict. The two lists are checked equal.

Figures without a baseline, to show where the time goes: ``render_ms`` (the pure
rendering both rebuilds share) and ``compose_pure_ms`` (:func:`fermix.core.composer.compose`
on inputs already in memory: the part of ``compose_ms`` that is not the actor's round trip
or the file check). Dropped: a "raw read" of all 10,000 rows as the rebuild's baseline (the
rebuild reads each section's newest rows through an index, not all of them, so that ratio
compared unlike work) and a ``SELECT`` of the 200 messages as the composer's (it neither
reads the files nor builds the messages).

Targets (issue 4): a rebuild after one change under 50 ms at 10,000 rows; compose within
2x of its baseline (here: of composing by hand, no longer of a bare read). The last line
printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
from _timing import paired_ms, repeated_ms
from rich.console import Console
from rich.table import Table

from fermix import Memory, model
from fermix.core import categories, composer, render
from fermix.core.render import FILES, RenderedFiles
from fermix.home import Home
from fermix.model import CATEGORIES, ConversationKey, MemoryRow, Message
from fermix.runtime.prompt_files import PromptFiles, RebuildResult, disk, render_pair
from fermix.storage import Writes
from fermix.storage.sqlite.database import Database

AGENT = "bench"
OWNER = ""
SYSTEM = "You are a helpful assistant."
REBUILD_TARGET_MS = 50.0
QUICK_REPEATS = 15
FULL_REPEATS = 30
COMPOSE_TARGET_RATIO = 2.0
BUSY_TIMEOUT_MS = 5_000
WORDS = [
    "tea",
    "coffee",
    "tides",
    "thesis",
    "porto",
    "lisbon",
    "marathon",
    "cello",
    "jazz",
    "python",
    "sqlite",
    "fermix",
]
ROW_COLUMNS = ", ".join(f.name for f in dataclasses.fields(MemoryRow))


def raw_connection(path: Path) -> apsw.Connection:
    """A plain apsw connection to the benchmark's database, with fermix's durability.

    The database is in WAL mode already (the mode is persistent); ``synchronous = NORMAL``
    and foreign keys are what :mod:`fermix.storage.sqlite.connection` sets on its own connections,
    so a commit costs the baseline what it costs fermix.
    """
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def median(values: list[float]) -> float:
    return statistics.median(values)


# -- seeding ------------------------------------------------------------------------------


def seed_rows(db: Database, count: int) -> None:
    """``count`` rows of AGENT and OWNER over every category, where the reviewer puts them."""

    def unit(w: Writes) -> None:
        for i in range(count):
            category = CATEGORIES[i % len(CATEGORIES)]
            scope, owner = categories.reviewer_scope(
                category, agent_id=AGENT, owner_id=OWNER, trust="operator"
            )
            words = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(12))
            w.upsert_row(
                agent_id=AGENT,
                owner_id=owner,
                scope=scope,
                category=category,
                key=f"fact-{i}",
                value=f"Fact {i}: {words}",
                promote_target=model.TARGET_OF[category],
                now=1_700_000_000_000 + i,
            )

    db.write(unit, label="bench seed")


# -- the rebuild by hand -----------------------------------------------------------------


class RebuildByHand:
    """A prompt-file rebuild of AGENT and OWNER done by hand on one raw apsw connection."""

    CURRENT = (
        "SELECT s.id, r.content FROM resources AS s LEFT JOIN resource_revisions AS r"
        " ON r.resource_id = s.id AND r.revision = s.current_revision"
        " WHERE s.agent_id = ? AND s.owner_id = ? AND s.name = ?"
    )
    NEW_RESOURCE = (
        "INSERT INTO resources (agent_id, owner_id, name, current_revision, updated_at)"
        " VALUES (?, ?, ?, 0, ?) RETURNING id"
    )
    NEW_REVISION = (
        "INSERT INTO resource_revisions (resource_id, revision, content, content_sha1, reason,"
        " created_at) SELECT ?, coalesce(max(revision), 0) + 1, ?, ?, ?, ?"
        " FROM resource_revisions WHERE resource_id = ? RETURNING revision"
    )
    MOVE_CURRENT = "UPDATE resources SET current_revision = ?, updated_at = ? WHERE id = ?"

    def __init__(self, conn: apsw.Connection, folder: Path) -> None:
        self.conn = conn
        self.folder = folder
        self.reads: list[tuple[str, tuple[Any, ...]]] = []
        for query in categories.render_queries(AGENT, OWNER):
            where = "agent_id = ? AND owner_id = ?"
            params: list[Any] = [query.agent_id, query.owner_id]
            if query.scopes is not None:
                where += (
                    " AND ("
                    + " OR ".join("(scope_type = ? AND scope_id = ?)" for _ in query.scopes)
                    + ")"
                )
                for scope in query.scopes:
                    params += [scope.type, scope.id]
            if query.scope_type is not None:
                where += " AND scope_type = ?"
                params.append(query.scope_type)
            where += " AND category = ? AND archived_at IS NULL"
            params += [query.category, render.file_spec(query.target).cap(query.category)]
            sql = (
                f"SELECT {ROW_COLUMNS} FROM memories WHERE {where}"
                " ORDER BY updated_at DESC, id DESC LIMIT ?"
            )
            self.reads.append((sql, tuple(params)))

    def rows(self) -> list[MemoryRow]:
        """Each section's newest live rows, as the rebuild reads them."""
        return [MemoryRow(*r) for sql, params in self.reads for r in self.conn.execute(sql, params)]

    def texts(self) -> RenderedFiles:
        """Both files' texts from the rows now."""
        return render.render_files(self.rows(), agent_id=AGENT, owner_id=OWNER)

    def rebuild(self) -> list[tuple[bool, bool]]:
        """Read, render, record, replace; (revision recorded, file written) of each file."""
        texts = self.texts()
        recorded = self.record(texts)
        return [
            (rev, self.replace(self.folder / spec.filename, text))
            for spec, text, rev in zip(FILES, texts, recorded, strict=True)
        ]

    def record(self, texts: RenderedFiles) -> list[bool]:
        """One write transaction: a new revision of each file whose text changed."""
        conn, now = self.conn, int(time.time() * 1000)
        out = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for spec, text in zip(FILES, texts, strict=True):
                found = conn.execute(self.CURRENT, (AGENT, OWNER, spec.name)).fetchall()
                if found:
                    resource_id, current = found[0]
                else:
                    args = (AGENT, OWNER, spec.name, now)
                    resource_id = conn.execute(self.NEW_RESOURCE, args).fetchall()[0][0]
                    current = None
                if current == text or (current is None and text == ""):
                    out.append(False)
                    continue
                digest = hashlib.sha1(text.encode("utf-8")).hexdigest()
                args2 = (resource_id, text, digest, "rebuild", now, resource_id)
                number = conn.execute(self.NEW_REVISION, args2).fetchall()[0][0]
                conn.execute(self.MOVE_CURRENT, (number, now, resource_id))
                out.append(True)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return out

    @staticmethod
    def replace(path: Path, text: str) -> bool:
        """Replace ``path`` atomically (temp file, fsync, rename, fsync of the directory)
        when its bytes differ from ``text``."""
        data = text.encode("utf-8")
        try:
            on_disk: bytes | None = path.read_bytes()
        except FileNotFoundError:
            on_disk = None
        if on_disk == data or (on_disk is None and text == ""):
            return False
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return True


def did(result: RebuildResult) -> list[tuple[bool, bool]]:
    """What fermix's rebuild did to each file, as :meth:`RebuildByHand.rebuild` says it."""
    return [(f.revision is not None, f.written) for f in result.files]


# -- the composition by hand -------------------------------------------------------------


class ComposeByHand:
    """The composed messages of one conversation, built by hand from SQLite and the files."""

    STATE = (
        "SELECT window_after_id, checkpoint_message_id FROM conversations"
        " WHERE agent_id = ? AND channel = ? AND chat_id = ? AND thread_scope = ?"
    )
    WINDOW = (
        "SELECT id, role, kind, content, metadata_json FROM messages WHERE agent_id = ?"
        " AND channel = ? AND chat_id = ? AND thread_scope = ? AND id > ?"
        " ORDER BY created_at ASC, id ASC"
    )
    ONE = "SELECT id, role, kind, content, metadata_json FROM messages WHERE id = ?"

    def __init__(self, conn: apsw.Connection, key: ConversationKey, folder: Path) -> None:
        self.conn = conn
        self.key = key.as_tuple()
        self.paths = [folder / spec.filename for spec in FILES]
        self.fence = composer.memory_block.__wrapped__  # the same fence, without its cache
        self.rules = composer.rules_block.__wrapped__  # the same rules part, likewise

    def compose(self, system: str) -> list[dict[str, Any]]:
        state = self.conn.execute(self.STATE, self.key).fetchall()
        after, checkpoint = state[0] if state else (0, None)
        rows: list[Any] = self.conn.execute(self.WINDOW, (*self.key, after)).fetchall()
        if checkpoint is not None:
            rows = self.conn.execute(self.ONE, (checkpoint,)).fetchall() + [
                r for r in rows if r[0] != checkpoint
            ]
        texts = []
        for path in self.paths:
            try:
                texts.append(path.read_bytes().decode("utf-8", "replace"))
            except FileNotFoundError:
                texts.append("")
        out: list[dict[str, Any]] = [{"role": "system", "content": system}]
        rules = self.rules(texts[1])
        if rules is not None:
            out.append({"role": "system", "content": rules})
        block = self.fence(*texts)
        if block is not None:
            out.append({"role": "system", "content": block})
        for _, role, kind, content, metadata_json in rows:
            if kind == "checkpoint":
                out.append({"role": "system", "content": f"{composer.CHECKPOINT_LABEL}\n{content}"})
                continue
            message: dict[str, Any] = {"role": role, "content": content}
            if role == "tool" or (role == "assistant" and "tool_calls" in metadata_json):
                meta = json.loads(metadata_json)
                message.update(
                    (k, meta[k]) for k in ("tool_call_id", "name", "tool_calls") if k in meta
                )
            out.append(message)
        return out


# -- the run ------------------------------------------------------------------------------


def rebuild_figures(home: Home, rows: int, repeats: int) -> dict[str, Any]:
    """The rebuild and row-read figures, on a database of ``rows`` memory rows."""
    db = Database(home.db_path)
    raw = raw_connection(home.db_path)
    try:
        seed_rows(db, rows)
        prompt_files = PromptFiles(home, db)
        prompt_files.rebuild(AGENT, OWNER)
        hand = RebuildByHand(raw, disk.prompt_dir(home, AGENT, OWNER))
        with db.read() as reads:
            assert hand.texts() == render_pair(reads, AGENT, OWNER), "the baseline renders alike"

        # Every live row of the agent: the port against the very SQL it runs.
        sql = (
            f"SELECT {ROW_COLUMNS} FROM memories WHERE agent_id = ? AND archived_at IS NULL"
            " ORDER BY updated_at DESC, id DESC"
        )

        def port_rows() -> None:
            with db.read() as reads:
                assert len(reads.rows(agent_id=AGENT)) == rows

        def raw_rows() -> None:
            assert len(raw.execute(sql, (AGENT,)).fetchall()) == rows

        read_port, read_raw = paired_ms(port_rows, raw_rows, repeats)

        # A rebuild after one shown row changed: USER.md gets a revision and is replaced.
        with db.read() as reads:
            newest = reads.rows(agent_id=AGENT, category="identity", limit=1)[0]
        changes = iter(range(10**9))

        def change() -> None:
            value = f"Changed fact {next(changes)}"
            db.write(lambda w: w.replace_row(newest.id, value=value), label="bench change")

        changed_want = [(True, True), (False, False)]

        def fermix_changed() -> None:
            assert did(prompt_files.rebuild(AGENT, OWNER)) == changed_want

        def hand_changed() -> None:
            assert hand.rebuild() == changed_want

        changed, changed_hand = paired_ms(fermix_changed, hand_changed, repeats, before=change)

        # A rebuild from unchanged rows: reads, renders, compares, writes nothing.
        unchanged_want = [(False, False), (False, False)]

        def fermix_unchanged() -> None:
            assert did(prompt_files.rebuild(AGENT, OWNER)) == unchanged_want

        def hand_unchanged() -> None:
            assert hand.rebuild() == unchanged_want

        unchanged, unchanged_hand = paired_ms(fermix_unchanged, hand_unchanged, repeats)

        picked = hand.rows()
        render_times = repeated_ms(
            lambda: render.render_files(picked, agent_id=AGENT, owner_id=OWNER), repeats
        )
        with db.read() as reads:
            assert hand.texts() == render_pair(reads, AGENT, OWNER), "the baseline renders alike"
    finally:
        raw.close()
        db.close()
    return {
        "read_rows_ms": median(read_port),
        "read_rows_raw_ms": median(read_raw),
        "read_rows_ratio_vs_raw": median(read_port) / median(read_raw),
        "rebuild_ms": median(changed),
        "rebuild_by_hand_ms": median(changed_hand),
        "rebuild_ratio_vs_by_hand": median(changed) / median(changed_hand),
        "rebuild_unchanged_ms": median(unchanged),
        "rebuild_unchanged_by_hand_ms": median(unchanged_hand),
        "rebuild_unchanged_ratio_vs_by_hand": median(unchanged) / median(unchanged_hand),
        "render_ms": median(render_times),
    }


def compose_figures(home: Home, history: int, repeats: int) -> dict[str, Any]:
    """The composition figures, on a running Memory with a hot conversation."""
    with Memory(home) as memory:
        conv = memory.conversation(AGENT, "bench", "1", owner_id=OWNER)
        for i in range(history):
            text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(40))
            conv.append("user" if i % 2 == 0 else "assistant", f"{i}: {text}")
        composed = conv.compose(SYSTEM)
        parts = 3 if composer.rules_block(conv.memory_files()[1]) else 2
        assert len(composed) == history + parts, "system prompt, rules, memory block, window"
        raw = raw_connection(home.db_path)
        try:
            hand = ComposeByHand(raw, conv.key, disk.prompt_dir(home, AGENT, OWNER))
            assert hand.compose(SYSTEM) == composed, "the baseline composes alike"
            fermix_ms, hand_ms = paired_ms(
                lambda: conv.compose(SYSTEM), lambda: hand.compose(SYSTEM), repeats
            )
        finally:
            raw.close()
        user_md, memory_md = conv.memory_files()
        window: list[Message] = conv.history()
        pure = repeated_ms(lambda: composer.compose(SYSTEM, user_md, memory_md, window), repeats)
    return {
        "compose_ms": median(fermix_ms),
        "compose_by_hand_ms": median(hand_ms),
        "compose_ratio_vs_by_hand": median(fermix_ms) / median(hand_ms),
        "compose_pure_ms": median(pure),
    }


def run(rows: int, history: int, repeats: int) -> dict[str, Any]:
    """Every figure of the benchmark, measured in one temporary home."""
    with tempfile.TemporaryDirectory(prefix="fermix-prompt-") as tmp:
        home = Home(Path(tmp))
        figures: dict[str, Any] = {"rows": rows, "history_messages": history, "repeats": repeats}
        figures |= rebuild_figures(home, rows, repeats)
        figures |= compose_figures(home, history, repeats)
    figures = {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}
    figures["rebuild_target_met"] = figures["rebuild_ms"] < REBUILD_TARGET_MS
    figures["compose_target_met"] = figures["compose_ratio_vs_by_hand"] <= COMPOSE_TARGET_RATIO
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a table and, last, one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_REPEATS} repetitions instead of {FULL_REPEATS}",
    )
    parser.add_argument("--rows", type=int, default=10_000, help="memory rows (10000)")
    parser.add_argument("--messages", type=int, default=200, help="history messages (200)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    figures = run(args.rows, args.messages, repeats=QUICK_REPEATS if args.quick else FULL_REPEATS)
    figures["loadavg"] = [load_start, os.getloadavg()[0]]

    table = Table(title=f"prompt files and composer ({args.rows} rows, {args.messages} messages)")
    table.add_column("fermix")
    table.add_column("ms", justify="right")
    table.add_column("same work by hand, ms", justify="right")
    table.add_column("ratio", justify="right")
    pairs = [
        ("read_rows_ms", "read_rows_raw_ms", "read_rows_ratio_vs_raw"),
        ("rebuild_ms", "rebuild_by_hand_ms", "rebuild_ratio_vs_by_hand"),
        (
            "rebuild_unchanged_ms",
            "rebuild_unchanged_by_hand_ms",
            "rebuild_unchanged_ratio_vs_by_hand",
        ),
        ("compose_ms", "compose_by_hand_ms", "compose_ratio_vs_by_hand"),
        ("render_ms", None, None),
        ("compose_pure_ms", None, None),
    ]
    for name, base, ratio in pairs:
        table.add_row(
            name,
            f"{figures[name]:.3f}",
            f"{figures[base]:.3f}" if base else "—",
            f"{figures[ratio]:.2f}" if ratio else "—",
        )
    Console(stderr=True).print(table)
    print(json.dumps(figures))
    return 0 if figures["rebuild_target_met"] and figures["compose_target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
