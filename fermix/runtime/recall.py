"""The memory tools' work against storage (T1-T3, SC3).

A caller is described by plain values: a :class:`ConversationCaller` (a conversation's key
and owner) or a :class:`~fermix.model.JobCaller` (a scheduled job's run), which is admitted
only once the database vouches for its memory source and run
(:func:`fermix.runtime.jobs.check_caller`, in the same unit as the work). What it may reach
is :func:`fermix.core.categories.visible_scopes`; the arguments were checked by
:mod:`fermix.core.tool_calls`.

- ``memory_store`` writes one row at the caller's conversation or job scope, through the
  writer; such rows render nowhere, so no prompt file is rebuilt (T1) unless the row it
  replaced did;
- ``memory_recall`` looks a key up or searches, per scope group, de-duplicated and limited,
  and searches the history of this conversation or of this owner's conversations of the
  agent, never another owner's (T2);
- ``memory_sources_list`` lists the sources the caller may see (T3).

Searches fuse full-text and vector search (Q3) when this process embeds
(:mod:`fermix.runtime.indexing`) and the scope searched has vectors: history through
:func:`fermix.core.fusion.fuse_history` over the scope's messages, memory rows through
:func:`fermix.core.fusion.fuse_rows` over each scope group's rows. A row found by neither
full-text search nor a vector at least :data:`MIN_COSINE` close is not returned. Without
vectors the search is the full-text one, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fermix import validate
from fermix.core import categories, fusion, tool_calls
from fermix.core.tool_calls import Recall, Store, ToolCall, ToolError
from fermix.embedding import from_blobs
from fermix.errors import InvalidInputError
from fermix.model import (
    ConversationKey,
    JobCaller,
    MemoryRow,
    MemorySource,
    Provenance,
    Scope,
    SearchHit,
)
from fermix.runtime import indexing
from fermix.runtime.jobs import check_caller
from fermix.runtime.writer import Writer
from fermix.storage import Reads, Storage, Writes
from fermix.storage.port import CANDIDATES, MAX_SCOPE_ROWS, conversation_scope, memory_scope

MIN_COSINE = 0.2
"""How close to the query a row's vector must be for a row full-text search did not find
(SIF-pooled wordllama: related texts measure about 0.2 to 0.8, unrelated ones about 0)."""
ROWS_CONSIDERED = 2_000
"""Most recently updated rows of one scope group a memory search compares vectors with."""


@dataclass(frozen=True, slots=True)
class ConversationCaller:
    """A conversation calling the memory tools: its key and its owner."""

    key: ConversationKey
    owner_id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.key, ConversationKey):
            raise InvalidInputError(f"key must be a ConversationKey, not {self.key!r}")
        validate.identifier("owner_id", self.owner_id, allow_empty=True)


Caller = ConversationCaller | JobCaller


def agent_of(caller: Caller) -> str:
    """The agent the caller belongs to."""
    return caller.agent_id if isinstance(caller, JobCaller) else caller.key.agent_id


def home_scope(caller: Caller) -> Scope:
    """Where the caller's ``memory_store`` writes: its conversation's or its job's scope (SC2)."""
    if isinstance(caller, JobCaller):
        return categories.job_scope(caller.memory_source_id)
    return categories.conversation_scope(caller.key)


def run(db: Storage, writer: Writer, call: ToolCall, caller: Caller) -> dict[str, Any]:
    """Do one checked tool call for ``caller``; returns the JSON-ready result."""
    if isinstance(call, Store):
        return tool_calls.stored(store(writer, caller, call.key, call.value))
    if isinstance(call, Recall):
        return recall(db, caller, call)
    return tool_calls.listed(sources(db, caller))


def store(writer: Writer, caller: Caller, key: str, value: str) -> MemoryRow:
    """Store ``value`` under ``key`` at the caller's scope, replacing that key's value (T1)."""
    scope = home_scope(caller)
    agent_id, owner_id = agent_of(caller), caller.owner_id

    def unit(writes: Writes) -> list[MemoryRow]:
        if isinstance(caller, JobCaller):
            source = check_caller(writes, caller)  # under the write lock: nothing if refused
            provenance = Provenance(
                source_id=source.id,
                source_type="job",
                source_name=source.name,
                run_id=caller.run_id,
            )
        else:
            provenance = Provenance(source_type="tool", session_id=caller.key.scope_id)
        before = writes.row_by_key(agent_id=agent_id, owner_id=owner_id, scope=scope, key=key)
        after = writes.upsert_row(
            agent_id=agent_id,
            owner_id=owner_id,
            scope=scope,
            category=tool_calls.STORE_CATEGORY,
            key=key,
            value=value,
            promote_target=None,
            provenance=provenance,
        )
        # The row as it was counts too: one that rendered must leave its file.
        return [after] if before is None else [before, after]

    written = writer.write_rows(unit, label=f"memory_store {scope.type}", reason="memory_store")
    return written.rows[-1]


def recall(db: Storage, caller: Caller, call: Recall) -> dict[str, Any]:
    """The rows and/or messages ``call`` asks for, within what ``caller`` may see (T2, SC3)."""
    with db.read() as reads:
        if isinstance(caller, JobCaller):
            check_caller(reads, caller)
            if call.source != "memories":
                raise ToolError("a scheduled job can only recall its own memories, not history")
        rows = hits = None
        if call.source in ("memories", "all"):
            rows = recall_rows(reads, caller, call)
        if call.source in ("history", "all") and isinstance(caller, ConversationCaller):
            hits = recall_history(reads, caller, call.scope, call.text, call.limit)
    return tool_calls.recalled(rows, hits)


def recall_rows(reads: Reads, caller: Caller, call: Recall) -> list[MemoryRow]:
    """Rows with ``call.key``, or matching ``call.query``, in the caller's visible scopes.

    Each scope group is read on its own; a row found twice is shown once, and at most
    ``call.limit`` rows are returned, in the order the groups found them.
    """
    home = caller.key if isinstance(caller, ConversationCaller) else home_scope(caller)
    groups = categories.visible_scopes(agent_of(caller), caller.owner_id, home, call.scope)
    found: dict[int, MemoryRow] = {}
    for group in groups:
        if call.key is not None:
            rows = reads.rows(**group.filters(), key=call.key)
        else:
            rows = search_rows(reads, call.query or "", group.filters(), limit=call.limit)
        for row in rows:
            found.setdefault(row.id, row)
    return list(found.values())[: call.limit]


def recall_history(
    reads: Reads, caller: ConversationCaller, scope: str, text: str, limit: int
) -> list[SearchHit]:
    """Messages matching ``text``: this conversation's at ``current``, otherwise this
    owner's conversations of the agent. History never crosses owners (SC3)."""
    if scope == "current":
        return search_history(reads, text, key=caller.key, limit=limit)
    return search_history(
        reads, text, agent_id=caller.key.agent_id, owner_id=caller.owner_id, limit=limit
    )


def search_history(
    reads: Reads,
    text: str,
    *,
    key: ConversationKey | None = None,
    agent_id: str | None = None,
    owner_id: str | None = None,
    limit: int = 10,
    min_cosine: float | None = MIN_COSINE,
    weights: fusion.Weights = fusion.DEFAULT,
    max_rows: int = MAX_SCOPE_ROWS,
) -> list[SearchHit]:
    """Messages of the scope matching ``text``, best first: full-text and vector search
    fused (Q3) when the scope has vectors, else full-text only. A hit's ``rank`` is minus
    its score (lower is better). Only the scope's own rows and vectors are read (Q4).

    A scope of more than ``max_rows`` messages is not read whole: where the store has an
    approximate index (PostgreSQL with pgvector), its nearest rows and the full-text
    candidates are fused instead; elsewhere it is searched by full text only."""
    scope: dict[str, Any] = {"key": key, "agent_id": agent_id, "owner_id": owner_id}
    indexer = indexing.active(reads)
    if indexer is None or limit <= 0:
        return reads.search_messages(text, **scope, limit=limit)
    rows = reads.scope_vectors(**scope, limit=max_rows)
    # The best `limit` full-text hits whole, the ids and ranks of all the candidates; the
    # scope read whole above is not counted again for the ranking's statistics.
    lexical = reads.search_messages(
        text,
        **scope,
        limit=limit,
        ranked=max(CANDIDATES, limit),
        scope_rows=None if rows is None else len(rows),
    )
    query = None
    if rows is None:
        # Too large to read whole: the words weighted by this conversation's counts alone
        # (an owner's every conversation would be as large a read as the rows).
        query = indexer.query(reads, text, [conversation_scope(key)] if key else [])
        if query is None:
            return list(lexical)
        rows = reads.nearest_messages(query.tolist(), **scope, include=lexical.ids)
        if rows and indexer.embedder.counts_tokens:
            query = None  # weighted again below by the conversations the rows come from
    if not rows or all(vector is None for vector in rows.vectors):
        return list(lexical)
    if query is None:
        query = indexer.query(
            reads, text, [conversation_scope(ConversationKey(*c)) for c in rows.conversations]
        )
    if query is None:
        return list(lexical)
    vectors, present = from_blobs(rows.vectors, len(query))
    # Each row's conversation as its number in the scope (rows come by conversation).
    sizes = np.diff([*rows.starts, len(rows)])
    groups = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    history = fusion.History(groups, rows.senders, rows.created_at, vectors, present)
    index = dict(zip(rows.ids, range(len(rows)), strict=True))
    scores = {
        index[i]: -rank for i, rank in zip(lexical.ids, lexical.ranks, strict=True) if i in index
    }
    fused = fusion.fuse_history(
        text, query, history, scores, weights, min_cosine=min_cosine, limit=limit
    )
    found = {hit.message.id: hit.message for hit in lexical}
    hits = []
    for i, score in fused:
        message = found.get(rows.ids[i]) or reads.message(rows.ids[i])
        if message is not None:  # deleted since: left out
            hits.append(SearchHit(message, -score))
    return hits


def search_rows(reads: Reads, text: str, filters: dict[str, Any], *, limit: int) -> list[MemoryRow]:
    """Live rows within ``filters`` matching ``text``, best first: full-text and vector
    search fused (Q3) over the group's newest :data:`ROWS_CONSIDERED` rows when they have
    vectors, else full-text only."""
    lexical = reads.search_rows(text, **filters, limit=limit)
    indexer = indexing.active(reads)
    if indexer is None or limit <= 0:
        return lexical
    candidates = reads.rows(**filters, limit=ROWS_CONSIDERED)
    return fuse_memory_rows(reads, indexer, text, candidates, lexical, limit=limit)


def fuse_memory_rows(
    reads: Reads,
    indexer: indexing.Indexer,
    text: str,
    candidates: list[MemoryRow],
    lexical: list[MemoryRow],
    *,
    limit: int,
    min_cosine: float | None = MIN_COSINE,
) -> list[MemoryRow]:
    """``candidates`` and the full-text hits ``lexical`` (best first) fused with the
    cosine of their vectors to ``text``; ``lexical`` itself when none has a vector."""
    rows = list({row.id: row for row in (*lexical, *candidates)}.values())
    stored = reads.memory_vectors([row.id for row in rows])
    if not stored:
        return lexical[:limit]
    agents = {row.agent_id for row in rows}
    query = indexer.query(reads, text[:20_000], [memory_scope(agent) for agent in agents])
    if query is None:
        return lexical[:limit]
    vectors, present = from_blobs([stored.get(row.id) for row in rows], len(query))
    fused = fusion.fuse_rows(
        query, vectors, present, list(range(len(lexical))), min_cosine=min_cosine
    )
    return [rows[i] for i, _ in fused[:limit]]


def sources(db: Storage, caller: Caller) -> list[MemorySource]:
    """The sources the caller may see: a job its own; a conversation its owner's and the
    agent's shared ones (T3)."""
    with db.read() as reads:
        if isinstance(caller, JobCaller):
            return [check_caller(reads, caller)]
        return reads.sources(agent_id=caller.key.agent_id, owner_id=caller.owner_id)
