"""Erlang/OTP-style supervision of pykka actors (A6).

pykka has no links, monitors or restarts; a stopped actor can only be replaced. A
:class:`Supervisor` starts children from :class:`ChildSpec` factories in order, replaces
those that end as their :class:`~fermix.supervision.restarts.Restart` type and its
:class:`~fermix.supervision.restarts.Strategy` say, stops them in reverse order, and fails
upward past its :class:`~fermix.supervision.restarts.Intensity`. Children can also be
started and terminated at runtime, as with Elixir's ``DynamicSupervisor``.

Its thread, stop and wait, and how it fails upward are
:class:`~fermix.supervision.loop.SupervisorLoop`'s; this module keeps the children. The lock
guards the table of children, so :meth:`Supervisor.child_ref` answers at once from any
thread. Stop a tree by stopping its top supervisor: ``ActorRegistry.stop_all()`` stops
children behind their supervisors' backs, which see normal exits and restart permanent
children.

For each start the supervisor offers a new :class:`~fermix.actors.base.ExitLink` while the
factory runs; the SupervisedActor or nested Supervisor built claims it and reports its exit
through it. A report on a link that is no longer a child's current one comes from an
incarnation already stopped or replaced and changes nothing: that is why a stop,
``terminate_child`` or a sibling's restart never causes a restart.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import pykka

from fermix.actors.base import ExitLink, offering
from fermix.errors import (
    ActorUnavailableError,
    InvalidInputError,
    NotFoundError,
    SupervisorEscalationError,
)
from fermix.supervision.loop import SupervisorLoop
from fermix.supervision.restarts import (
    Intensity,
    Restart,
    Strategy,
    record_restart,
    should_restart,
)

__all__ = ["Child", "ChildCounts", "ChildInfo", "ChildSpec", "Supervisor"]

logger = logging.getLogger(__name__)

Child: TypeAlias = "pykka.ActorRef[Any] | Supervisor"
"""A running child: the ref of a SupervisedActor, or a nested Supervisor."""


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child (``id``, unique in its supervisor) and when to start it again.

    ``start`` starts and returns a SupervisedActor's ref or a started Supervisor; it runs on
    the supervisor's thread, so it must not call that supervisor. ``shutdown_timeout`` is how
    long a stop waits before the child is abandoned (a thread cannot be killed); a nested
    supervisor's must cover its own children's.
    """

    id: str
    start: Callable[[], Child]
    restart: Restart = Restart.PERMANENT
    shutdown_timeout: float = 5.0


class ChildInfo(NamedTuple):
    """A child as which_children() reports it; ``ref`` is None while it is not running."""

    id: str
    ref: Child | None
    restart: Restart


class ChildCounts(NamedTuple):
    """As count_children() reports them: children known, running, and running as
    supervisors or as actors (after OTP)."""

    specs: int
    active: int
    supervisors: int
    workers: int


@dataclass(eq=False)
class _Child:
    spec: ChildSpec
    handle: Child | None = None
    link: ExitLink | None = None


def _temporary(child: _Child) -> bool:
    return child.spec.restart is Restart.TEMPORARY


def _how(reason: BaseException | None) -> str:
    return "normally" if reason is None else f"with {reason!r}"


def _urn(handle: object) -> str | None:
    if isinstance(handle, Supervisor):
        return handle.urn
    return handle.actor_urn if isinstance(handle, pykka.ActorRef) else None


class Supervisor(SupervisorLoop):
    """Starts, watches, restarts and stops children; itself a valid child of a Supervisor.

    ``name`` appears in logs and errors; ``urn`` identifies this instance. ``on_escalate``
    is called with the error when a top-level supervisor gives up (a nested one reports to
    its parent instead); ``monotonic`` is the clock restart intensity is counted on.
    ``start``, ``stop``, ``wait``, ``is_alive`` and ``failure`` come from SupervisorLoop.
    """

    def __init__(
        self,
        children: Iterable[ChildSpec] = (),
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        intensity: Intensity | None = None,
        name: str = "supervisor",
        on_escalate: Callable[[SupervisorEscalationError], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._specs = list(children)
        ids = [spec.id for spec in self._specs]
        if len(set(ids)) != len(ids):
            raise InvalidInputError(f"supervisor {name!r}: duplicate child ids in {ids}")
        super().__init__(name, on_escalate)  # claims the link a parent offers, if any
        self.strategy = strategy
        self.intensity = intensity or Intensity()
        self._monotonic = monotonic
        self._children: list[_Child] = []  # start order; changed on the worker, under _lock
        self._index: dict[str, _Child] = {}  # the same children by id, kept in step
        self._restarts: deque[float] = deque()

    def __repr__(self) -> str:
        return f"Supervisor({self.name!r}, {self.urn})"

    def start_child(self, spec: ChildSpec) -> Child:
        """Start a child at runtime, after the others, and return it. InvalidInputError if
        the id is taken, ActorUnavailableError if it cannot start."""
        return self._call(functools.partial(self._add, spec))

    def terminate_child(self, child_id: str) -> None:
        """Stop a child and forget it; it is not restarted. NotFoundError if unknown."""
        self._call(functools.partial(self._remove, child_id))

    def child_ref(self, child_id: str) -> Child:
        """The child's current ref or Supervisor; a restart replaces it, so never keep one.

        It may die right after it is returned: handle ``pykka.ActorDeadError``. NotFoundError
        for an unknown id, ActorUnavailableError while it is not running.
        """
        with self._lock:
            child = self._find(child_id)
            handle = None if child is None else child.handle
        if child is None:
            raise NotFoundError(f"supervisor {self.name!r} has no child {child_id!r}")
        alive = isinstance(handle, Supervisor | pykka.ActorRef) and handle.is_alive()
        if handle is None or not alive:
            msg = f"child {child_id!r} of supervisor {self.name!r} is not running"
            raise ActorUnavailableError(msg)
        return handle

    def await_child(self, child_id: str, timeout: float = 10.0) -> Child:
        """The child's ref once it runs: waits while a death is being handled or a restart runs.

        Raises NotFoundError once the child is gone (terminated, or temporary and ended),
        ActorUnavailableError if the supervisor has ended or the child is not running
        after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                child = self._find(child_id)
                if child is None:
                    raise NotFoundError(f"supervisor {self.name!r} has no child {child_id!r}")
                handle = child.handle
                if handle is not None and handle.is_alive():
                    return handle
                remaining = deadline - time.monotonic()
                if self._done.is_set() or remaining <= 0:
                    msg = f"child {child_id!r} of supervisor {self.name!r} is not running"
                    raise ActorUnavailableError(msg)
                self._changed.wait(remaining)

    def which_children(self) -> list[ChildInfo]:
        """Every child in start order; answered after every exit reported before the call."""
        return self._call(
            lambda: [ChildInfo(c.spec.id, c.handle, c.spec.restart) for c in self._children]
        )

    def count_children(self) -> ChildCounts:
        """How many children are known, running, and running as supervisors or actors."""
        refs = [info.ref for info in self.which_children()]
        supervisors = sum(isinstance(ref, Supervisor) for ref in refs)
        active = sum(ref is not None for ref in refs)
        return ChildCounts(len(refs), active, supervisors, active - supervisors)

    def _find(self, child_id: str) -> _Child | None:
        return self._index.get(child_id)

    def _start_children(self) -> None:
        try:
            for spec in self._specs:
                self._add(spec)
        except ActorUnavailableError:
            self._shutdown()
            raise

    def _add(self, spec: ChildSpec) -> Child:
        if self._find(spec.id) is not None:
            raise InvalidInputError(f"supervisor {self.name!r} already has a child {spec.id!r}")
        child = _Child(spec)
        handle = self._start(child)
        with self._lock:
            self._children.append(child)
            self._index[spec.id] = child
        return handle

    def _remove(self, child_id: str) -> None:
        child = self._find(child_id)
        if child is None:
            raise NotFoundError(f"supervisor {self.name!r} has no child {child_id!r}")
        self._stop(child)
        with self._lock:
            self._children.remove(child)
            del self._index[child.spec.id]
        logger.info("supervisor %r: child %r terminated", self.name, child_id)

    def _start(self, child: _Child) -> Child:
        spec = child.spec
        link = ExitLink(self._report)
        try:
            with offering(link):
                handle = spec.start()
        except Exception as exc:
            msg = f"child {spec.id!r} of supervisor {self.name!r} failed to start: {exc!r}"
            raise ActorUnavailableError(msg) from exc
        if link.owner is None or link.owner != _urn(handle):
            if _urn(handle) is not None:
                self._stop_handle(spec, handle)  # running but unwatched: do not leak it
            msg = (
                f"child {spec.id!r} of supervisor {self.name!r}: the start factory must start "
                f"and return a SupervisedActor's ref or a Supervisor, not {handle!r}"
            )
            raise ActorUnavailableError(msg)
        with self._lock:
            child.handle, child.link = handle, link
        return handle

    def _stop(self, child: _Child) -> None:
        handle = child.handle
        with self._lock:
            # Detached first, so the exit it reports is stale and restarts nothing.
            child.handle = child.link = None
        if handle is not None:
            self._stop_handle(child.spec, handle)

    def _stop_handle(self, spec: ChildSpec, handle: Child) -> None:
        try:
            if isinstance(handle, Supervisor):
                handle.stop(timeout=spec.shutdown_timeout)
            else:
                handle.stop(block=True, timeout=spec.shutdown_timeout)
        except (TimeoutError, pykka.Timeout):
            logger.error(
                "supervisor %r: child %r did not stop within %ss; abandoned",
                *(self.name, spec.id, spec.shutdown_timeout),
            )

    def _stop_children(self) -> None:
        for child in reversed(self._children):
            self._stop(child)

    def _on_exit(self, link: ExitLink, reason: BaseException | None) -> None:
        child = next((c for c in self._children if c.link is link), None)
        if child is None:  # an incarnation already stopped or replaced
            logger.debug("supervisor %r: ignored the exit of a stopped child", self.name)
            return
        with self._lock:
            child.handle = child.link = None
        spec = child.spec
        if not should_restart(spec.restart, reason):
            if spec.restart is Restart.TEMPORARY:
                with self._lock:
                    self._children.remove(child)
                    del self._index[child.spec.id]
            logger.info(
                "supervisor %r: child %r exited %s; %s, not restarted",
                *(self.name, spec.id, _how(reason), spec.restart.value),
            )
            return
        if not record_restart(self._restarts, self._monotonic(), self.intensity):
            self._give_up(spec.id, reason)
            return
        started = self._restart(child)
        restarted = ", ".join(repr(i) for i in started) or "none"
        logger.log(
            logging.INFO if reason is None else logging.WARNING,
            "supervisor %r: child %r exited %s; restarted %s (%s)",
            *(self.name, spec.id, _how(reason), restarted, self.strategy.value),
        )

    def _restart(self, failed: _Child) -> list[str]:
        index = self._children.index(failed)
        if self.strategy is Strategy.ONE_FOR_ONE:
            group = [failed]
        elif self.strategy is Strategy.ONE_FOR_ALL:
            group = list(self._children)
        else:
            group = self._children[index:]
        # OTP: a temporary sibling stopped for a restart is not started again, and a
        # transient one that had already exited normally stays down.
        again = [c for c in group if c is failed or (c.handle is not None and not _temporary(c))]
        for child in reversed(group):
            self._stop(child)
        with self._lock:
            self._children = [c for c in self._children if c not in group or not _temporary(c)]
            self._index = {c.spec.id: c for c in self._children}
        started: list[str] = []
        for child in again:
            try:
                self._start(child)
            except ActorUnavailableError as exc:
                logger.exception("supervisor %r: restart failed", self.name)
                # Counted as a crash of the new incarnation, so a factory that keeps
                # failing ends in escalation rather than a restart loop.
                link = ExitLink(self._report)
                with self._lock:
                    child.link = link
                self._report(link, exc)
            else:
                started.append(child.spec.id)
        return started

    def _give_up(self, child_id: str, reason: BaseException | None) -> None:
        limit = self.intensity
        self._failure = SupervisorEscalationError(
            f"supervisor {self.name!r} gave up: more than {limit.max_restarts} restarts in "
            f"{limit.period_s}s, the last after child {child_id!r} exited {_how(reason)}"
        )
        self._failure.__cause__ = reason
        logger.error("%s; stopping its children", self._failure)
        self._shutdown()
