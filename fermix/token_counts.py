"""Token counts with tiktoken that never touch the network (C4, E3, K1).

tiktoken downloads an encoding on first use unless its cache directory already holds it.
litellm's wheel ships ``cl100k_base`` and ``o200k_base`` in its ``tokenizers`` folder, named
as tiktoken names its cache files (the sha1 of the download URL): see
:data:`LITELLM_TOKENIZER_DIRS`. When neither ``TIKTOKEN_CACHE_DIR`` nor ``DATA_GYM_CACHE_DIR``
is set, the first count points ``TIKTOKEN_CACHE_DIR`` at that folder, found without importing
litellm (which takes seconds). That layout is litellm's, not a promise: pyproject.toml caps
litellm, and tests/core/test_token_counts.py checks the installed one still has it.

An encoding is loaded only when its cache file is present and intact (tiktoken would
otherwise fetch it, or delete a damaged copy and fetch it). When it is not, counts fall back
to an estimate of one token per :data:`FALLBACK_BYTES_PER_TOKEN` UTF-8 bytes, rounded up,
and a WARNING is logged once for that encoding. Encodings load once per process, under a lock.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import tempfile
import threading
from pathlib import Path

import tiktoken

from fermix.errors import InvalidInputError

CL100K = "cl100k_base"
O200K = "o200k_base"
FALLBACK_BYTES_PER_TOKEN = 4
"""Bytes per token of the fallback estimate (English text averages about four)."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens added per chat message for its role and framing (OpenAI's chat format uses 3-4)."""

# Where tiktoken fetches each encoding, and the sha256 it expects of the file
# (tiktoken_ext/openai_public.py); the cache file is named by the URL's sha1.
_SOURCES = {
    CL100K: (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    O200K: (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}
LITELLM_TOKENIZER_DIRS = (
    Path("litellm_core_utils", "tokenizers"),  # current releases (1.110 checked)
    Path("llms", "tokenizers"),  # older releases (1.53 checked)
)
"""Where litellm's wheel keeps the tiktoken files, relative to the package, newest first."""
_O200K_MODELS = re.compile(r"(?:gpt-4o|gpt-4\.1|gpt-5|chatgpt-4o|o1|o3|o4)(?:[-.:@_].*)?")

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_encodings: dict[str, tiktoken.Encoding | None] = {}


def encoding_name_for(model: str | None) -> str:
    """Return the tiktoken encoding used to count tokens for ``model``.

    A provider prefix is ignored (``openai/gpt-4o`` counts as ``gpt-4o``). The gpt-4o,
    gpt-4.1, gpt-5, chatgpt-4o and o1/o3/o4 families use ``o200k_base``; every other model,
    and None, uses ``cl100k_base``. For models outside OpenAI's (llama, claude, mistral,
    gemini, ...) that is an approximation: their own tokenizers differ by a few percent.
    """
    if not model:
        return CL100K
    name = model.strip().lower().rsplit("/", 1)[-1].removeprefix("ft:")
    return O200K if _O200K_MODELS.fullmatch(name) else CL100K


def count_tokens(text: str, model: str | None = None) -> int:
    """Count the tokens of ``text`` for ``model``; special-token text counts as plain text."""
    encoding = _encoding(encoding_name_for(model))
    if encoding is None:
        return _estimate(text)
    return len(encoding.encode(text, disallowed_special=()))


def truncate_to_tokens(text: str, max_tokens: int, model: str | None = None) -> str:
    """Return the longest start of ``text`` that counts at most ``max_tokens`` for ``model``."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidInputError(f"max_tokens must be an integer >= 0, not {max_tokens!r}")
    encoding = _encoding(encoding_name_for(model))
    if encoding is None:
        data = text.encode("utf-8", "replace")
        if len(data) <= max_tokens * FALLBACK_BYTES_PER_TOKEN:
            return text
        return data[: max_tokens * FALLBACK_BYTES_PER_TOKEN].decode("utf-8", "ignore")
    tokens = encoding.encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text
    # A cut can fall inside a character, and re-encoding a cut text can merge differently,
    # so shorten until the result itself fits.
    for keep in range(max_tokens, 0, -1):
        head = encoding.decode_bytes(tokens[:keep]).decode("utf-8", "ignore")
        if len(encoding.encode(head, disallowed_special=())) <= max_tokens:
            return head
    return ""


def uses_tiktoken(model: str | None = None) -> bool:
    """Tell whether counts for ``model`` come from tiktoken (False: the byte estimate)."""
    return _encoding(encoding_name_for(model)) is not None


def _estimate(text: str) -> int:
    return -(-len(text.encode("utf-8", "replace")) // FALLBACK_BYTES_PER_TOKEN)


def _encoding(name: str) -> tiktoken.Encoding | None:
    try:
        return _encodings[name]
    except KeyError:
        pass
    with _lock:
        if name not in _encodings:
            _encodings[name] = _load(name)
        return _encodings[name]


def _load(name: str) -> tiktoken.Encoding | None:
    _point_cache_at_litellm()
    problem = _cache_problem(name)
    if problem is None:
        try:
            return tiktoken.get_encoding(name)
        except (OSError, ValueError) as exc:
            problem = f"tiktoken could not load it ({exc})"
    _log.warning(
        "tiktoken encoding %s is not available offline: %s; token counts for it are "
        "estimated as one token per %d UTF-8 bytes",
        name,
        problem,
        FALLBACK_BYTES_PER_TOKEN,
    )
    return None


def _point_cache_at_litellm() -> None:
    """Set TIKTOKEN_CACHE_DIR to litellm's bundled tokenizers unless a cache dir is chosen."""
    if "TIKTOKEN_CACHE_DIR" in os.environ or "DATA_GYM_CACHE_DIR" in os.environ:
        return
    folder = litellm_tokenizer_dir()
    if folder is not None:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)


def litellm_tokenizer_dir() -> Path | None:
    """The installed litellm's tokenizers folder, found without importing litellm; else None."""
    # find_spec on a top-level name locates the package without importing it.
    spec = importlib.util.find_spec("litellm")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for relative in LITELLM_TOKENIZER_DIRS:
            folder = Path(location) / relative
            if folder.is_dir():
                return folder
    return None


def _cache_dir() -> str:
    """The cache directory tiktoken will read (tiktoken/load.py), "" when caching is off."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return os.environ[variable]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _cache_problem(name: str) -> str | None:
    """Say why loading ``name`` could reach the network, or None when it cannot."""
    if name not in _SOURCES:
        return "fermix knows no offline source for it"
    url, sha256 = _SOURCES[name]
    cache_dir = _cache_dir()
    if not cache_dir:
        return "the tiktoken cache is disabled (TIKTOKEN_CACHE_DIR is empty)"
    path = Path(cache_dir) / hashlib.sha1(url.encode()).hexdigest()
    try:
        data = path.read_bytes()
    except OSError:
        return f"{path} is missing or unreadable"
    if hashlib.sha256(data).hexdigest() != sha256:
        return f"{path} does not match its expected sha256"
    return None
