"""Actors that report how they ended to the supervisor that started them (A6).

pykka has no links or monitors, so an actor tells its supervisor itself. How pykka 4.5 ends
an actor (read from ``pykka/_actor.py``), and what a :class:`SupervisedActor` reports:

- a normal stop (``ActorRef.stop()``, ``Actor.stop()``): ``_stop()`` calls ``on_stop()``
  and not ``on_failure()``. Reported as a normal exit.
- an exception in a ``tell``-ed message: ``_handle_failure()`` logs it and stops the actor,
  then ``on_failure()`` runs; ``on_stop()`` does not. Reported as abnormal, with it.
- an exception in ``on_start()``: ``_handle_failure()`` stops the actor before it handles a
  message; neither ``on_failure()`` nor ``on_stop()`` runs. Reported as abnormal.
- an exception in ``on_stop()`` or ``on_failure()``: ``_handle_failure()``. Reported as
  abnormal, with the first exception of the actor's life.
- an exception in an ``ask``-ed message is set on the asker's future and the actor runs on:
  a failing ask is the caller's error, not a crash, and no supervisor hears of it.
- a ``BaseException`` (``SystemExit``) in a message: pykka calls ``_stop()``, so
  ``on_stop()``, then stops every actor. Reported as a normal exit.
- a ``BaseException`` in ``on_start()``: pykka lets it escape ``_actor_loop()`` before its
  teardown; the mixin stops the actor through ``_handle_failure()`` and lets it end the
  thread. Reported as abnormal, with it; asks already queued are never answered.

Every failure passes through ``_handle_failure()`` and every life ends when the thread's
``_actor_loop()`` returns or raises, so the mixin hooks those two pykka internals instead of
asking each subclass to call ``super()`` from its ``on_start``, ``on_stop`` and
``on_failure``: subclasses override those hooks freely, and the exit is reported exactly
once, after the actor's own cleanup has run and (but for the last path) pykka has answered
its pending asks with ``ActorDeadError``. tests/runtime/test_supervisor.py pins each path above
against the installed pykka.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import pykka

from fermix.errors import ActorUnavailableError

__all__ = ["ExitCallback", "ExitLink", "SupervisedActor", "claim_link", "offering"]

ExitCallback = Callable[["ExitLink", BaseException | None], None]
"""Called once when a linked child ends: the link, and None or the exception that ended it."""


class ExitLink:
    """A one-shot line from one start of a child to its supervisor.

    The supervisor makes a new link for every start; the child claims it while it is being
    constructed and reports its exit through it once.
    """

    def __init__(self, on_exit: ExitCallback) -> None:
        self.owner: str | None = None
        """The URN of the child that claimed the link, once claimed."""
        self._on_exit = on_exit

    def report(self, reason: BaseException | None) -> None:
        """Tell the supervisor the child ended: normally (None) or with `reason`."""
        self._on_exit(self, reason)


_offered: ContextVar[ExitLink | None] = ContextVar("fermix_offered_link", default=None)


@contextmanager
def offering(link: ExitLink) -> Iterator[None]:
    """Offer `link` to the first child constructed in this thread inside the block."""
    token = _offered.set(link)
    try:
        yield
    finally:
        _offered.reset(token)


def claim_link(owner: str) -> ExitLink | None:
    """Take the link on offer for the child with URN `owner`; None if none is on offer."""
    link = _offered.get()
    if link is None or link.owner is not None:
        return None
    link.owner = owner
    return link


class SupervisedActor(pykka.ThreadingActor):
    """A pykka ThreadingActor that reports its exit to the supervisor that started it.

    Started outside a supervisor it is a plain ThreadingActor. Subclasses that define
    ``__init__`` must call ``super().__init__()`` (pykka requires it too).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exit_link = claim_link(self.actor_urn)
        self._exit_reason: BaseException | None = None

    def _handle_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._exit_reason is None:
            self._exit_reason = exception_value
        super()._handle_failure(exception_type, exception_value, traceback)

    def _actor_loop(self) -> None:
        try:
            super()._actor_loop()
        except BaseException as exc:
            # pykka lets a BaseException from on_start() escape the thread: stop the actor
            # and record it, as it does for an Exception, then let it end the thread.
            self._handle_failure(type(exc), exc, exc.__traceback__)
            raise
        finally:
            if self._exit_link is not None:
                self._exit_link.report(self._exit_reason)


ASK_ATTEMPTS = 3
"""Lookups of an actor an ask makes before it gives up: each one waits while a crash is
being handled, so a death between lookup and ask costs one more lookup, not an error."""


def ask_found(
    find: Callable[[], pykka.ActorRef[Any]],
    message: Any,
    *,
    timeout: float | None,
    what: str,
) -> Any:
    """Ask the actor ``find`` returns, finding it again if it died in between.

    ``find`` looks the actor up (it may raise
    :class:`~fermix.errors.ActorUnavailableError` while its supervisor is being replaced);
    an actor that dies after the lookup (a crash, a passivation) is looked up again once its
    supervisor has dealt with the death. After :data:`ASK_ATTEMPTS` lookups the caller gets
    :class:`~fermix.errors.ActorUnavailableError` naming ``what``.
    """
    for _ in range(ASK_ATTEMPTS):
        try:
            ref = find()
        except ActorUnavailableError:
            continue  # the next lookup waits for the replacement, or fails at once
        try:
            return ref.ask(message, timeout=timeout)
        except pykka.ActorDeadError:
            continue
    raise ActorUnavailableError(f"{what} is unavailable")
