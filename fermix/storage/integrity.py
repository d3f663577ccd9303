"""The full-text mirrors ``fermix doctor`` checks, and how to read an integrity check's
problems (S4, S5): rules both adapters and the doctor share, importing no driver.

SQLite mirrors ``messages`` and ``memories`` in FTS5 tables; PostgreSQL keeps each row's
search stems beside it, and checks them under the same names, so the doctor reports and
repairs one list of mirrors whichever adapter runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from fermix.errors import InvalidInputError

FTS_MIRRORS: Final = {"messages_fts": "messages", "memories_fts": "memories"}
"""Each FTS5 mirror and its external content table (rowid = the content table's ``id``)."""
FTS_TABLES: Final = tuple(FTS_MIRRORS)
MAX_PROBLEMS: Final = 100
"""The most problems an integrity check lists (SQLite's own default)."""


def is_fts_damage(problem: str) -> bool:
    """Whether an integrity problem is damage to an FTS5 index (rebuilt from its content)."""
    return problem.lower().startswith("fts5") or "fts5 table" in problem.lower()


def fts_damage(problems: Sequence[str], table: str) -> str | None:
    """The first of ``problems`` (from :func:`integrity_problems`) that names FTS ``table``."""
    named = re.compile(rf"(?<!\w){re.escape(mirror(table))}(?!\w)")
    return next((p for p in problems if is_fts_damage(p) and named.search(p)), None)


def mirror(table: str) -> str:
    """``table``, refused unless it is one of :data:`FTS_TABLES` (it is put into SQL)."""
    if table not in FTS_MIRRORS:
        raise InvalidInputError(f"not an FTS mirror: {table!r} (one of {FTS_TABLES})")
    return table
