"""LangGraph's long-term store over fermix's memory rows (I3): :class:`FermixStore`.

A graph compiled with ``store=FermixStore(memory, agent_id)`` keeps its items as rows of
one fermix agent, in the scopes fermix already has (SC1), so what a graph stores is
recalled, reviewed, exported and forgotten with the rest of the owner's memory. ``memory``
is a :class:`~fermix.api.Memory` or a :class:`~fermix.remote.Client`: the store asks only
for the surface both offer (:mod:`fermix.surface`).

**Namespaces are scopes.** A namespace names one place a row can be, exactly:

- ``("owner", OWNER)``: the owner scope of OWNER (the owner's profile);
- ``("agent",)``: the agent scope, owner ``""``, shared by every owner of the agent and
  written by an operator only;
- ``("agent", OWNER)``: the agent scope, kept to OWNER;
- ``("conversation", OWNER, CHANNEL, CHAT[, THREAD])``: that conversation's scope, of OWNER;
- ``("job", OWNER, SOURCE_ID)``: a scheduled job's scope (its memory source's id).

Any other namespace maps to nothing and is an :class:`UnmappedNamespaceError`, both a
fermix :class:`~fermix.errors.InvalidInputError` and LangGraph's
``InvalidNamespaceError``; nothing is written. A label is an id with ``%`` and ``.``
percent-encoded (LangGraph refuses ``.`` in a label), and the default owner ``""`` is
``%00`` (no id holds a NUL): :func:`label` makes one. A search prefix may stop at any
label (``("owner",)`` is every owner's profile); one that names no owner reaches every
owner's rows of the agent, as ``Memory.list_rows`` does, so a graph node names the owner
from its config.

**Values.** A value (a JSON object) is stored as its JSON text, which fermix indexes whole
(key and value, full-text and vectors, Q3): ``index=None`` and a list of fields are both
honoured by indexing everything, ``index=False`` cannot be and is refused. Rows other
writers made in a scope (the reviewer's profile facts) read back as ``{"text": VALUE}``.
A search with a ``query`` is fermix's hybrid recall (``recall_rows``) and its ``score`` is
``1 / (1 + rank)``: fermix fuses ranks and exposes no similarity; without a query, rows
come most recently updated first. ``filter`` is matched on the decoded values, as
LangGraph's in-memory store matches (``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``).

**Writes.** A put is ``put_row``: a ``context`` row with no promote target, so it renders
into no prompt file and never becomes a directive, with ``source_type = "host"`` and the
store's ``source`` as provenance. Its trust is the store's ``trust``, else fermix's default
for the owner (a guest unless the config names it; over HTTP a host token's is a guest's):
the shared ``("agent",)`` rows need ``trust="operator"``. A delete (``value=None``)
archives the row (S7): ``restore_row`` brings it back, ``[fermix_core.retention]
archived_days`` drops it, ``forget_memory`` erases it now. Live rows never expire, so a
TTL (``ttl=``, a ``TTLConfig``) cannot be honoured and is refused (``supports_ttl`` is
False; LangGraph's own ``put`` then raises ``NotImplementedError``).

Operations of one batch run in order, each seeing the ones before; ``abatch`` runs the
batch on a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from fermix import validate
from fermix.core.categories import conversation_key_of, owner_scope_id
from fermix.errors import InvalidInputError
from fermix.model import ConversationKey, MemoryRow, Scope, check_trust
from fermix.surface import MemorySurface

__all__ = ["FermixStore", "UnmappedNamespaceError", "label", "namespace_of", "place_of"]

DEFAULT_OWNER_LABEL = "%00"
"""The label of the default owner ``""`` (a label cannot be empty; no id holds a NUL)."""
MAX_RECALLED = 1_000
"""The most rows one search asks fermix's recall for (a filter is matched on them)."""
FORMS = (
    '("owner", OWNER), ("agent",), ("agent", OWNER),'
    ' ("conversation", OWNER, CHANNEL, CHAT[, THREAD]) or ("job", OWNER, SOURCE_ID)'
)
_ESCAPED = re.compile(r"%(?:25|2[Ee])")


class UnmappedNamespaceError(InvalidInputError, InvalidNamespaceError):
    """A namespace names no fermix scope; nothing was read or written."""


def label(value: str) -> str:
    """The namespace label of an id: ``%`` and ``.`` percent-encoded, ``""`` as ``%00``."""
    if value == "":
        return DEFAULT_OWNER_LABEL
    return value.replace("%", "%25").replace(".", "%2E")


def _unlabel(text: str, what: str, *, allow_empty: bool = False) -> str:
    """The id a label names; an :class:`UnmappedNamespaceError` for one :func:`label`
    never makes."""
    if text == DEFAULT_OWNER_LABEL and allow_empty:
        return ""
    value = _ESCAPED.sub(lambda m: "%" if m.group(0) == "%25" else ".", text)
    if label(value) != text:
        raise UnmappedNamespaceError(
            f"namespace label {text[:80]!r} is not a {what} as fermix.integrations.langgraph"
            ".label writes one: '%' is '%25', '.' is '%2E'"
            + (", the default owner '%00'" if allow_empty else "")
        )
    return value


@dataclass(frozen=True, slots=True)
class Place:
    """Where one namespace's rows are: their owner and scope."""

    owner_id: str
    scope: Scope


def _unmapped(namespace: tuple[str, ...]) -> UnmappedNamespaceError:
    return UnmappedNamespaceError(
        f"namespace {namespace!r} maps to no fermix scope; a namespace is one of {FORMS}"
    )


def place_of(namespace: tuple[str, ...], agent_id: str) -> Place:
    """The owner and scope ``namespace`` names for ``agent_id`` (see the module's table);
    an :class:`UnmappedNamespaceError` when it names none."""
    kind, rest = (namespace[0], namespace[1:]) if namespace else ("", ())
    try:
        if kind == "owner" and len(rest) == 1:
            owner = _unlabel(rest[0], "owner id", allow_empty=True)
            return Place(owner, Scope("owner", owner_scope_id(owner)))
        if kind == "agent" and not rest:
            return Place("", Scope("agent", agent_id))
        if kind == "agent" and len(rest) == 1:
            return Place(_unlabel(rest[0], "owner id"), Scope("agent", agent_id))
        if kind == "conversation" and len(rest) in (3, 4):
            owner = _unlabel(rest[0], "owner id", allow_empty=True)
            parts = [_unlabel(part, "conversation id") for part in rest[1:]]
            key = ConversationKey(agent_id, *parts)
            return Place(owner, Scope("conversation", key.scope_id))
        if kind == "job" and len(rest) == 2 and rest[1].isdigit():
            owner = _unlabel(rest[0], "owner id", allow_empty=True)
            return Place(owner, Scope("job", str(int(rest[1]))))
    except UnmappedNamespaceError:
        raise
    except InvalidInputError as exc:
        raise UnmappedNamespaceError(f"namespace {namespace!r}: {exc}") from None
    raise _unmapped(namespace)


def namespace_of(row: MemoryRow) -> tuple[str, ...] | None:
    """The namespace a row is in, or None for one no namespace names (an owner-scoped
    row under another owner's scope id, which fermix's writers never make)."""
    owner = label(row.owner_id)
    if row.scope_type == "owner":
        return ("owner", owner) if row.scope_id == owner_scope_id(row.owner_id) else None
    if row.scope_type == "agent":
        if row.scope_id != row.agent_id:
            return None
        return ("agent",) if row.owner_id == "" else ("agent", owner)
    if row.scope_type == "conversation":
        try:
            key = conversation_key_of(row.agent_id, row.scope_id)
        except InvalidInputError:
            return None
        parts = [key.channel, key.chat_id] + ([key.thread_scope] if key.thread_scope else [])
        return ("conversation", owner, *(label(part) for part in parts))
    return ("job", owner, row.scope_id)


_DEPTHS = {"owner": 2, "agent": 2, "conversation": 5, "job": 3}
"""The most labels a namespace of each scope type has."""


@dataclass(frozen=True, slots=True)
class Where:
    """The rows a namespace prefix reaches, as fermix's filters: an owner, and one scope or
    every scope of a type (``exact`` when the filters are the prefix, nothing more)."""

    owner_id: str | None = None
    scope: Scope | None = None
    scope_type: str | None = None
    exact: bool = True

    def filters(self) -> dict[str, Any]:
        """Keyword arguments of ``list_rows`` and ``recall_rows``."""
        found: dict[str, Any] = {"owner_id": self.owner_id}
        if self.scope is not None:
            found["scopes"] = [self.scope]
        if self.scope_type is not None:
            found["scope_type"] = self.scope_type
        return found


def where_of(prefix: tuple[str, ...], agent_id: str) -> Where:
    """What a search under ``prefix`` reads; an :class:`UnmappedNamespaceError` for a
    prefix of no namespace of the table."""
    if not prefix:
        return Where()
    kind = prefix[0]
    if kind not in _DEPTHS or len(prefix) > _DEPTHS[kind]:
        raise _unmapped(prefix)
    if len(prefix) == 1:
        return Where(scope_type=kind)
    if kind in ("owner", "agent") or len(prefix) == _DEPTHS[kind]:
        place = place_of(prefix, agent_id)
        return Where(place.owner_id, place.scope)
    owner = _unlabel(prefix[1], "owner id", allow_empty=True)
    for part in prefix[2:]:
        _unlabel(part, "conversation id")
    # The owner's rows of the type; a CHANNEL (and CHAT) is matched on each row after.
    return Where(owner, scope_type=kind, exact=len(prefix) == 2)


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def value_of(text: str) -> dict[str, Any]:
    """A row's value as a LangGraph value: the object its JSON text holds, else
    ``{"text": text}`` (a row another writer made)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {"text": text}
    return value if isinstance(value, dict) else {"text": text}


def _encode(value: Mapping[str, Any]) -> str:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidInputError("value must be a mapping with string keys (a JSON object)")
    try:
        return json.dumps(dict(value), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"value is not JSON-serialisable: {exc}") from None


_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


def _check_filter(filter: Any) -> dict[str, Any]:
    if filter is None:
        return {}
    if not isinstance(filter, dict):
        raise InvalidInputError(f"filter must be a dict, not {type(filter).__name__}")

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for name, inner in value.items():
                if name.startswith("$") and name not in _OPERATORS:
                    raise InvalidInputError(
                        f"filter operator {name!r} is not one of {', '.join(sorted(_OPERATORS))}"
                    )
                walk(inner)

    walk(filter)
    return filter


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: nested objects, lists element-wise, operators."""
    if isinstance(wanted, dict):
        if any(name.startswith("$") for name in wanted):
            return all(_compare(value, op, operand) for op, operand in wanted.items())
        if not isinstance(value, dict):
            return False
        return all(_matches(value.get(name), inner) for name, inner in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_matches(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _compare(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False  # a missing or non-numeric field is not greater nor less
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right}.get(op, left <= right)


def _matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise InvalidInputError(
            f"match_type must be prefix or suffix, not {condition.match_type!r}"
        )
    return all(want == "*" or have == want for have, want in pairs)


def _page(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative integer, not {value!r}")
    return value


class FermixStore(BaseStore):
    """A LangGraph ``BaseStore`` over the memory rows of ``agent_id`` (I3).

    ``memory`` is a started :class:`~fermix.api.Memory` or a :class:`~fermix.remote.Client`.
    ``trust`` is what the store's writes ask for (None: fermix's default for each owner, a
    guest's unless the config names the owner; ``"operator"`` to write the shared
    ``("agent",)`` rows, which over HTTP needs an operator token). ``source`` is recorded
    as each row's provenance (``source_name``) and as who archived a deleted one.
    """

    supports_ttl = False
    __slots__ = ("_memory", "agent_id", "source", "trust")

    def __init__(
        self,
        memory: MemorySurface[Any],
        agent_id: str,
        *,
        trust: str | None = None,
        source: str = "langgraph",
    ) -> None:
        self._memory = memory
        self.agent_id = validate.identifier("agent_id", agent_id)
        self.trust = None if trust is None else check_trust(trust)
        self.source = validate.identifier("source", source)

    def __repr__(self) -> str:
        return f"FermixStore({self._memory!r}, {self.agent_id!r})"

    # -- the batch: every operation goes through here ------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; each one's result (a put's is None)."""
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` on a worker thread: fermix's calls block until committed."""
        return await asyncio.to_thread(self.batch, list(ops))

    # -- the operations ------------------------------------------------------------------

    def _item(self, row: MemoryRow, namespace: tuple[str, ...]) -> Item:
        return Item(
            value=value_of(row.value),
            key=row.key,
            namespace=namespace,
            created_at=_when(row.created_at),
            updated_at=_when(row.updated_at),
        )

    def _get(self, op: GetOp) -> Item | None:
        place = place_of(tuple(op.namespace), self.agent_id)
        rows = self._memory.list_rows(
            agent_id=self.agent_id,
            owner_id=place.owner_id,
            scopes=[place.scope],
            key=op.key,
            archived=False,
            limit=1,
        )
        return self._item(rows[0], tuple(op.namespace)) if rows else None

    def _put(self, op: PutOp) -> None:
        place = place_of(tuple(op.namespace), self.agent_id)
        if op.ttl is not None:
            raise InvalidInputError(
                "ttl cannot be honoured: fermix keeps a live row until it is deleted (archived;"
                " [fermix_core.retention] archived_days then drops it), so no item expires"
            )
        if op.index is False:
            raise InvalidInputError(
                "index=False cannot be honoured: fermix indexes every row's key and value for"
                " recall (memory_recall, the reviewer)"
            )
        if op.value is None:
            self._memory.archive_row(
                self.agent_id,
                op.key,
                scope=place.scope,
                owner_id=place.owner_id,
                trust=self.trust,
                source=self.source,
            )
            return
        self._memory.put_row(
            self.agent_id,
            op.key,
            _encode(op.value),
            scope=place.scope,
            owner_id=place.owner_id,
            trust=self.trust,
            source=self.source,
        )

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        where = where_of(prefix, self.agent_id)
        wanted = _check_filter(op.filter)
        limit, offset = _page("limit", op.limit), _page("offset", op.offset)
        query = op.query if op.query is not None and op.query.strip() else None
        if query is not None:
            exact = where.exact and not wanted
            rows = self._memory.recall_rows(
                query,
                agent_id=self.agent_id,
                limit=min(offset + limit, MAX_RECALLED) if exact else MAX_RECALLED,
                **_recall_filters(where),
            )
        else:
            rows = self._memory.list_rows(agent_id=self.agent_id, archived=False, **where.filters())
        found: list[SearchItem] = []
        for rank, row in enumerate(rows):
            namespace = namespace_of(row)
            if namespace is None or namespace[: len(prefix)] != prefix:
                continue
            value = value_of(row.value)
            if not all(_matches(value.get(name), w) for name, w in wanted.items()):
                continue
            found.append(
                SearchItem(
                    namespace,
                    row.key,
                    value,
                    _when(row.created_at),
                    _when(row.updated_at),
                    score=None if query is None else 1.0 / (1 + rank),
                )
            )
        return found[offset : offset + limit]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        limit, offset = _page("limit", op.limit), _page("offset", op.offset)
        if op.max_depth is not None:
            _page("max_depth", op.max_depth)
        rows = self._memory.list_rows(agent_id=self.agent_id, archived=False)
        names: set[tuple[str, ...]] = set()
        for row in rows:
            namespace = namespace_of(row)
            if namespace is None:
                continue
            if all(_matches_condition(c, namespace) for c in conditions):
                names.add(namespace if op.max_depth is None else namespace[: op.max_depth])
        return sorted(names)[offset : offset + limit]


def _recall_filters(where: Where) -> dict[str, Any]:
    """``recall_rows``'s filters: one ``scope`` rather than a list of them."""
    return {"owner_id": where.owner_id, "scope": where.scope, "scope_type": where.scope_type}
