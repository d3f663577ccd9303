"""Admission of the reviewer's operations (E5, SC3, M1): which the review may apply.

:func:`admit` takes the operations :func:`fermix.core.review_answer.parse` read from the
model's answer and sorts them into admitted (cleaned) and refused (with a reason): the
speaker each op names, the trust gate of that speaker, the categories, the key and value
limits, and only ids shown to this review that this speaker may touch.

**Speakers (M1).** Each user message under review has an author (its ``owner_id``) and
that author's trust; each distinct author is one :class:`Speaker` with a handle (``S1``...).
An operation names the speaker whose words it comes from, and is admitted with that
speaker's trust and filed in that speaker's places: a guest's fact goes to the guest's own
profile, and a guest can never write a directive or change a shared row, whoever else
spoke in the window. The model's attribution is trusted only within the speakers present:
a window of guests only can never yield a directive or a shared row. In a window where
guests and operators both spoke, an operation attributed to an operator must also be
grounded in that operator's own words (it shares a content word with what they said in
the window, :func:`grounded`): a guest's rule the model attributes to an operator who said
something else is refused. That check narrows what a lying model can do; it is not a
proof (an operator who happened to use the same words would pass it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fermix.core import categories
from fermix.core.review_answer import Operation
from fermix.model import CATEGORIES, MemoryRow, Scope

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
class Speaker:
    """One author of the user messages under review, as the review prompt names them (M1).

    ``owner_id`` None is a review without authorship (a caller that only knows one trust):
    the rows shown are taken to be its own. ``words`` are the content words of what this
    speaker said in the window (:func:`words`), for :func:`grounded`.
    """

    handle: str
    owner_id: str | None
    trust: str
    words: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def label(self) -> str:
        """How the prompt names the speaker: ``alice (guest)``."""
        return f"{self.owner_id or 'default user'} ({self.trust})"

    def places(self, agent_id: str) -> tuple[tuple[str, Scope], ...]:
        """The (row owner, scope) pairs this speaker's facts live in and may change (SC3):
        their own profile, and the agent's working knowledge they may change (the shared
        rows for an operator, their own for a guest)."""
        owner = self.owner_id or ""
        agent_owner = "" if self.trust == "operator" else owner
        return (
            (owner, categories.owner_scope(owner)),
            (agent_owner, categories.agent_scope(agent_id)),
        )

    def may_touch(self, row: MemoryRow) -> bool:
        """Whether a ``replace`` or ``archive`` of ``row`` may be this speaker's."""
        if self.owner_id is None:
            return True
        return (row.owner_id, row.scope) in self.places(row.agent_id)


_WORD = re.compile(r"\w+")
_COMMON = frozenset(
    {
        "about",
        "after",
        "again",
        "also",
        "always",
        "been",
        "before",
        "being",
        "could",
        "does",
        "doing",
        "every",
        "from",
        "have",
        "into",
        "just",
        "like",
        "make",
        "more",
        "most",
        "much",
        "must",
        "never",
        "only",
        "over",
        "please",
        "really",
        "should",
        "some",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "very",
        "want",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "with",
        "would",
        "your",
    }
)


def words(texts: Iterable[str]) -> frozenset[str]:
    """The content words of ``texts``: lowercase, 4 letters or more, cut to their first 4
    (a crude stem: ``notes`` and ``note`` meet), common words left out."""
    found: set[str] = set()
    for text in texts:
        for word in _WORD.findall(text.lower()):
            if len(word) >= 4 and word not in _COMMON:
                found.add(word[:4])
    return frozenset(found)


def grounded(texts: Iterable[str], speaker: Speaker) -> bool:
    """Whether ``texts`` (an operation's value, key, reason, the row it changes) share a
    content word with what ``speaker`` said in the window."""
    return not words(texts).isdisjoint(speaker.words)


def sole_speaker(trust: str) -> tuple[Speaker, ...]:
    """The one speaker of a review that knows only a trust: every op is theirs."""
    return (Speaker("S1", None, trust),)


@dataclass(frozen=True, slots=True)
class Admission:
    """The operations admitted and those refused; ``authors[i]`` is the speaker of
    ``admitted[i]``, whose owner and trust the review writes it with (M1)."""

    admitted: tuple[Operation, ...]
    refused: tuple[Refusal, ...]
    authors: tuple[Speaker, ...] = ()


def _clean(text: str) -> str:
    return " ".join(text.split())


def admit(
    operations: Sequence[Operation],
    *,
    shown: Sequence[MemoryRow],
    trust: str | None = None,
    speakers: Sequence[Speaker] | None = None,
) -> Admission:
    """Apply admission (E5, SC3, M1): the speaker, the trust gate, categories, value
    limits, ids shown to this review.

    ``speakers`` are the authors of the messages under review; without them, one speaker
    at ``trust`` whose rows are all those shown (:func:`sole_speaker`). Each operation is
    admitted as the speaker it names (or the only one, when it names none and only one
    spoke); an unknown speaker, or none among several, is refused. A ``replace`` or
    ``archive`` may only name a row that was shown to this review and is one its speaker
    may touch, so text written by a user cannot steer the reviewer into another owner's or
    agent's rows. A guest can neither write ``directive`` nor change or archive one, nor
    change a shared row. In a window with guests, an operator's operation must be grounded
    in that operator's words (:func:`grounded`).
    """
    if speakers is None:
        if trust is None:
            raise ValueError("admit needs speakers or a trust")
        speakers = sole_speaker(trust)
    by_handle = {s.handle: s for s in speakers}
    mixed = {s.trust for s in speakers} == {"operator", "guest"}
    by_id = {row.id: row for row in shown}
    admitted: list[Operation] = []
    authors: list[Speaker] = []
    refused: list[Refusal] = []
    touched: set[int] = set()
    added_keys: set[tuple[str, str, str]] = set()

    def refuse(op: Operation, why: str) -> None:
        refused.append(Refusal(op, why))

    for op in operations:
        value = None if op.value is None else _clean(op.value)
        key = None if op.key is None else _key(op.key)
        if op.speaker is None and len(speakers) == 1:
            speaker = speakers[0]
        elif op.speaker is None:
            refuse(op, "names no speaker, and several people spoke")
            continue
        elif op.speaker not in by_handle:
            refuse(op, f"unknown speaker {op.speaker!r}")
            continue
        else:
            speaker = by_handle[op.speaker]
        who = speaker.trust
        if op.category is not None and op.category not in CATEGORIES:
            refuse(op, f"unknown category {op.category!r}")
            continue
        evidence = [value or "", op.key or "", op.reason or ""]
        if op.op in ("replace", "archive"):
            row = by_id.get(op.id or -1)
            if row is None:
                refuse(op, f"id {op.id} was not shown to this review")
                continue
            if row.id in touched:
                refuse(op, f"row {row.id} is already changed by this review")
                continue
            if who != "operator" and "directive" in (row.category, op.category):
                refuse(op, f"a guest ({speaker.handle}) cannot change a directive")
                continue
            if not speaker.may_touch(row):
                refuse(op, f"row {row.id} is not one {speaker.handle} ({who}) may change")
                continue
            if op.op == "archive":
                evidence += [row.key, row.value]  # a replace's new words must be the speaker's
        if op.op == "add":
            assert op.category is not None
            if not categories.may_write(op.category, who):
                refuse(op, f"a {who} ({speaker.handle}) cannot write {op.category!r}")
                continue
            if not key:
                refuse(op, "empty key")
                continue
            if (speaker.handle, op.category, key) in added_keys:
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
        if mixed and who == "operator" and not grounded(evidence, speaker):
            refuse(op, f"not in what {speaker.handle} (operator) said, and guests spoke too")
            continue
        reason = None if op.reason is None else _clean(op.reason)[:MAX_REASON_CHARS]
        clean = Operation(op.op, op.id, op.category, key, value, reason, op.speaker)
        admitted.append(clean)
        authors.append(speaker)
        if op.id is not None:
            touched.add(op.id)
        if op.op == "add" and op.category is not None and key:
            added_keys.add((speaker.handle, op.category, key))
    return Admission(tuple(admitted), tuple(refused), tuple(authors))


def _key(text: str) -> str:
    key = re.sub(r"[^\w.-]+", "_", text.strip().lower()).strip("_")
    return key[:MAX_KEY_CHARS]
