"""Rendering memory rows into USER.md and MEMORY.md: caps, cuts, token budgets (C3, C4, T5).

Pure: rows in, text out, no I/O. Each file is a list of sections, each section at most its
cap of rows, the most recently updated first (ties: higher id first). A value is one line,
cut to :data:`MAX_VALUE_CHARS` characters (an ending ``…`` says it was cut).

**Which rows give way to the token budget.** When a file counts more tokens than its budget
(tiktoken, :func:`fermix.token_counts.count_tokens`), the oldest row of the section holding the
most rows is dropped, and the file is counted again, until it fits. Ties between equally
full sections drop from the section listed last in the file (Goals before Interests before
Preferences before Identity; Working Rules before Context). A section always keeps its most
recent rows, and a row that renders is never shortened to fit.

**Values are data, not markup.** Stored text is neutralised before it is rendered: control
characters and line breaks become spaces (so a value never starts a line), invisible
format characters (bidi overrides and isolates, zero-width characters, tag characters,
variation selectors) are removed, ``<`` and ``>`` become ``&lt;`` and ``&gt;`` (so no
value can spell ``</memory-context>`` or ``<|im_start|>``), backticks and a leading
Markdown marker are backslash-escaped. A file with no rows is the empty string.
"""

from __future__ import annotations

import difflib
import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

from fermix.core.categories import renders
from fermix.model import MEMORY_MD, USER_MD, MemoryRow, Revision
from fermix.token_counts import count_tokens

MAX_VALUE_CHARS: Final = 200
CUT_MARK: Final = "…"

# Unicode format characters (category Cf, as of Unicode 15) and variation selectors: all
# invisible, and all usable to hide text from a reader or to reorder what it sees.
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\ufe00-\ufe0f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f"
    "\U000e0100-\U000e01ef]+"
)
# C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# Characters that open a Markdown block when they start a list item's text.
_LEADING_MARKERS: Final = frozenset("#*+-=_|~[!")
_MARKUP = str.maketrans(
    {
        "<": "&lt;",
        ">": "&gt;",
        "\uff1c": "&lt;",
        "\uff1e": "&gt;",
        "\ufe64": "&lt;",
        "\ufe65": "&gt;",
    }
)
# "1." or "1)" opening a value would start an ordered list.
_ORDERED_ITEM = re.compile(r"^(\d{1,9})([.)])")
# Past this many characters a value is cleaned in two steps (see _clean).
_CLEAN_PREFIX_CHARS: Final = 4 * MAX_VALUE_CHARS


@dataclass(frozen=True, slots=True)
class Section:
    """One section of a prompt file: its heading, the category it shows, its row cap."""

    title: str
    category: str
    cap: int


@dataclass(frozen=True, slots=True)
class FileSpec:
    """One prompt file: resource name, file name, heading, sections and token budget."""

    name: str
    filename: str
    heading: str
    sections: tuple[Section, ...]
    token_budget: int

    def cap(self, category: str) -> int:
        """The row cap of ``category`` in this file (0 if it has no section here)."""
        return next((s.cap for s in self.sections if s.category == category), 0)


USER_FILE: Final = FileSpec(
    name=USER_MD,
    filename="USER.md",
    heading="# USER.md: what is known about the user",
    sections=(
        Section("Identity", "identity", 6),
        Section("Preferences", "preference", 6),
        Section("Interests", "interest", 6),
        Section("Goals", "goal", 5),
    ),
    token_budget=1500,
)
MEMORY_FILE: Final = FileSpec(
    name=MEMORY_MD,
    filename="MEMORY.md",
    heading="# MEMORY.md: working context and standing rules",
    sections=(
        Section("Context", "context", 12),
        Section("Working Rules", "directive", 8),
    ),
    token_budget=2000,
)
FILES: Final = (USER_FILE, MEMORY_FILE)
"""Both prompt files, in the order the composer shows them."""


class RenderedFiles(NamedTuple):
    """The text of USER.md and MEMORY.md for one agent and owner."""

    user_md: str
    memory_md: str


def file_spec(name: str) -> FileSpec:
    """The spec of resource ``name`` (``user_md`` or ``memory_md``)."""
    for spec in FILES:
        if spec.name == name:
            return spec
    raise KeyError(name)


def strip_invisible(text: str) -> str:
    """``text`` without invisible format characters, controls (newlines kept) as spaces."""
    text = _INVISIBLE.sub("", text)
    return "\n".join(_CONTROL.sub(" ", line) for line in text.split("\n"))


def escape_markup(text: str) -> str:
    """``text`` with ``<`` and ``>`` as entities, so no tag or fence can be spelled in it.

    Their fullwidth and small look-alikes are escaped the same way. Idempotent on its own
    output (``&`` is left alone), so escaping twice is harmless.
    """
    return text.translate(_MARKUP)


def _clean(text: str) -> str:
    """One line: invisibles removed, controls and whitespace runs as single spaces."""
    return " ".join(_CONTROL.sub(" ", _INVISIBLE.sub("", text)).split())


def render_value(value: str) -> str:
    """A stored value as one inert line of at most :data:`MAX_VALUE_CHARS` characters.

    The cut counts the cleaned text's characters, before ``<``, ``>``, backticks and a
    leading marker are escaped; the escapes may lengthen the line, never the fact.
    """
    # A long value is cleaned in two steps: cleaning a prefix gives a prefix of the
    # cleaned whole, so a cleaned prefix already over the limit decides the cut.
    text = _clean(value[:_CLEAN_PREFIX_CHARS])
    if len(text) <= MAX_VALUE_CHARS and len(value) > _CLEAN_PREFIX_CHARS:
        text = _clean(value)
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - len(CUT_MARK)].rstrip() + CUT_MARK
    text = escape_markup(text).replace("`", "\\`")
    if text[:1] in _LEADING_MARKERS:
        return "\\" + text
    return _ORDERED_ITEM.sub(r"\1\\\2", text, count=1)


def _order(row: MemoryRow) -> tuple[int, int]:
    return (-row.updated_at, -row.id)


def _pick(
    spec: FileSpec, rows: Iterable[MemoryRow], agent_id: str, owner_id: str
) -> list[list[str]]:
    """The lines of each section: rows that render, newest first, at most the cap."""
    by_category: dict[str, dict[int, MemoryRow]] = {s.category: {} for s in spec.sections}
    for row in rows:
        bucket = by_category.get(row.category)
        if (
            bucket is not None
            and row.promote_target == spec.name
            and renders(row, agent_id=agent_id, owner_id=owner_id)
        ):
            bucket[row.id] = row
    picked: list[list[str]] = []
    for section in spec.sections:
        candidates = by_category[section.category].values()
        lines: list[str] = []
        # Usually the first ``cap`` rows all have text; a value made only of invisible
        # characters renders as nothing and gives its place to the next row.
        want = section.cap
        while True:
            ordered = heapq.nsmallest(want, candidates, key=_order)
            lines = [line for line in map(render_value, (r.value for r in ordered)) if line]
            if len(lines) >= section.cap or len(ordered) < want:
                break
            want *= 2
        picked.append(lines[: section.cap])
    return picked


def _assemble(spec: FileSpec, picked: list[list[str]]) -> str:
    if not any(picked):
        return ""
    parts = [spec.heading, ""]
    for section, lines in zip(spec.sections, picked, strict=True):
        if lines:
            parts += [f"## {section.title}", *(f"- {line}" for line in lines), ""]
    return "\n".join(parts)


def render_file(spec: FileSpec, rows: Iterable[MemoryRow], *, agent_id: str, owner_id: str) -> str:
    """The text of ``spec``'s file for ``agent_id`` and ``owner_id`` from any rows.

    Rows that do not render there (archived, another agent or owner, another file, a scope
    that never renders) are ignored, so passing every row of the database is safe.
    """
    picked = _pick(spec, rows, agent_id, owner_id)
    text = _assemble(spec, picked)
    while text and count_tokens(text) > spec.token_budget:
        # The fullest section gives way; among equals, the one listed last.
        largest = max(range(len(picked)), key=lambda i: (len(picked[i]), i))
        picked[largest].pop()
        text = _assemble(spec, picked)
    return text


def render_user_md(rows: Iterable[MemoryRow], *, agent_id: str, owner_id: str) -> str:
    """USER.md for ``agent_id`` and ``owner_id``: Identity, Preferences, Interests, Goals."""
    return render_file(USER_FILE, rows, agent_id=agent_id, owner_id=owner_id)


def render_memory_md(rows: Iterable[MemoryRow], *, agent_id: str, owner_id: str) -> str:
    """MEMORY.md for ``agent_id`` and ``owner_id``: Context and Working Rules."""
    return render_file(MEMORY_FILE, rows, agent_id=agent_id, owner_id=owner_id)


def render_files(rows: Iterable[MemoryRow], *, agent_id: str, owner_id: str) -> RenderedFiles:
    """Both files for ``agent_id`` and ``owner_id`` from one pass over ``rows``."""
    listed = list(rows)
    return RenderedFiles(
        render_user_md(listed, agent_id=agent_id, owner_id=owner_id),
        render_memory_md(listed, agent_id=agent_id, owner_id=owner_id),
    )


def file_lags(rendered: str, current: Revision | None, on_disk: bytes | None) -> bool:
    """Whether a prompt file or its current revision lags ``rendered`` (S1, C5, P2).

    This is the one staleness rule: ``fermix doctor``, the repair at start and after a
    failed rebuild all use it. A current revision that is a rollback is the operator's
    choice (P2): the file should hold that revision until the next rebuild, so it is not
    stale while file and revision agree. A missing file is current when it would be empty.
    """
    rolled_back = current is not None and current.reason.startswith("rollback:")
    want = current.content if current is not None and rolled_back else rendered
    recorded = "" if current is None else current.content
    if recorded != want:
        return True
    missing_but_empty = on_disk is None and want == ""
    return on_disk != want.encode("utf-8") and not missing_but_empty


def revision_diff(old: Revision, new: Revision) -> str:
    """A unified diff from revision ``old`` to ``new`` of one prompt file, headed
    ``USER.md@3`` / ``USER.md@5`` (``fermix resource diff``, the console's diff). Every line
    ends with a newline: a last line without one would run into the next hunk's header."""
    filename = file_spec(new.name).filename
    lines = difflib.unified_diff(
        old.content.splitlines(keepends=True),
        new.content.splitlines(keepends=True),
        fromfile=f"{filename}@{old.revision}",
        tofile=f"{filename}@{new.revision}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
