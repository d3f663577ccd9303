"""The one FTS5 query builder: any text in, a safe MATCH expression (or None) out.

Every search in fermix goes through :func:`build_query`. User and model text is never
passed to MATCH as syntax: it is split into word tokens, each token is quoted as an FTS5
string (so ``AND``, ``NEAR``, ``*``, ``:``, parentheses and quotes are inert), and the
tokens are OR-ed so bm25 ranks rows by how many and how rare the matched words are.
"""

from __future__ import annotations

import re

MAX_TERMS = 64
_WORD = re.compile(r"\w+", re.UNICODE)


def terms(text: str) -> list[str]:
    """The distinct search terms of ``text``, in first-seen order, at most MAX_TERMS."""
    seen: dict[str, None] = {}
    for match in _WORD.finditer(text.replace("\x00", " ")):
        word = match.group(0).lower()
        if word not in seen:
            seen[word] = None
            if len(seen) >= MAX_TERMS:
                break
    return list(seen)


def build_query(text: str) -> str | None:
    """A valid FTS5 MATCH expression for ``text``, or None when nothing is searchable."""
    words = terms(text)
    if not words:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)
