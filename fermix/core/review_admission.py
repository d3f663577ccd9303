"""Admission of the reviewer's operations (E5, SC3): which the review may apply.

:func:`admit` takes the operations :func:`fermix.core.review_answer.parse` read from the
model's answer and sorts them into admitted (cleaned) and refused (with a reason): the trust
gate, the categories, the key and value limits, and only ids shown to this review.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fermix.core import categories
from fermix.core.review_answer import Operation
from fermix.model import CATEGORIES, MemoryRow

MAX_KEY_CHARS = 80
MAX_VALUE_CHARS = 500
"""Longer values are refused, not cut: the reviewer must generalize, not paste (E4, E9)."""
MAX_REASON_CHARS = 300


@dataclass(frozen=True, slots=True)
class Refusal:
    """An operation admission refused, and why."""

    operation: Operation
    reason: str


@dataclass(frozen=True, slots=True)
class Admission:
    """The operations admitted and those refused."""

    admitted: tuple[Operation, ...]
    refused: tuple[Refusal, ...]


def _clean(text: str) -> str:
    return " ".join(text.split())


def admit(operations: Sequence[Operation], *, shown: Sequence[MemoryRow], trust: str) -> Admission:
    """Apply admission (E5, SC3): trust gate, categories, value limits, ids shown to this review.

    A ``replace`` or ``archive`` may only name a row that was shown to this review, so text
    written by a user cannot steer the reviewer into another owner's or agent's rows. A
    guest conversation can neither write ``directive`` nor change or archive one.
    """
    by_id = {row.id: row for row in shown}
    admitted: list[Operation] = []
    refused: list[Refusal] = []
    touched: set[int] = set()
    added_keys: set[tuple[str, str]] = set()

    def refuse(op: Operation, why: str) -> None:
        refused.append(Refusal(op, why))

    for op in operations:
        value = None if op.value is None else _clean(op.value)
        key = None if op.key is None else _key(op.key)
        if op.category is not None and op.category not in CATEGORIES:
            refuse(op, f"unknown category {op.category!r}")
            continue
        if op.op in ("replace", "archive"):
            row = by_id.get(op.id or -1)
            if row is None:
                refuse(op, f"id {op.id} was not shown to this review")
                continue
            if row.id in touched:
                refuse(op, f"row {row.id} is already changed by this review")
                continue
            if trust != "operator" and "directive" in (row.category, op.category):
                refuse(op, "a guest conversation cannot change a directive")
                continue
        if op.op == "add":
            assert op.category is not None
            if not categories.may_write(op.category, trust):
                refuse(op, f"a {trust} conversation cannot write {op.category!r}")
                continue
            if not key:
                refuse(op, "empty key")
                continue
            if (op.category, key) in added_keys:
                refuse(op, f"key {key!r} is added twice")
                continue
        if op.op in ("add", "replace"):
            if not value:
                refuse(op, "empty value")
                continue
            if len(value) > MAX_VALUE_CHARS:
                refuse(op, f"value is {len(value)} characters; the limit is {MAX_VALUE_CHARS}")
                continue
            if op.key is not None and not key:
                refuse(op, "empty key")
                continue
        reason = None if op.reason is None else _clean(op.reason)[:MAX_REASON_CHARS]
        clean = Operation(op.op, op.id, op.category, key, value, reason)
        admitted.append(clean)
        if op.id is not None:
            touched.add(op.id)
        if op.op == "add" and op.category is not None and key:
            added_keys.add((op.category, key))
    return Admission(tuple(admitted), tuple(refused))


def _key(text: str) -> str:
    key = re.sub(r"[^\w.-]+", "_", text.strip().lower()).strip("_")
    return key[:MAX_KEY_CHARS]
