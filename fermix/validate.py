"""Checks on values that cross the library's boundary: text, identifiers, numbers.

Each check returns the value it accepted or raises :class:`InvalidInputError` naming the
argument, before anything has been written.
"""

from __future__ import annotations

import re

from fermix.errors import InvalidInputError, UnsafePathSegmentError

MAX_IDENTIFIER_CHARS = 200
MAX_SEGMENT_CHARS = 100
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


_ACCEPTED_IDS = 4096
_accepted_ids: set[str] = set()
"""Non-empty identifiers accepted already (a plain ``str`` accepted once is accepted again):
an append checks its owner, sender and kind, mostly the same few values every time."""


def text(name: str, value: object, *, max_chars: int, allow_empty: bool = True) -> str:
    """Accept ``value`` as storable text: a str, valid UTF-8, at most ``max_chars`` long."""
    if type(value) is str and allow_empty and len(value) <= max_chars and value.isascii():
        return value  # the common case: ASCII is valid UTF-8
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string, not {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise InvalidInputError(f"{name} must not be empty")
    if len(value) > max_chars:
        raise InvalidInputError(f"{name} is {len(value)} characters; the limit is {max_chars}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"{name} is not valid Unicode text ({exc.reason})") from None
    return value


def identifier(name: str, value: object, *, allow_empty: bool = False) -> str:
    """Accept an id (agent, owner, channel, chat): short text without NUL or control chars."""
    if type(value) is str and value in _accepted_ids:
        return value
    value = text(name, value, max_chars=MAX_IDENTIFIER_CHARS, allow_empty=allow_empty)
    if not allow_empty and value == "":
        raise InvalidInputError(f"{name} must not be empty")
    if _CONTROL.search(value):
        raise InvalidInputError(f"{name} must not contain control characters")
    if type(value) is str and value:
        if len(_accepted_ids) >= _ACCEPTED_IDS:
            _accepted_ids.clear()
        _accepted_ids.add(value)
    return value


def path_segment(name: str, value: object) -> str:
    """Accept ``value`` only if it is safe as a single directory name (C5)."""
    if not isinstance(value, str):
        raise UnsafePathSegmentError(f"{name} must be a string, not {type(value).__name__}")
    if not value or len(value) > MAX_SEGMENT_CHARS or not _SEGMENT.match(value):
        raise UnsafePathSegmentError(
            f"{name} {value[:40]!r} is not a safe path segment: use 1-{MAX_SEGMENT_CHARS} "
            "letters, digits, '.', '_', '@', '+' or '-', starting with a letter or digit"
        )
    return value


def positive_int(name: str, value: object, *, maximum: int = 2**31 - 1) -> int:
    """Accept a positive integer no larger than ``maximum`` (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, not {type(value).__name__}")
    if not 1 <= value <= maximum:
        raise InvalidInputError(f"{name} must be between 1 and {maximum}, not {value}")
    return value
