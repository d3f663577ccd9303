"""Embeddings through one edge (Q1): an offline default and any litellm embedding model.

An :class:`Embedder` turns texts into unit vectors. Two exist:

- :class:`WordLlamaEmbedder`, the default (``[fermix_core.embedding] model = "wordllama"``):
  the 256-dimension static token table of ``wordllama`` (16 MB, inside its wheel: no key,
  no download, loaded once per process in about 0.1 s; LoCoMo's 2,760 chat turns take
  0.25 s of one CPU in a new process, 0.075 s once their words were seen: a word's tokens
  are looked up, :func:`_piece_ids`). A text's vector is the sum of its tokens' vectors,
  each weighted by its rarity in the scope the text belongs to, ``a / (a + p(t))`` with
  ``p(t)`` the token's share of all the scope's tokens (:class:`TokenCounts`), then
  L2-normalised. Plain mean pooling is dominated by names and common words and made fused
  recall worse on LoCoMo; the weighting is what makes it useful (bench/recall.py). The
  table and the tokenizer are read from the wheel's files (:func:`_wordllama`), without
  importing the ``wordllama`` package, which configures the host's logging on import.
- :class:`LiteLLMEmbedder`: any embedding model litellm reaches (OpenAI, Ollama, an
  OpenAI-compatible server), through ``litellm.embedding``, imported only when it is used.
  Its texts need no token counts.

Vectors are stored as int8 (:func:`to_int8`): a 256-dimension vector is 256 bytes.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
from numpy.typing import NDArray

from fermix.errors import ConfigError, FermixError

WORDLLAMA = "wordllama"
"""The configured name of the offline default."""
SIF_A = 1e-3
"""``a`` of the rarity weight ``a / (a + p(t))`` (measured on LoCoMo's tuning conversations)."""
MAX_TEXT_CHARS = 8_000
"""The start of a text that is embedded; the rest is left out."""

Vectors = NDArray[np.float32]


class EmbeddingError(FermixError):
    """An embedding model could not be loaded or called."""


@dataclass
class TokenCounts:
    """How often each token occurs in one scope's texts (its rows so far), and in all."""

    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0

    def add(self, ids: Sequence[int]) -> None:
        """Count the tokens of one more text."""
        for token in ids:
            self.counts[token] = self.counts.get(token, 0) + 1
        self.total += len(ids)

    def weights(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        """Each token's rarity weight ``a / (a + p(t))``; a token never seen weighs 1."""
        seen = np.fromiter((self.counts.get(int(i), 0) for i in ids), np.float32, len(ids))
        return (SIF_A / (SIF_A + seen / max(self.total, 1))).astype(np.float32)

    def grown(
        self, ids: NDArray[np.int64], lengths: NDArray[np.int64], parts: Sequence[int]
    ) -> NDArray[np.float32]:
        """The weights of the tokens ``ids`` of texts of ``lengths`` tokens, each text in
        its part of ``parts`` (in order), counted with the tokens of the texts of its own
        part and the parts before it: the weights :meth:`weights` gives after :meth:`add`
        of each part's texts in turn, in a few array operations for the whole batch."""
        _, part = np.unique(np.asarray(parts, np.int64), return_inverse=True)
        n_parts = int(part.max()) + 1
        token_part = np.repeat(part, lengths)
        distinct, where = np.unique(ids, return_inverse=True)
        found = map(self.counts.get, distinct.tolist(), itertools.repeat(0))
        before = np.fromiter(found, np.int64, len(distinct))
        added = np.bincount(token_part * len(distinct) + where, minlength=n_parts * len(distinct))
        seen = (before + np.cumsum(added.reshape(n_parts, len(distinct)), axis=0))[
            token_part, where
        ].astype(np.float32)
        totals = self.total + np.cumsum(np.bincount(part, weights=lengths, minlength=n_parts))
        # float32 as weights() divides (its Python int total becomes float32): same bits
        share = seen / np.maximum(totals, 1).astype(np.float32)[token_part]
        return (SIF_A / (SIF_A + share)).astype(np.float32)


class Embedder(Protocol):
    """What fermix needs of an embedding model."""

    @property
    def name(self) -> str:
        """The model as recorded beside the vectors; vectors of another name are not used."""
        ...

    @property
    def counts_tokens(self) -> bool:
        """Whether the vectors are weighted by per-scope token counts (:meth:`tokens`)."""
        ...

    def dimension(self) -> int:
        """The length of a vector (may load the model or make one call)."""
        ...

    def tokens(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, as the counts count them (empty lists if not counted)."""
        ...

    def embed(
        self,
        texts: Sequence[str],
        *,
        tokens: Sequence[Sequence[int]] | None = None,
        counts: TokenCounts | None = None,
        parts: Sequence[int] | None = None,
    ) -> Vectors:
        """Unit vectors of ``texts``, one row each (a text without tokens: zeros).

        With ``parts`` (each text's part, in order), the texts' own tokens count too, as
        they come: a text is pooled with ``counts`` and the tokens of every text of its
        part and the parts before it (what the counts would be had each part been stored
        before the next was embedded). ``counts`` is not changed."""
        ...


def to_int8(vectors: Vectors) -> NDArray[np.int8]:
    """Unit vectors as int8, each component times 127."""
    return np.clip(np.round(vectors * 127), -127, 127).astype(np.int8)


def to_blob(vector: NDArray[np.int8]) -> bytes:
    """One int8 vector as stored in SQLite."""
    return vector.astype(np.int8).tobytes()


def from_blobs(blobs: Sequence[bytes | None], dim: int) -> tuple[Vectors, NDArray[np.bool_]]:
    """Stored int8 vectors as float rows (zeros where a row has none or one of another
    length), and which rows had one.

    The vectors are joined and read by one :func:`numpy.frombuffer`, not one call per row: a
    search reads thousands of them, and when each has its vector (the usual case) they are
    measured and joined by C-level calls, with no Python frame a row."""
    n = len(blobs)
    if None in blobs:
        present = np.fromiter((b is not None and len(b) == dim for b in blobs), bool, n)
    else:
        present = np.fromiter(map(len, cast("Sequence[bytes]", blobs)), np.int64, n) == dim
    if present.all():
        joined = b"".join(cast("Sequence[bytes]", blobs))
        out = np.frombuffer(joined, dtype=np.int8).reshape(n, dim).astype(np.float32)
    else:
        out = np.zeros((n, dim), dtype=np.float32)
        if dim and present.any():
            joined = b"".join(cast("Iterable[bytes]", itertools.compress(blobs, present)))
            out[present] = np.frombuffer(joined, dtype=np.int8).reshape(-1, dim)
    out /= 127.0
    return out, present


WORDLLAMA_WEIGHTS = "weights/l2_supercat_256.safetensors"
WORDLLAMA_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
"""The files of the default model inside the ``wordllama`` package folder."""

_LOAD_LOCK = threading.Lock()
_TABLE: Vectors | None = None
_TOKENIZER: Any = None

METASPACE = "\u2581"
"""SentencePiece's space, ``▁``: what wordllama's normalizer turns each space into."""
_PIECE = re.compile(f"{METASPACE}+[^{METASPACE}]*|[^{METASPACE}]+")
"""The pieces of a normalized text that no token spans: a run of spaces and the word after it."""
_SPECIALS: tuple[str, ...] | None = None
"""The added tokens' texts (``<s>``...) when texts are tokenized piece by piece, None when
they are not (a text containing one is tokenized whole: ``encode`` matches them first)."""
PIECE_CACHE = 1 << 16
"""How many distinct pieces keep their token ids (some 150 bytes each)."""


def _after_fork() -> None:
    # A lock a thread of the parent held while it forked would stay held in the child; the
    # loaded table and tokenizer are plain data and stay (a preloading host loads once).
    global _LOAD_LOCK
    _LOAD_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _wordllama() -> tuple[Vectors, Any]:
    """wordllama's token table (float32) and its tokenizer without padding, loaded once per
    process from the files of its wheel.

    The ``wordllama`` package itself is never imported: its ``__init__`` calls
    ``logging.basicConfig(level=logging.INFO)``, which would give the host's root logger a
    stderr handler and the INFO level (litellm then prints every call's INFO line to
    stdout, breaking a host that speaks on stdout). ``find_spec`` locates the package
    folder without running it."""
    global _TABLE, _TOKENIZER, _SPECIALS
    with _LOAD_LOCK:
        if _TABLE is None:
            try:
                spec = importlib.util.find_spec(WORDLLAMA)
                if spec is None or not spec.submodule_search_locations:
                    raise ImportError("the wordllama package is not installed")
                here = Path(next(iter(spec.submodule_search_locations)))
                from safetensors.numpy import load_file
                from tokenizers import Tokenizer

                tensors = load_file(str(here / WORDLLAMA_WEIGHTS))
                table = np.ascontiguousarray(tensors["embedding.weight"], dtype=np.float32)
                tokenizer = Tokenizer.from_file(str(here / WORDLLAMA_TOKENIZER))
            except (ImportError, OSError, ValueError, RuntimeError, KeyError) as exc:
                raise EmbeddingError(f"the offline embedding model did not load: {exc}") from exc
            tokenizer.no_padding()
            tokenizer.no_truncation()
            _TABLE, _TOKENIZER = table, tokenizer
            _piece_ids.cache_clear()
            _SPECIALS = _piecewise_specials(tokenizer)
        return _TABLE, _TOKENIZER


def _piecewise_specials(tokenizer: Any) -> tuple[str, ...] | None:
    """The added tokens' texts when ``tokenizer`` gives the same ids piece by piece
    (:data:`_PIECE`) as for a whole text, else None.

    wordllama's tokenizer (Llama 2's) has no pre-tokenizer: its normalizer prepends ``▁``
    and turns each space into one, and its BPE model then merges over the whole text, one
    call of about 35 µs for a chat turn. BPE never merges across a boundary that no token of
    its vocabulary spans, and none of this one's has a ``▁`` after another character: so
    each piece's ids are the same alone, and a piece (a word and the spaces before it)
    recurs across texts, where its ids are looked up (:func:`_piece_ids`). Checked here
    rather than assumed, so that another tokenizer file is tokenized whole."""
    spec = json.loads(tokenizer.to_str())
    normalizer = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": METASPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": METASPACE},
        ],
    }
    model = spec.get("model") or {}
    if (
        spec.get("normalizer") != normalizer
        or spec.get("pre_tokenizer") is not None
        or model.get("type") != "BPE"
        or any(model.get(k) for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"))
    ):
        return None
    spanning = re.compile(f"[^{METASPACE}]{METASPACE}")
    if any(spanning.search(token) for token in tokenizer.get_vocab()):
        return None
    added = tokenizer.get_added_tokens_decoder().values()
    if any(t.normalized for t in added):  # matched in the normalized text: not by `in`
        return None
    return tuple(t.content for t in added)


@functools.lru_cache(maxsize=PIECE_CACHE)
def _piece_ids(piece: str) -> tuple[int, ...]:
    """The token ids of one normalized piece, by the BPE model alone."""
    return tuple(token.id for token in _wordllama()[1].model.tokenize(piece))


class WordLlamaEmbedder:
    """The offline default: wordllama's token vectors, pooled by rarity in the scope."""

    name = "wordllama/l2_supercat_256/sif"
    counts_tokens = True

    def dimension(self) -> int:
        return int(_wordllama()[0].shape[1])

    def tokens(self, texts: Sequence[str]) -> list[list[int]]:
        tokenizer = _wordllama()[1]
        specials = _SPECIALS
        out: list[list[int]] = []
        for text in texts:
            text = text[:MAX_TEXT_CHARS]
            if specials is None or any(s in text for s in specials):
                # One text at a time: encode_batch's thread pool is not safe across a fork.
                out.append(list(tokenizer.encode(text, add_special_tokens=False).ids))
                continue
            pieces = _PIECE.findall(METASPACE + text.replace(" ", METASPACE)) if text else ()
            out.append(list(itertools.chain.from_iterable(map(_piece_ids, pieces))))
        return out

    def embed(
        self,
        texts: Sequence[str],
        *,
        tokens: Sequence[Sequence[int]] | None = None,
        counts: TokenCounts | None = None,
        parts: Sequence[int] | None = None,
    ) -> Vectors:
        table = _wordllama()[0]
        ids = self.tokens(texts) if tokens is None else tokens
        out = np.zeros((len(ids), table.shape[1]), dtype=np.float32)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        if not len(ids) or lengths.sum() == 0:
            return out
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
        counts = counts or TokenCounts()
        weights = counts.weights(flat) if parts is None else counts.grown(flat, lengths, parts)
        out[lengths > 0] = _pool(table, flat, lengths[lengths > 0], weights)
        return _unit(out)


class LiteLLMEmbedder:
    """Any litellm embedding model (``openai/text-embedding-3-small``, ``ollama/...``)."""

    counts_tokens = False

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.model = model
        self.api_base = api_base
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self._environ = environ
        self._dim: int | None = None

    @property
    def name(self) -> str:
        return f"litellm/{self.model}"

    def dimension(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension"]).shape[1])
        return self._dim

    def tokens(self, texts: Sequence[str]) -> list[list[int]]:
        return [[] for _ in texts]

    def embed(
        self,
        texts: Sequence[str],
        *,
        tokens: Sequence[Sequence[int]] | None = None,
        counts: TokenCounts | None = None,
        parts: Sequence[int] | None = None,
    ) -> Vectors:
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        import litellm

        kwargs: dict[str, Any] = {"timeout": self.timeout_s}
        if self.api_base is not None:
            kwargs["api_base"] = self.api_base
        if self.api_key_env is not None:
            key = self._environ.get(self.api_key_env)
            if not key:
                raise EmbeddingError(f"the variable {self.api_key_env} holds no API key")
            kwargs["api_key"] = key
        inputs = [text[:MAX_TEXT_CHARS] or " " for text in texts]
        try:
            response = litellm.embedding(model=self.model, input=inputs, **kwargs)
        except Exception as exc:  # any provider's error is an EmbeddingError
            raise EmbeddingError(f"{self.model}: {type(exc).__name__}: {exc}") from exc
        data = sorted(response.data, key=lambda item: _field(item, "index"))
        out = np.asarray([_field(item, "embedding") for item in data], dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(texts):
            raise EmbeddingError(f"{self.model} returned {out.shape} for {len(texts)} texts")
        self._dim = int(out.shape[1])
        return _unit(out)


def _pool(
    table: Vectors, flat: NDArray[np.int64], lengths: NDArray[np.int64], weights: Vectors
) -> Vectors:
    """Each text's weighted sum of its token vectors (texts of ``lengths`` > 0 tokens, their
    tokens one after another in ``flat``), added in the text's token order.

    One ``np.add.reduce`` down each text's rows: ``np.add.reduceat`` over all the rows of
    a batch took three times as long (LoCoMo's 2,760 turns, gathered, weighed and summed:
    68 ms of CPU against 23), and sums in an order of its own, not the text's."""
    weighted = table[flat]
    weighted *= weights[:, None]  # in place: a batch's gathered rows are megabytes
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return np.stack(
        [np.add.reduce(weighted[s:e], axis=0) for s, e in zip(starts, ends, strict=True)]
    )


def _unit(vectors: Vectors) -> Vectors:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: Vectors = (vectors / np.maximum(norms, 1e-9)).astype(np.float32)
    return unit


def _field(item: Any, name: str) -> Any:
    return item[name] if isinstance(item, Mapping) else getattr(item, name)


def from_config(
    model: str, *, api_base: str | None = None, api_key_env: str | None = None
) -> Embedder:
    """The embedder ``[fermix_core.embedding]`` names."""
    if not model.strip():
        raise ConfigError("fermix_core.embedding.model must name a model")
    if model == WORDLLAMA:
        return WordLlamaEmbedder()
    return LiteLLMEmbedder(model, api_base=api_base, api_key_env=api_key_env)
