"""The values each ``config.toml`` key accepts: one :class:`Rule` per kind of value.

:mod:`fermix.config` declares every key with one of these; a rule says its values to people
(``kind``, in every error), checks them (``accepts``) and converts them (``convert``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard


@dataclass(frozen=True)
class Rule:
    """The values a key accepts: ``kind`` says it to people, ``accepts`` enforces it."""

    kind: str
    accepts: Callable[[Any], bool]
    convert: Callable[[Any], object] = lambda value: value
    echo: bool = True  # False where a mistaken value could be a secret


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    # int64 is TOML's range; a bigger int would overflow float()
    return (is_int(value) and abs(value) < 2**63) or (
        isinstance(value, float) and math.isfinite(value)
    )


def is_text(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EFFORTS = ("minimal", "low", "medium", "high")

BOOL = Rule("true or false", lambda v: isinstance(v, bool))
COUNT = Rule("an integer >= 1", lambda v: is_int(v) and v >= 1)
MILLISECONDS = Rule("an integer >= 0", lambda v: is_int(v) and v >= 0)
HOURS = Rule("a number >= 0", lambda v: is_number(v) and v >= 0, float)
SECONDS = Rule("a number > 0", lambda v: is_number(v) and v > 0, float)
INTERVAL = Rule("a number >= 0 (0: off)", lambda v: is_number(v) and v >= 0, float)
WORKERS = Rule("an integer from 1 to 64", lambda v: is_int(v) and 1 <= v <= 64)
FRACTION = Rule("a number in (0, 1]", lambda v: is_number(v) and 0 < v <= 1, float)
EFFORT = Rule(f"one of {', '.join(_EFFORTS)}", lambda v: v in _EFFORTS)
TEXT = Rule("a non-empty string", is_text)
_SHA256 = re.compile(r"[0-9a-f]{64}")
SHA256 = Rule(
    "64 lowercase hex digits: the SHA-256 of a secret, never the secret",
    lambda v: isinstance(v, str) and _SHA256.fullmatch(v) is not None,
    echo=False,
)
URL = Rule(
    "an http:// or https:// URL",
    lambda v: isinstance(v, str) and re.fullmatch(r"https?://[^\s]+", v) is not None,
)
TEXTS = Rule(
    "a list of non-empty strings",
    lambda v: isinstance(v, list | tuple) and all(is_text(item) for item in v),
    tuple,
)
ENV_VAR = Rule(
    "the NAME of an environment variable, never the key itself",
    lambda v: isinstance(v, str) and _ENV_NAME.fullmatch(v) is not None,
    echo=False,
)
HISTORY = Rule(
    'an integer >= 1 or "infinity"',
    lambda v: v == "infinity" or (is_int(v) and v >= 1),
    lambda v: None if v == "infinity" else v,
)


PORT = Rule(
    "an integer from 0 to 65535 (0: any free port)", lambda v: is_int(v) and 0 <= v <= 65535
)
BYTES = Rule("an integer from 1024 to 1073741824", lambda v: is_int(v) and 1024 <= v <= 2**30)


DAYS = Rule(
    "an integer from 0 to 36500 (0: keep everything)", lambda v: is_int(v) and 0 <= v <= 36500
)
KEEP = Rule("an integer >= 0 (0: keep every one)", lambda v: is_int(v) and v >= 0)
BATCH = Rule("an integer from 1 to 1024", lambda v: is_int(v) and 1 <= v <= 1024)


STORAGE_URL_ENV = "FERMIX_STORAGE_URL"
"""Overrides ``[fermix_core.storage] url``: the place for a URL holding a password (B1)."""
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
PASSWORD_IN_URL = re.compile(r"://[^/?#]*:[^/?#]*@|[?&]password=", re.IGNORECASE)


def is_storage_url(value: object) -> bool:
    if value == "":
        return True  # as unset: memory.db in the home
    return (
        is_text(value)
        and value.startswith(POSTGRES_SCHEMES)
        and PASSWORD_IN_URL.search(value) is None
    )


STORAGE_URL = Rule(
    f'"" (memory.db) or a postgresql:// URL without a password (that: {STORAGE_URL_ENV})',
    is_storage_url,
    lambda v: v or None,
    echo=False,
)
