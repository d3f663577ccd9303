"""The one full-text query builder and ranker: any text in, a safe MATCH (or None) out.

Every search in fermix (messages and memories, T2) goes through :func:`build_query`. User
and model text is never passed to MATCH as syntax:

- The text is cut into words at whitespace, ASCII punctuation, general and CJK punctuation,
  control characters, NUL and lone surrogates. Everything else stays inside a word,
  combining marks and CJK runs included, so a word never splits where the table's
  ``unicode61`` tokenizer would keep one token.
- Each word is quoted as an FTS5 string (``"..."``). Inside quotes ``AND``, ``OR``, ``NOT``,
  ``NEAR``, ``*``, ``^``, ``:``, ``-``, ``+`` and parentheses are inert, and FTS5 runs the
  table's own tokenizer on the word: a word such as ``foo_bar`` or ``हिन्दी`` that
  ``unicode61`` cuts in pieces becomes a phrase of exactly the tokens a document has.
- English stopwords (:data:`STOPWORDS`: the NLTK list plus question scaffolding such as
  "kind", "ever", "likely") are dropped; when nothing else is left the stopwords are kept,
  so "to be or not to be" still finds something. Words without a letter or digit (emoji,
  symbols) and words over :data:`MAX_TERM_CHARS` are dropped. Duplicates are removed.
- At most :data:`MAX_TERMS` words are kept, from the first :data:`MAX_CHARS_SCANNED`
  characters, so any text, 100 KB of it or more, builds a query in about a millisecond.
- The words are OR-ed: a row matches when it holds any of them.

FTS5's ``bm25()`` ranks by statistics of the whole table, every conversation and agent
together, and computing them walks every row holding each word, whatever the scope. A
speaker's name is rare over the table but in half the rows of its own chat, so it
outweighs the words that matter. A search therefore asks FTS5 only for the rows of its scope
holding a word (:class:`fermix.storage.sqlite.messages.SearchScope`), orders them by bm25 with the
scope's statistics (:func:`preselect`: FTS5's own formula and parameters), and :func:`rank`
re-scores the best :data:`CANDIDATES` with bm25 over the searched scope: row count of
the scope, document frequencies and average length of the candidates, ``k1 = 1.2``,
``b = 0.3`` (a chat turn is not penalised much for a long photo caption), the idf raised to
the power 1.5 (rare words count more), then one round of pseudo-relevance feedback: the ten
most distinctive words of the two best rows are added at weight 0.2 and the candidates
re-scored. Feedback only reorders: no row is returned that holds none of the typed words.

Measured by ``bench/recall.py`` on LoCoMo (five conversations in one database, 760
questions of categories 1-4, turn-level recall in %):

| query and ranking                                          | R@5  | R@10 | R@20 |
|------------------------------------------------------------|------|------|------|
| baseline: words OR-ed, unicode61, bm25 per conversation    | 42.3 | 51.6 | 59.1 |
| baseline: minus NLTK stopwords, porter, bm25 per conv.     | 50.1 | 58.4 | 66.0 |
| these words, FTS5 bm25 over the shared table               | 46.2 | 54.6 | 61.8 |
| + bm25 over the searched scope (k1 1.2, b 0.75)            | 50.9 | 59.4 | 66.6 |
| + b 0.3                                                    | 53.5 | 60.2 | 67.7 |
| + idf^1.5                                                  | 54.4 | 61.7 | 67.7 |
| + pseudo-relevance feedback: fermix                        | 56.3 | 62.9 | 69.3 |
| fermix with NLTK stopwords only (no question scaffolding)  | 55.4 | 62.4 | 68.7 |

Ordering the candidates by bm25 over the scope (:func:`preselect`) instead of FTS5's
``bm25()`` over the table leaves these figures as they were (56.3 / 62.9 / 69.3).
fermix beats the porter baseline on each conversation run alone (R@10 +3.3 to +5.3).
Candidates: 100 give 60.7 R@10, 200 give 62.8, 250 and more 62.9. A search costs p50
6.1 ms, p99 12.5 ms on a shared 2-CPU machine, against 1.5 / 2.9 ms for FTS5's bm25 alone
on the same table; :func:`rank` takes about two thirds of it (tokenizing the candidates and
two scoring passes).

Tried and not kept (same data; within about one point is noise at 760 questions): prefix
queries (``"word"*`` for words of 4 to 8 letters: -0.4 to +0.3 R@10); a bonus for rows
holding more of the query words (-0.1 to -1.1); a bonus for query bigrams found adjacent
(0 to -0.1); dropping words found in over 10 % of the scope (+0.5 R@10, -0.6 R@20);
feedback that also fetches rows holding only feedback words (+0.2 to +0.7 R@10, but a
second query and hits holding none of the typed words); more feedback rows or weight
(3 rows: -0.8; weight 0.3: -0.1); more stopwords (go, went, get, got, think, yes: +0.1);
other bm25 settings (k1 0.9-1.5, b 0.2-0.5, idf^2: within 0.5). Other tokenizers, baseline
query: trigram 56.9 R@10, plain unicode61 55.4, porter 58.4: porter stays.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import TYPE_CHECKING, cast

import apsw

if TYPE_CHECKING:  # numpy is imported by the functions that rank: a search needs it, and
    # `fermix memory list` (which imports this module through the storage) does not (60 ms)
    import numpy as np
    from numpy.typing import NDArray

# The tokenizer of messages_fts and memories_fts in schema.sql; rank() must split text
# exactly as the tables do.
TOKENIZER = ("porter", ("unicode61", "remove_diacritics", "2"))
MAX_TERMS = 32
MAX_TERM_CHARS = 64
MAX_CHARS_SCANNED = 16_384
MAX_RANKED_CHARS = 20_000

# NLTK's English list, contractions split as unicode61 splits them ("don't" -> don, t).
_ENGLISH_STOPWORDS = """
    a about above after again against ain all am an and any are aren as at be because been
    before being below between both but by can couldn d did didn do does doesn doing don
    down during each few for from further had hadn has hasn have haven having he her here
    hers herself him himself his how i if in into is isn it its itself just ll m ma me
    mightn more most mustn my myself needn no nor not now o of off on once only or other
    our ours ourselves out over own re s same shan she should shouldn so some such t than
    that the their theirs them themselves then there these they this those through to too
    under until up ve very was wasn we were weren what when where which while who whom why
    will with won wouldn y you your yours yourself yourselves
"""
# Question scaffolding: words a question is phrased with, not what it asks about.
_QUESTION_WORDS = """
    also anything could ever kind kinds likely many may might much must often one ones
    shall something sort thing things type types way ways would
"""
STOPWORDS = frozenset((_ENGLISH_STOPWORDS + _QUESTION_WORDS).split())

# Cut points: whitespace, C0/C1 controls and NUL, ASCII punctuation (every FTS5 operator
# character among them), Latin-1 punctuation, general punctuation, CJK and fullwidth
# punctuation, and lone surrogates (which cannot be encoded for SQLite).
_CUT = (
    r"\s\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x9f\xa1\xa7\xab\xb6\xb7\xbb\xbf\xd7\xf7"
    r"\u2000-\u206f\u3000-\u3003\u3008-\u3011\u3014-\u301f\ufe10-\ufe19\ufe30-\ufe4f"
    r"\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\ud800-\udfff"
)
_WORD = re.compile(f"[^{_CUT}]+")
_ALNUM = re.compile(r"[^\W_]")


def terms(text: str, *, stopwords: bool = True) -> list[str]:
    """The distinct search words of ``text``, lower-cased, in first-seen order.

    Stopwords are left out unless they are all there is (or ``stopwords`` is False); at
    most :data:`MAX_TERMS` words are returned.
    """
    kept: list[str] = []
    common: list[str] = []
    words = _WORD.findall(text[:MAX_CHARS_SCANNED].lower())
    if len(text) > MAX_CHARS_SCANNED and words:
        words.pop()  # the cut may have split the last word
    # De-duplicating in C first keeps a long or repetitive text cheap.
    for word in dict.fromkeys(words):
        if len(word) > MAX_TERM_CHARS or not _ALNUM.search(word):
            continue
        if stopwords and word in STOPWORDS:
            if len(common) < MAX_TERMS:
                common.append(word)
            continue
        kept.append(word)
        if len(kept) >= MAX_TERMS:
            break
    return kept or common


def quote(word: str) -> str:
    """``word`` as an FTS5 string: operators inside it are inert."""
    return '"' + word.replace('"', '""') + '"'


def build_query(text: str) -> str | None:
    """A valid FTS5 MATCH expression for ``text``, or None when nothing is searchable."""
    words = terms(text)
    if not words:
        return None
    return " OR ".join(quote(word) for word in words)


Tokenize = Callable[[str], list[str]]


_local = threading.local()


def standalone_tokenizer() -> Tokenize:
    """The tables' FTS5 tokenizer on an in-memory SQLite of this thread's own: the stems of
    a store that is not SQLite (PostgreSQL's search columns) are SQLite's, word for word."""
    tokenize: Tokenize | None = getattr(_local, "tokenize", None)
    if tokenize is None:
        conn = apsw.Connection(":memory:")
        tokenize = tokenizer(conn)
        _local.conn = conn
        _local.tokenize = tokenize
    return tokenize


def tokenizer(conn: apsw.Connection) -> Tokenize:
    """The tables' FTS5 tokenizer on ``conn``, as a function from text to tokens (stems)."""
    name, args = TOKENIZER
    fts5_tokenize = conn.fts5_tokenizer(name, list(args))

    def tokenize(text: str) -> list[str]:
        found = fts5_tokenize(
            text.encode("utf-8", "replace"),
            apsw.FTS5_TOKENIZE_DOCUMENT,
            None,
            include_offsets=False,
            include_colocated=False,
        )
        return cast(list[str], found)

    return tokenize


# A private-use character: unicode61 keeps it as one token of its own, and porter leaves it.
_SEPARATOR = "\ue000"


@dataclass(frozen=True, slots=True)
class Matched:
    """Rows that matched a search, tokenized once for :func:`preselect` and :func:`rank`:
    how often each query token occurs in each row (``counts[k, i]``: token ``k`` of the
    query given to :func:`tokenize_matches`, row ``i``), each row's length in tokens, and
    the rows' tokens as one flat tuple, of which :meth:`tokens` cuts out a row's."""

    counts: NDArray[np.float64]
    lengths: NDArray[np.int64]
    flat: tuple[str, ...]
    starts: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.lengths)

    def take(self, rows: Sequence[int]) -> Matched:
        """The :class:`Matched` of ``rows`` alone, in that order."""
        import numpy as np

        lengths = self.lengths[list(rows)]
        flat = tuple(chain.from_iterable(self.tokens(rows)))
        return Matched(self.counts[:, list(rows)], lengths, flat, np.cumsum(lengths) - lengths)

    def tokens(self, rows: Iterable[int]) -> list[tuple[str, ...]]:
        """The tokens of each of ``rows``, as :func:`tokenize_each` gives them."""
        starts = self.starts.tolist()
        ends = (self.starts + self.lengths).tolist()
        return [self.flat[starts[i] : ends[i]] for i in rows]


def tokenize_matches(documents: Sequence[str], query: Sequence[str], tokenize: Tokenize) -> Matched:
    """The :class:`Matched` of ``documents`` (their first :data:`MAX_RANKED_CHARS`
    characters each) for the query tokens ``query``.

    The documents are joined by :data:`_SEPARATOR` (removed from them first) and tokenized
    by one call: per call overhead dominates short rows. One C-level pass of a dict over the
    tokens then finds both the separators and the query's tokens, and numpy counts them per
    row, so no Python object is made per row: a row's tuple of tokens is cut out only for
    the candidates :func:`rank` re-scores (:meth:`Matched.take`). With :func:`preselect`
    and :func:`rank` scoring a term at a time, the ranking of an owner's search at
    1,000,000 messages (bench/recall.py's 300 questions) costs p50 2.25 / p99 5.4 ms of
    CPU, against 2.9 / 7.4 ms with a tuple, a ``Counter`` and a set per row, and 1.6 ms
    less where over 600 rows match. A tokenizer that does not keep the separator is called
    per document.
    """
    import numpy as np

    n = len(documents)
    if n == 0:
        none = np.zeros(0, dtype=np.int64)
        return Matched(np.zeros((len(query), 0)), none, (), none)
    texts = [doc[:MAX_RANKED_CHARS].replace(_SEPARATOR, " ") for doc in documents]
    # The separator's code is len(query); a query token that is the separator itself is
    # in no document (it was removed from them) and keeps a count of 0.
    code = {term: k for k, term in enumerate(query) if term != _SEPARATOR}
    code[_SEPARATOR] = len(query)
    flat = tuple(tokenize(f" {_SEPARATOR} ".join(texts)))
    codes = np.fromiter(map(code.get, flat, repeat(-1)), np.int64, len(flat))
    separators = codes == len(query)
    cuts = np.flatnonzero(separators)
    if len(cuts) == n - 1:
        starts = np.concatenate(([0], cuts + 1)).astype(np.int64)
        lengths = np.diff(np.concatenate((starts, [len(flat) + 1]))) - 1
        row = np.cumsum(separators)  # a token's row: the separators before it
    else:
        each = [tuple(tokenize(text)) for text in texts]
        flat = tuple(chain.from_iterable(each))
        lengths = np.fromiter(map(len, each), np.int64, n)
        starts = np.cumsum(lengths) - lengths
        row = np.repeat(np.arange(n, dtype=np.int64), lengths)
        codes = np.fromiter(map(code.get, flat, repeat(-1)), np.int64, len(flat))
    held = (codes >= 0) & (codes < len(query))
    counts = np.bincount(codes[held] * n + row[held], minlength=len(query) * n)
    return Matched(counts.reshape(len(query), n).astype(np.float64), lengths, flat, starts)


@dataclass(frozen=True, slots=True)
class Ranking:
    """Parameters of :func:`rank` (defaults measured by ``bench/recall.py``)."""

    k1: float = 1.2
    b: float = 0.3
    idf_power: float = 1.5
    feedback_rows: int = 2
    feedback_terms: int = 10
    feedback_weight: float = 0.2


DEFAULT_RANKING = Ranking()


def query_tokens(text: str, tokenize: Tokenize) -> list[str]:
    """The distinct tokens (stems) of ``text``'s search words, as the tables index them."""
    return list(dict.fromkeys(tokenize(" ".join(terms(text)))))


def tokenize_each(documents: Sequence[str], tokenize: Tokenize) -> list[tuple[str, ...]]:
    """Each document's tokens (its first :data:`MAX_RANKED_CHARS` characters), from one
    tokenizer call (:func:`tokenize_matches`). Each document's tokens are a tuple: Python's
    garbage collector stops tracking a tuple of strings at its first look, so the hundreds
    a search holds are not promoted to the oldest generation, whose full collections then
    come less often (bench/recall.py's owner search at 1,000,000 messages: 8 full
    collections in 320 searches, 10 with lists)."""
    return tokenize_matches(documents, (), tokenize).tokens(range(len(documents)))


def preselect(found: Matched, *, scope_rows: int, keep: int) -> list[int]:
    """The indices of the best ``keep`` of the matched rows ``found``, best first; rows that
    tie keep their order.

    The score is FTS5's own ``bm25()`` (k1 1.2, b 0.75, idf ``log((N - n + 0.5) /
    (n + 0.5))``, at least 1e-6) with the statistics of the searched scope instead of the
    whole table: N is ``scope_rows``, n the number of rows of ``found`` holding the term
    (every row of the scope that holds it, when ``found`` are all the scope's matches) and
    the average length that of ``found``. It orders the candidates :func:`rank` re-scores,
    as FTS5's ``bm25()`` ordering over the whole table did before the search was bounded
    by its scope (schema migration 7). Each query token is one numpy pass over the rows.
    """
    import numpy as np

    n = len(found)
    if n == 0 or len(found.counts) == 0:
        return list(range(min(n, keep)))
    rows = max(scope_rows, n)
    k1, b = 1.2, 0.75
    norms = k1 * (1 - b + b * found.lengths / max(int(found.lengths.sum()) / n, 1.0))
    scores = np.zeros(n, dtype=np.float64)
    for tf in found.counts:
        df = int(np.count_nonzero(tf))
        if df:
            # math.log, as the idf of rank(): numpy's may differ in the last bit.
            idf = max(math.log((rows - df + 0.5) / (df + 0.5)), 1e-6)
            scores += np.where(tf > 0, idf * tf * (k1 + 1) / (tf + norms), 0.0)
    order: list[int] = np.argsort(-scores, kind="stable")[:keep].tolist()
    return order


def rank(
    text: str,
    documents: Sequence[str],
    *,
    scope_rows: int,
    tokenize: Tokenize,
    ranking: Ranking = DEFAULT_RANKING,
    matched: Matched | None = None,
) -> list[float]:
    """A relevance score (higher is better) for each of ``documents`` against ``text``.

    ``documents`` are the candidate rows of the FTS5 match, ``scope_rows`` how many rows
    the search covers (one conversation, one agent): idf is taken over that scope, not over
    the whole table. Scores are bm25 with :class:`Ranking`'s parameters, after one round of
    pseudo-relevance feedback. ``matched``, when given, is the documents'
    :func:`tokenize_matches` for :func:`query_tokens` (they are not tokenized again).

    Each term's score is one numpy pass over the documents: the query's from the counts
    of ``matched``, the feedback's from one C-level pass of a dict over the documents'
    tokens, so no Python object is made per document. Each document's score adds its
    terms in the query's order, then the feedback's: documents whose scores are equal in
    exact arithmetic are equal to the last bit, and keep their order.
    """
    import numpy as np

    query = query_tokens(text, tokenize)
    if not query or not documents:
        return [0.0] * len(documents)
    if matched is None:
        matched = tokenize_matches(documents, query, tokenize)
    n = len(documents)
    rows = max(scope_rows, n)
    k1, b = ranking.k1, ranking.b
    lengths = matched.lengths
    norms = k1 * (1 - b + b * lengths / max(int(lengths.sum()) / n, 1.0))

    def idf(df: int) -> float:
        return float(max(math.log((rows - df + 0.5) / (df + 0.5)), 1e-6) ** ranking.idf_power)

    def add(scores: NDArray[np.float64], counts: NDArray[np.float64], weight: float) -> None:
        for tf in counts:
            df = int(np.count_nonzero(tf))
            if df:
                factor = weight * idf(df) * (k1 + 1)
                scores += np.where(tf > 0, factor * tf / (tf + norms), 0.0)

    scores = np.zeros(n, dtype=np.float64)
    add(scores, matched.counts, 1.0)
    if ranking.feedback_rows <= 0 or ranking.feedback_weight <= 0 or ranking.feedback_terms <= 0:
        return scores.tolist()
    best = np.argsort(-scores, kind="stable")[: ranking.feedback_rows].tolist()
    common = set(tokenize(" ".join(sorted(STOPWORDS))))
    found = [Counter(tokens) for tokens in matched.tokens(best)]
    # Each word of the best rows that may be fed back, with its count in every document.
    words = {term: None for seen in found for term in seen if term not in common}
    for term in query:
        words.pop(term, None)
    counts = _counts(matched, list(words))
    frequency = dict(zip(words, map(int, np.count_nonzero(counts, axis=1)), strict=True))
    feedback: dict[str, float] = {}
    for seen in found:
        for term, tf in seen.items():
            if term in words:
                feedback[term] = feedback.get(term, 0.0) + tf * idf(frequency[term])
    chosen = sorted(feedback, key=lambda term: -feedback[term])[: ranking.feedback_terms]
    column = {term: k for k, term in enumerate(words)}
    add(scores, counts[[column[term] for term in chosen]], ranking.feedback_weight)
    return scores.tolist()


def _counts(matched: Matched, words: Sequence[str]) -> NDArray[np.float64]:
    """How often each of ``words`` (tokens) occurs in each document of ``matched``
    (``[k, i]``: word ``k``, document ``i``)."""
    import numpy as np

    n = len(matched)
    code = {word: k for k, word in enumerate(words)}
    codes = np.fromiter(map(code.get, matched.flat, repeat(-1)), np.int64, len(matched.flat))
    at = np.flatnonzero(codes >= 0)
    # Each found token's document: the last that starts at or before it.
    row = np.searchsorted(matched.starts, at, side="right") - 1
    found = np.bincount(codes[at] * n + row, minlength=len(words) * n)
    counts: NDArray[np.float64] = found.reshape(len(words), n).astype(np.float64)
    return counts
