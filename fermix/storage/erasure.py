"""``erasures``: forgetting an owner, a conversation, a message or a memory row (F1, F2, F5),
written once for both adapters (:class:`~fermix.storage.sql.Sql`).

An erasure is a record first (:func:`begin`), then :func:`step` after :func:`step`, each one
write unit that erases a bounded batch (:data:`BATCH` messages or rows), so no unit holds
the write lock long and appends of other owners go on between them. Each step finds what is
left from the rows themselves, so a step killed halfway leaves the record ``running`` and
the next start, or the same call again, goes on where the last committed step stopped
(F5). The record then keeps only a keyed hash of its subject (:func:`rows_gone`), and says
``done`` once the store's files hold no copy of what was erased (:func:`settle`, F3).

What an owner's erasure takes, in this order (each phase is done before the next starts):

1. every conversation the owner owns in which no other person wrote: its messages (replies,
   tool results, checkpoints), its conversation-scope rows, its memory source, its token
   counts and the conversation row itself, last;
2. every message the owner is the author of, everywhere (group chats included: the others'
   messages stay);
3. the conversations the owner owned in which others wrote go to the earliest other author
   (a guest): the row no longer names the owner;
4. the memory rows the owner owns, of every scope, archived or not;
5. the owner's scheduled jobs and their runs, and their memory sources;
6. the owner's prompt-file resources and every revision of them;
7. on PostgreSQL, the owner's change counters renamed to name nobody (their versions only
   grow, so a cache never sees one twice).

Whatever a message took with it goes before the message: the memory rows whose provenance
is that message (a fact the reviewer drew from it, under whatever owner it was written), a
compaction checkpoint that summarised it (the window falls back to the messages kept), its
vector, and its tokens from its conversation's token counts (a memory row's from its
agent's: :func:`fermix.storage.vectors.uncount`). Other owners' rows are never touched,
except that a prompt-file revision of theirs that may show an erased row's value is dropped
(:func:`drop_revisions`): the prompt files are rendered again first, so the current
revision never goes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from fermix import validate
from fermix.clock import now_ms
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import ERASURE_TARGETS, ConversationKey, Erasure
from fermix.storage.conversations import WHERE_KEY
from fermix.storage.sql import Sql
from fermix.storage.vectors import uncount_memories, uncount_messages

BATCH = 500
"""Messages (or memory rows, jobs, resources) one step erases at most; the runtime sizes
each step by what the last one took (:class:`fermix.runtime.forgetting.Steps`)."""

COLUMNS = (
    "id, target, agent_id, subject, subject_key, requested_by, state, counts_json,"
    " started_at, finished_at"
)
_SELECT = f"SELECT {COLUMNS} FROM erasures"


def _erasure(row: Sequence[Any]) -> Erasure:
    return Erasure(
        id=int(row[0]),
        target=row[1],
        agent_id=row[2],
        subject=row[3],
        subject_key=row[4],
        requested_by=row[5],
        state=row[6],
        counts=json.loads(row[7]),
        started_at=int(row[8]),
        finished_at=None if row[9] is None else int(row[9]),
    )


# -- the audit record ---------------------------------------------------------------------


def audit_secret(sql: Sql) -> bytes:
    """The key of the subjects' hashes, made at the first erasure (caller's transaction)."""
    found = sql.value("SELECT secret FROM audit_secret WHERE id = 1")
    if found is None:
        sql.run(
            "INSERT INTO audit_secret (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
            (secrets.token_hex(32),),
        )
        found = sql.value("SELECT secret FROM audit_secret WHERE id = 1")
    return bytes.fromhex(str(found))


def subject_key(sql: Sql, target: str, subject: str) -> str:
    """The keyed hash the audit record keeps of ``subject`` (never the subject itself)."""
    return _keyed(audit_secret(sql), target, subject)


def known_key(sql: Sql, target: str, subject: str) -> str | None:
    """:func:`subject_key` in a read: None before the first erasure made the key."""
    found = sql.value("SELECT secret FROM audit_secret WHERE id = 1")
    return None if found is None else _keyed(bytes.fromhex(str(found)), target, subject)


def _keyed(secret: bytes, target: str, subject: str) -> str:
    return hmac.new(secret, f"{target}\x1f{subject}".encode(), hashlib.sha256).hexdigest()


def begin(
    sql: Sql,
    *,
    target: str,
    subject: str,
    agent_id: str | None,
    requested_by: str,
    now: int | None = None,
) -> Erasure:
    """Record the start of an erasure of ``subject`` (caller's transaction): from here on a
    killed erasure is finished by :func:`unfinished`'s caller (F5)."""
    if target not in ERASURE_TARGETS:
        raise InvalidInputError(f"target must be one of {ERASURE_TARGETS}, not {target!r}")
    validate.text("subject", subject, max_chars=4000, allow_empty=False)
    if agent_id is not None:
        validate.identifier("agent_id", agent_id)
    validate.text("requested_by", requested_by, max_chars=200, allow_empty=False)
    key = subject_key(sql, target, subject)
    new_id = sql.value(
        "INSERT INTO erasures (target, agent_id, subject, subject_key, requested_by, state,"
        " started_at) VALUES (?, ?, ?, ?, ?, 'running', ?) RETURNING id",
        (target, agent_id, subject, key, requested_by, now_ms() if now is None else now),
    )
    return get(sql, int(new_id))


def get(sql: Sql, erasure_id: int) -> Erasure:
    """The erasure ``erasure_id``; :class:`NotFoundError` when there is none."""
    rows = sql.rows(f"{_SELECT} WHERE id = ?", (erasure_id,))
    if not rows:
        raise NotFoundError(f"no erasure {erasure_id}")
    return _erasure(rows[0])


def unfinished(sql: Sql) -> list[Erasure]:
    """The erasures not ``done``, oldest first: rows left, or a copy on disk."""
    return [_erasure(r) for r in sql.rows(f"{_SELECT} WHERE state <> 'done' ORDER BY id")]


def list_erasures(sql: Sql, *, limit: int = 100) -> list[Erasure]:
    """The newest erasure records first (the audit)."""
    validate.positive_int("limit", limit, maximum=10_000)
    return [_erasure(r) for r in sql.rows(f"{_SELECT} ORDER BY id DESC LIMIT ?", (limit,))]


def latest_id(sql: Sql) -> int:
    """The newest erasure's id (0: none): a review or compaction notes it when it starts."""
    return int(sql.value("SELECT coalesce(max(id), 0) FROM erasures"))


def since(sql: Sql, after_id: int, agent_id: str) -> bool:
    """Whether an erasure that may touch ``agent_id`` began after ``after_id``: a review or
    compaction that read before it then writes nothing (F4)."""
    return (
        sql.value(
            "SELECT 1 FROM erasures WHERE id > ? AND (agent_id IS NULL OR agent_id = ?) LIMIT 1",
            (after_id, agent_id),
        )
        is not None
    )


def _add_counts(sql: Sql, erasure: Erasure, counts: dict[str, int], work: dict[str, Any]) -> None:
    total = dict(erasure.counts)
    for kind, n in counts.items():
        total[kind] = total.get(kind, 0) + n
    old_work = json.loads(sql.value("SELECT work_json FROM erasures WHERE id = ?", (erasure.id,)))
    pairs = {tuple(p) for p in old_work.get("pairs", [])} | {tuple(p) for p in work["pairs"]}
    times = [t for t in (old_work.get("since"), work.get("since")) if t is not None]
    merged = {"pairs": sorted(pairs), "since": min(times) if times else None}
    sql.run(
        "UPDATE erasures SET counts_json = ?, work_json = ? WHERE id = ?",
        (json.dumps(total, sort_keys=True), json.dumps(merged), erasure.id),
    )


def rerender(sql: Sql, erasure_id: int) -> tuple[list[tuple[str, str]], int | None]:
    """The (agent, owner) pairs whose prompt files showed an erased row (owner ``*``: every
    owner of the agent), and since when (the earliest erased row's creation): the revisions
    :func:`drop_revisions` drops once they are rendered again."""
    work = json.loads(sql.value("SELECT work_json FROM erasures WHERE id = ?", (erasure_id,)))
    return [(a, o) for a, o in work.get("pairs", [])], work.get("since")


def rows_gone(sql: Sql, erasure_id: int) -> None:
    """The erasure's rows are gone: forget its subject (only its keyed hash stays), and say
    ``pending`` until :func:`settle` finds the store's files clean."""
    sql.run(
        "UPDATE erasures SET subject = NULL, work_json = '{}', state = 'pending'"
        " WHERE id = ? AND state = 'running'",
        (erasure_id,),
    )


def log_clean(sql: Sql, erasure_id: int, at: int) -> None:
    """A ``pending`` erasure's store files were first found clean at ``at``: its
    ``finished_at``, and the moment before which a replica's local copies may hold it."""
    sql.run(
        "UPDATE erasures SET finished_at = ? WHERE id = ? AND state = 'pending'"
        " AND finished_at IS NULL",
        (at, erasure_id),
    )


def settle(sql: Sql, erasure_ids: Iterable[int], *, now: int | None = None) -> int:
    """Say ``done`` for these ``pending`` erasures: the store's files hold none of it (F3).
    ``finished_at`` stays when :func:`log_clean` set it."""
    ids = sorted(set(erasure_ids))
    if not ids:
        return 0
    return sql.run(
        "UPDATE erasures SET state = 'done', finished_at = COALESCE(finished_at, ?)"
        f" WHERE state = 'pending' AND id IN (SELECT CAST(value AS BIGINT) FROM {_items(sql)})",
        (now_ms() if now is None else now, json.dumps(ids)),
    )


def _items(sql: Sql) -> str:
    return sql.dialect.json_items


# -- one step -----------------------------------------------------------------------------


class _Step:
    """What one step erased, by kind, and the prompt files it leaves to render again."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.pairs: set[tuple[str, str]] = set()
        self.since: int | None = None

    def add(self, kind: str, n: int) -> None:
        if n:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def showed(self, agent_id: str, owner_id: str, created_at: int) -> None:
        # A row of the default owner "" is shared: every owner's files of the agent show it.
        self.pairs.add((agent_id, owner_id or "*"))
        self.since = created_at if self.since is None else min(self.since, created_at)

    @property
    def work(self) -> dict[str, Any]:
        return {"pairs": sorted(self.pairs), "since": self.since}


def step(sql: Sql, erasure_id: int, *, batch: int = BATCH) -> dict[str, int]:
    """Erase one bounded batch of erasure ``erasure_id`` (caller's write transaction);
    return what it erased by kind, ``{}`` when nothing is left (then :func:`rows_gone`)."""
    erasure = get(sql, erasure_id)
    if erasure.state != "running" or erasure.subject is None:
        return {}
    done = _Step()
    subject = erasure.subject
    if erasure.target == "owner":
        _owner_step(sql, subject, erasure.agent_id, done, batch)
        if not done.counts and sql.dialect.retire_counters:
            # Last: the change counters no longer name the owner (their versions go on).
            agent = erasure.agent_id
            sql.run(sql.dialect.retire_counters, (str(erasure.id), subject, agent, agent))
    elif erasure.target == "conversation":
        _conversation_step(sql, _key_of(subject), done, batch)
    elif erasure.target == "message":
        _erase_messages(sql, [int(subject)], done)
    else:
        _erase_rows(sql, [int(subject)], done)
    if done.counts:
        _add_counts(sql, erasure, done.counts, done.work)
    return done.counts


def conversation_subject(key: ConversationKey) -> str:
    """A conversation's key as an erasure's subject."""
    return json.dumps(list(key.as_tuple()))


def _key_of(subject: str) -> ConversationKey:
    return ConversationKey(*json.loads(subject))


def _agent(agent_id: str | None, column: str = "agent_id") -> tuple[str, tuple[Any, ...]]:
    return ("", ()) if agent_id is None else (f" AND {column} = ?", (agent_id,))


def _owner_step(sql: Sql, owner: str, agent_id: str | None, done: _Step, batch: int) -> None:
    only, agent = _agent(agent_id, "c.agent_id")
    solo = sql.rows(
        "SELECT c.agent_id, c.channel, c.chat_id, c.thread_scope FROM conversations AS c"
        f" WHERE c.owner_id = ?{only} AND NOT EXISTS (SELECT 1 FROM messages AS m"
        " WHERE m.agent_id = c.agent_id AND m.channel = c.channel AND m.chat_id = c.chat_id"
        " AND m.thread_scope = c.thread_scope AND m.role = 'user' AND m.owner_id <> ?) LIMIT 1",
        (owner, *agent, owner),
    )
    if solo:
        _conversation_step(sql, ConversationKey(*solo[0]), done, batch)
        return
    only, agent = _agent(agent_id)
    ids = [
        int(r[0])
        for r in sql.rows(
            f"SELECT id FROM messages WHERE owner_id = ?{only} ORDER BY id LIMIT ?",
            (owner, *agent, batch),
        )
    ]
    if ids:
        _erase_messages(sql, ids, done)
        return
    # Group chats the owner owned: the earliest other author's now; the row names nobody gone.
    done.add(
        "conversations_handed_over",
        sql.run(
            "UPDATE conversations SET trust = 'guest', owner_id = coalesce((SELECT m.owner_id"
            " FROM messages AS m WHERE m.agent_id = conversations.agent_id"
            " AND m.channel = conversations.channel AND m.chat_id = conversations.chat_id"
            " AND m.thread_scope = conversations.thread_scope AND m.role = 'user'"
            f" AND m.owner_id <> ? ORDER BY m.id LIMIT 1), '') WHERE owner_id = ?{only}",
            (owner, owner, *agent),
        ),
    )
    if done.counts:
        return
    rows = [
        int(r[0])
        for r in sql.rows(
            f"SELECT id FROM memories WHERE owner_id = ?{only} ORDER BY id LIMIT ?",
            (owner, *agent, batch),
        )
    ]
    if rows:
        _erase_rows(sql, rows, done)
        return
    jobs = [
        int(r[0])
        for r in sql.rows(
            f"SELECT id FROM scheduled_jobs WHERE owner_id = ?{only} ORDER BY id LIMIT ?",
            (owner, *agent, batch),
        )
    ]
    if jobs:
        listed = json.dumps(jobs)
        in_jobs = f"IN (SELECT CAST(value AS BIGINT) FROM {_items(sql)})"
        done.add("job_runs", sql.run(f"DELETE FROM job_runs WHERE job_id {in_jobs}", (listed,)))
        done.add("jobs", sql.run(f"DELETE FROM scheduled_jobs WHERE id {in_jobs}", (listed,)))
        return
    done.add("memory_sources", _erase_sources(sql, f"owner_id = ?{only}", (owner, *agent)))
    resources = [
        int(r[0])
        for r in sql.rows(
            f"SELECT id FROM resources WHERE owner_id = ?{only} ORDER BY id LIMIT ?",
            (owner, *agent, batch),
        )
    ]
    if resources:
        listed = json.dumps(resources)
        in_res = f"IN (SELECT CAST(value AS BIGINT) FROM {_items(sql)})"
        done.add(
            "revisions",
            sql.run(f"DELETE FROM resource_revisions WHERE resource_id {in_res}", (listed,)),
        )
        done.add("prompt_files", sql.run(f"DELETE FROM resources WHERE id {in_res}", (listed,)))


def _conversation_step(sql: Sql, key: ConversationKey, done: _Step, batch: int) -> None:
    """A batch of one conversation's messages; once none is left, its own rows and then the
    conversation row itself (last: what finds the conversation stays until the end)."""
    ids = [
        int(r[0])
        for r in sql.rows(
            f"SELECT id FROM messages WHERE {WHERE_KEY} ORDER BY id LIMIT ?",
            (*key.as_tuple(), batch),
        )
    ]
    if ids:
        # Its token counts go whole at the end: nothing to take out of them before.
        _erase_messages(sql, ids, done, uncount=False)
        return
    rows = [
        int(r[0])
        for r in sql.rows(
            "SELECT id FROM memories WHERE agent_id = ? AND scope_type = 'conversation'"
            " AND scope_id = ? ORDER BY id LIMIT ?",
            (key.agent_id, key.scope_id, batch),
        )
    ]
    if rows:
        _erase_rows(sql, rows, done)
        return
    from fermix.storage.port import conversation_scope  # the token counts' scope name

    sql.run("DELETE FROM embedding_scopes WHERE name = ?", (conversation_scope(key),))
    done.add(
        "memory_sources",
        _erase_sources(
            sql,
            "agent_id = ? AND source_type = 'conversation' AND name = ?",
            (key.agent_id, key.scope_id),
        ),
    )
    done.add(
        "conversations", sql.run(f"DELETE FROM conversations WHERE {WHERE_KEY}", key.as_tuple())
    )


def _erase_sources(sql: Sql, where: str, params: tuple[Any, ...]) -> int:
    """Erase the memory sources ``where`` selects that nothing refers to any more; one that
    another owner's row still names keeps its row, no longer naming an owner (so that row
    stays byte for byte). Returns how many were erased."""
    free = (
        " AND id NOT IN (SELECT memory_source_id FROM scheduled_jobs)"
        " AND id NOT IN (SELECT source_id FROM memories WHERE source_id IS NOT NULL)"
    )
    erased = sql.run(f"DELETE FROM memory_sources WHERE {where}{free}", params)
    sql.run(f"UPDATE memory_sources SET owner_id = '' WHERE {where} AND owner_id <> ''", params)
    return erased


def _erase_messages(sql: Sql, ids: list[int], done: _Step, *, uncount: bool = True) -> None:
    """Erase messages ``ids`` and what they took with them (the module's docstring); with
    ``uncount=False``, their tokens stay in their conversations' counts (for a conversation
    erased whole, whose counts go last)."""
    items = _items(sql)
    listed = json.dumps(ids)
    in_ids = f"IN (SELECT CAST(value AS BIGINT) FROM {items})"
    # A checkpoint that summarised one of them goes too, whoever's it was.
    summaries = sql.rows(
        "SELECT c.agent_id, c.channel, c.chat_id, c.thread_scope, c.checkpoint_message_id"
        " FROM conversations AS c JOIN (SELECT m.agent_id, m.channel, m.chat_id,"
        f" m.thread_scope, min(m.id) AS first FROM messages AS m WHERE m.id {in_ids}"
        " GROUP BY m.agent_id, m.channel, m.chat_id, m.thread_scope) AS e"
        " ON e.agent_id = c.agent_id AND e.channel = c.channel AND e.chat_id = c.chat_id"
        " AND e.thread_scope = c.thread_scope"
        " WHERE c.checkpoint_message_id IS NOT NULL AND e.first <= c.window_after_id",
        (listed,),
    )
    checkpoints = [int(r[4]) for r in summaries]
    for row in summaries:
        sql.run(
            f"UPDATE conversations SET checkpoint_message_id = NULL, window_after_id = 0"
            f" WHERE {WHERE_KEY}",
            tuple(row[:4]),
        )
    # Conversations whose checkpoint is one of these messages lose it.
    sql.run(
        "UPDATE conversations SET checkpoint_message_id = NULL, window_after_id = 0"
        f" WHERE checkpoint_message_id {in_ids}",
        (listed,),
    )
    everything = sorted(set(ids) | set(checkpoints))
    listed = json.dumps(everything)
    derived = [
        int(r[0])
        for r in sql.rows(f"SELECT id FROM memories WHERE source_message_id {in_ids}", (listed,))
    ]
    if derived:
        _erase_rows(sql, derived, done)
    if uncount:
        uncount_messages(sql, everything)
    sql.run(f"DELETE FROM message_vectors WHERE message_id {in_ids}", (listed,))
    done.add("messages", sql.run(f"DELETE FROM messages WHERE id {in_ids}", (listed,)))


def _erase_rows(sql: Sql, ids: list[int], done: _Step) -> None:
    """Erase memory rows ``ids`` (archived or not), noting the prompt files that showed them."""
    listed = json.dumps(ids)
    in_ids = f"IN (SELECT CAST(value AS BIGINT) FROM {_items(sql)})"
    for agent_id, owner_id, created_at in sql.rows(
        f"SELECT agent_id, owner_id, created_at FROM memories WHERE id {in_ids}", (listed,)
    ):
        done.showed(agent_id, owner_id, int(created_at))
    uncount_memories(sql, ids)
    sql.run(f"DELETE FROM memory_vectors WHERE memory_id {in_ids}", (listed,))
    done.add("memory_rows", sql.run(f"DELETE FROM memories WHERE id {in_ids}", (listed,)))


# -- after the rows -----------------------------------------------------------------------


def drop_revisions(sql: Sql, agent_id: str, owner_id: str, *, since: int) -> int:
    """Drop the revisions of ``agent_id``'s prompt files of ``owner_id`` (``*``: of every
    owner) recorded since ``since``, except each file's current one: they may show a row
    erased meanwhile (F2). The files are rendered again first, so the current revision no
    longer shows it. Returns how many revisions went."""
    only = "" if owner_id == "*" else " AND s.owner_id = ?"
    return sql.run(
        "DELETE FROM resource_revisions WHERE id IN (SELECT r.id FROM resource_revisions AS r"
        " JOIN resources AS s ON s.id = r.resource_id WHERE s.agent_id = ?"
        f"{only} AND r.created_at >= ? AND r.revision <> s.current_revision)",
        (agent_id, *(() if owner_id == "*" else (owner_id,)), since),
    )


def owner_known(sql: Sql, owner_id: str, agent_id: str | None) -> bool:
    """Whether anything of ``owner_id`` is stored (for ``agent_id``, or any agent)."""
    only, agent = _agent(agent_id)
    for table in ("conversations", "messages", "memories", "scheduled_jobs", "resources"):
        found = sql.value(
            f"SELECT 1 FROM {table} WHERE owner_id = ?{only} LIMIT 1", (owner_id, *agent)
        )
        if found is not None:
            return True
    return False
