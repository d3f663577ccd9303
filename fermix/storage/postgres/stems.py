"""The search stems of a message, as SQLite's FTS5 tokenizer makes them, for a ``tsvector``.

No PostgreSQL text-search configuration gives the stems of FTS5's ``porter unicode61
remove_diacritics 2`` (docs/postgres.md: Porter2 against Porter, other word cuts, no
``unaccent``), so the writer computes them with that very tokenizer (an in-memory apsw
connection per thread) and stores them with their positions; a search builds its
``tsquery`` from the same tokenizer. The candidate rows of a search are then exactly those
SQLite's ``MATCH`` returns, and :mod:`fermix.storage.fulltext` ranks them unchanged.

- A word the tokenizer cuts in pieces (``foo_bar``) is a phrase (``'foo' <-> 'bar'``), as a
  quoted FTS5 string is; positions are token positions, so adjacency is the same.
- The scope lexemes of migration 7 (:func:`fermix.storage.messages.conversation_token` and
  :func:`~fermix.storage.messages.owner_token`) are stored in the same ``tsvector``,
  without positions, behind ``#``: the tokenizer never keeps a ``#``, so a typed word can
  never match one (on SQLite they live in a column of their own).

PostgreSQL's limits, where a ``tsvector`` cannot hold what FTS5 indexes (only very long
messages meet them): positions above :data:`MAX_POSITION` are not stored (a word first
seen after it is stored without a position: it matches alone, not in a phrase); at most 256
positions are kept per lexeme; a lexeme over :data:`MAX_LEXEME_BYTES` bytes is left out (a
search word is at most 64 characters, so no query can name it); and lexemes past
:data:`MAX_VECTOR_BYTES` in all are left out.
"""

from __future__ import annotations

from fermix.storage import fulltext as fts

MAX_POSITION = 16_383
"""The largest position a ``tsvector`` stores."""
MAX_POSITIONS_PER_LEXEME = 256
MAX_LEXEME_BYTES = 2_046
MAX_VECTOR_BYTES = 1_000_000
"""A budget under the 1 MB a ``tsvector`` may take."""
SCOPE_MARK = "#"


def tokenizer() -> fts.Tokenize:
    """The tables' FTS5 tokenizer (:data:`fts.TOKENIZER`), one per thread."""
    return fts.standalone_tokenizer()


def lexeme(token: str) -> str:
    """``token`` quoted for a ``tsvector`` or ``tsquery`` literal."""
    return "'" + token.replace("\\", "\\\\").replace("'", "''") + "'"


def scope_lexeme(token: str) -> str:
    """A scope token (``c...z`` or ``o...z``) as the lexeme stored for it."""
    return lexeme(SCOPE_MARK + token)


def document(text: str, scope_tokens: tuple[str, ...] = ()) -> str:
    """The ``tsvector`` literal of ``text``'s stems with positions, and the scope lexemes."""
    positions: dict[str, list[int]] = {}
    late: dict[str, None] = {}
    for position, token in enumerate(tokenizer()(text), 1):
        if position <= MAX_POSITION:
            found = positions.get(token)
            if found is None:
                positions[token] = [position]
            elif len(found) < MAX_POSITIONS_PER_LEXEME:
                found.append(position)
        elif token not in positions:
            late[token] = None
    parts = [scope_lexeme(token) for token in scope_tokens]
    budget = MAX_VECTOR_BYTES
    for token, at in positions.items():
        size = len(token.encode("utf-8"))
        if size > MAX_LEXEME_BYTES or size + 8 + 2 * len(at) > budget:
            continue
        budget -= size + 8 + 2 * len(at)
        parts.append(f"{lexeme(token)}:{','.join(map(str, at))}")
    for token in late:
        size = len(token.encode("utf-8"))
        if size > MAX_LEXEME_BYTES or size + 8 > budget:
            continue
        budget -= size + 8
        parts.append(lexeme(token))
    return " ".join(parts)


def query(text: str) -> str | None:
    """The ``tsquery`` literal of :func:`fts.build_query`'s words: each word a lexeme, or a
    phrase of the tokens it is cut into, OR-ed; None when no word gives a token."""
    tokenize = tokenizer()
    parts: dict[str, None] = {}
    for word in fts.terms(text):
        tokens = tokenize(word)
        if not tokens:
            continue
        phrase = " <-> ".join(lexeme(token) for token in tokens)
        parts["(" + phrase + ")" if len(tokens) > 1 else phrase] = None
    return " | ".join(parts) or None


def scoped(words: str, scope_tokens: tuple[str, ...]) -> str:
    """``words`` (a :func:`query`) restricted to the rows holding every scope token."""
    if not scope_tokens:
        return words
    return " & ".join([*(scope_lexeme(t) for t in scope_tokens), f"({words})"])
