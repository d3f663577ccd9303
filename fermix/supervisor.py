"""Erlang/OTP-style supervision of pykka actors (A6).

pykka has no links, monitors or restarts; a stopped actor can only be replaced. A
:class:`Supervisor` starts children from :class:`ChildSpec` factories in order, replaces
those that end as their :class:`Restart` type and its :class:`Strategy` say, stops them in
reverse order, and fails upward past its :class:`Intensity`. Children can also be started
and terminated at runtime, as with Elixir's ``DynamicSupervisor``. The restart policy
(:func:`should_restart`, :func:`record_restart`) is plain data and pure functions.

A supervisor is a plain object with one worker thread fed by a queue: exit reports,
arriving on each dying child's thread, and calls from other threads, each answered through
a future. Every start, stop and restart runs on that thread, one event at a time; a lock
guards only what other threads read or change at once (whether the loop runs, and the
table of children), so :meth:`Supervisor.child_ref` answers at once from any thread, and a
condition on it is notified after every event. It is not a pykka actor: how it ends is its
own, and it is not in ``ActorRegistry``. Stop a tree by stopping its top supervisor:
``ActorRegistry.stop_all()`` stops children behind their supervisors' backs, which see
normal exits and restart permanent children.

It ends when it is stopped, or when it gives up (past its restart intensity, or after a bug
in it) with a :class:`~fermix.errors.SupervisorEscalationError`. Then it fails upward: to
its parent supervisor, through the :class:`~fermix.actors.base.ExitLink` it claimed when it
was built, or at the top of a tree to ``on_escalate`` and :meth:`Supervisor.wait`.

For each start the supervisor offers a new :class:`~fermix.actors.base.ExitLink` while the
factory runs; the SupervisedActor or nested Supervisor built claims it and reports its exit
through it. A report on a link that is no longer a child's current one comes from an
incarnation already stopped or replaced and changes nothing: that is why a stop,
``terminate_child`` or a sibling's restart never causes a restart.
"""

from __future__ import annotations

import enum
import functools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple, Self, TypeAlias, TypeVar

import pykka

from fermix.actors.base import ExitLink, claim_link, offering
from fermix.errors import (
    ActorUnavailableError,
    InvalidInputError,
    NotFoundError,
    SupervisorEscalationError,
)

__all__ = [
    "Child",
    "ChildCounts",
    "ChildInfo",
    "ChildSpec",
    "Intensity",
    "Restart",
    "Strategy",
    "Supervisor",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# -- the restart policy: when a child is restarted, which children, how often ------------


class Restart(enum.Enum):
    """Whether a child that ended is started again (OTP restart types).

    PERMANENT always; TRANSIENT only after an abnormal exit (an exception); TEMPORARY
    never, and it is forgotten once it ends.
    """

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class Strategy(enum.Enum):
    """Which children a restart replaces (OTP restart strategies).

    ONE_FOR_ONE only the child that ended; ONE_FOR_ALL all of them; REST_FOR_ONE the child
    that ended and those started after it. Those of them still running are stopped in
    reverse start order, then started again in order, all but a temporary one, which is
    forgotten; one that was not running (a transient child that ended normally) stays down.
    """

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


@dataclass(frozen=True)
class Intensity:
    """More than ``max_restarts`` restarts within ``period_s`` seconds (of the supervisor's
    monotonic clock), and the supervisor stops its children and gives up."""

    max_restarts: int = 3
    period_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.period_s <= 0:
            msg = f"restart intensity needs max_restarts >= 0 and period_s > 0, got {self}"
            raise InvalidInputError(msg)


def should_restart(restart: Restart, reason: BaseException | None) -> bool:
    """Whether a ``restart`` child that ended for ``reason`` (None: normally) starts again."""
    return restart is Restart.PERMANENT or (restart is Restart.TRANSIENT and reason is not None)


def record_restart(history: deque[float], now: float, intensity: Intensity) -> bool:
    """Add a restart at ``now`` to ``history``, forget those more than the period ago, and
    say whether those left are within ``intensity``."""
    history.append(now)
    while now - history[0] > intensity.period_s:
        history.popleft()
    return len(history) <= intensity.max_restarts


# -- children and the supervisor -------------------------------------------------------

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


class _Exit(NamedTuple):
    link: ExitLink
    reason: BaseException | None


class _Call(NamedTuple):
    run: Callable[[], Any]
    future: Future[Any]


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


class Supervisor:
    """Starts, watches, restarts and stops children; itself a valid child of a Supervisor.

    ``name`` appears in logs and errors; ``urn`` identifies this instance. ``on_escalate``
    is called with the error when a top-level supervisor gives up (a nested one reports to
    its parent instead); ``monotonic`` is the clock restart intensity is counted on.
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
        self.name = name
        self.urn = uuid.uuid4().urn
        self._on_escalate = on_escalate
        self._parent = claim_link(self.urn)  # the link a parent offers, if any
        self._events: queue.SimpleQueue[_Exit | _Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after every event
        self._closed = False  # no call is queued any more; set under _lock
        self._stopping = False  # the worker leaves its loop after the current event
        self._done = threading.Event()
        self._failure: SupervisorEscalationError | None = None
        self._thread: threading.Thread | None = None
        self.strategy = strategy
        self.intensity = intensity or Intensity()
        self._monotonic = monotonic
        self._children: list[_Child] = []  # start order; changed on the worker, under _lock
        self._index: dict[str, _Child] = {}  # the same children by id, kept in step
        self._restarts: deque[float] = deque()

    def __repr__(self) -> str:
        return f"Supervisor({self.name!r}, {self.urn})"

    def start(self) -> Self:
        """Start the thread, then the children in order; if one cannot, stop those started
        in reverse order and raise ActorUnavailableError. RuntimeError if started before."""
        with self._lock:
            if self._thread is not None or self._closed:
                raise RuntimeError(f"supervisor {self.name!r} was already started")
            self._thread = threading.Thread(
                target=self._run, name=f"fermix-supervisor-{self.name}", daemon=True
            )
        self._thread.start()
        self._call(self._start_children)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop every child in reverse start order, then the supervisor; a no-op once
        stopped. TimeoutError if it has not stopped within ``timeout`` seconds."""
        with self._lock:
            if self._thread is None:
                self._closed = True
                self._done.set()
            elif not self._closed:
                self._closed = True
                self._events.put(_Call(self._shutdown, Future()))
        if threading.current_thread() is self._thread:
            return  # called from a factory or on_escalate: the worker cannot wait for itself
        if not self._done.wait(timeout):
            raise TimeoutError(f"supervisor {self.name!r} did not stop within {timeout}s")

    def wait(self, timeout: float | None = None) -> None:
        """Block until the supervisor has ended; raise its SupervisorEscalationError if it
        gave up, TimeoutError if it still runs after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"supervisor {self.name!r} still runs after {timeout}s")
        if self._failure is not None:
            raise self._failure

    def is_alive(self) -> bool:
        """Whether the supervisor was started and has neither stopped nor given up."""
        return self._thread is not None and not self._done.is_set()

    @property
    def failure(self) -> SupervisorEscalationError | None:
        """Why the supervisor gave up; None while it runs or if it stopped when asked."""
        return self._failure

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

    # -- the worker thread and how the supervisor ends ---------------------------------

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _call(self, run: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            msg = f"supervisor {self.name!r} cannot be called from a child's start factory"
            raise RuntimeError(msg)
        future: Future[T] = Future()
        with self._lock:
            if self._thread is None or self._closed:
                raise ActorUnavailableError(f"supervisor {self.name!r} is not running")
            self._events.put(_Call(run, future))
        return future.result()

    def _report(self, link: ExitLink, reason: BaseException | None) -> None:
        self._events.put(_Exit(link, reason))

    def _run(self) -> None:
        try:
            while not self._stopping:
                event = self._events.get()
                if isinstance(event, _Exit):
                    self._on_exit(event.link, event.reason)
                    self._notify()
                    continue
                try:
                    event.future.set_result(event.run())
                except Exception as exc:  # noqa: BLE001 - handed to the caller waiting on it
                    event.future.set_exception(exc)
                self._notify()
        except Exception as exc:
            # A bug in the supervisor itself: stop the children and fail upward as if it gave up.
            logger.exception("supervisor %r crashed", self.name)
            self._failure = SupervisorEscalationError(f"supervisor {self.name!r} crashed")
            self._failure.__cause__ = exc
            self._stop_children()
        finally:
            self._finish()

    def _shutdown(self) -> None:
        self._stop_children()
        self._stopping = True

    def _finish(self) -> None:
        with self._lock:
            self._closed = True
        while not self._events.empty():  # nothing is queued any more but exit reports
            if isinstance(event := self._events.get(), _Call):
                msg = f"supervisor {self.name!r} stopped"
                event.future.set_exception(ActorUnavailableError(msg))
        if self._parent is None and self._failure is not None and self._on_escalate is not None:
            # Before _done: whoever sees the tree ended (wait(), await_child()) must also
            # see what on_escalate recorded (Memory.failure), never a window without it.
            try:
                self._on_escalate(self._failure)
            except Exception:
                logger.exception("on_escalate of supervisor %r failed", self.name)
        self._done.set()
        self._notify()
        if self._parent is not None:
            self._parent.report(self._failure)
