"""Typed errors a host or operator can act on (H3).

Every error fermix raises on purpose derives from :class:`FermixError`, so a host can catch
one base class; the subclasses say what went wrong and what to do about it.
"""

from __future__ import annotations


class FermixError(Exception):
    """Base class of every error fermix raises on purpose."""


class InvalidInputError(FermixError, ValueError):
    """An argument was refused before anything was changed."""


class UnsafePathSegmentError(InvalidInputError):
    """An identifier (such as an agent id) cannot be used as one path segment."""


class ConfigError(FermixError):
    """config.toml is unreadable, has an unknown key, or a value of the wrong type."""


class StorageError(FermixError):
    """The database could not be opened, read or written."""


class SchemaTooNewError(StorageError):
    """The database was written by a newer fermix; it was left untouched."""


class WriteFailedError(StorageError):
    """A write was not committed after its retries; nothing of it was kept."""


class NotFoundError(FermixError, LookupError):
    """The row, resource or revision asked for does not exist."""


class AccessDeniedError(FermixError):
    """The caller's trust or scope does not allow this operation."""


class ActorUnavailableError(FermixError):
    """An actor stopped or could not be (re)started to serve the request."""


class SupervisorEscalationError(FermixError):
    """A supervisor exceeded its restart intensity and gave up."""


class ModelError(FermixError):
    """Every model on the route failed, or none is configured."""


class ReviewOutputError(FermixError):
    """The reviewer's model output was malformed and was rejected whole."""


class ServiceError(FermixError):
    """The background service could not be started, stopped or reached."""


class ConflictError(FermixError):
    """A request contradicts what is stored: a client key reused for a different message."""
