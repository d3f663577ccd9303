"""A supervisor's own thread, and how a supervisor ends (A6).

A supervisor is a plain object with one worker thread fed by a queue: exit reports,
arriving on each dying child's thread, and calls from other threads, each answered through
a future. Every start, stop and restart runs on that thread, one event at a time; a lock
guards only what other threads read or change at once (whether the loop runs, and the
table of children), and a condition on it is notified after every event. It is not a pykka
actor: how it ends is its own, and it is not in ``ActorRegistry``.

It ends when it is stopped, or when it gives up (past its restart intensity, or after a bug
in it) with a :class:`~fermix.errors.SupervisorEscalationError`. Then it fails upward: to
its parent supervisor, through the :class:`~fermix.actors.base.ExitLink` it claimed when it
was built, or at the top of a tree to ``on_escalate`` and :meth:`SupervisorLoop.wait`.
:class:`~fermix.supervisor.Supervisor` adds the children.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple, Self, TypeVar

from fermix.actors.base import ExitLink, claim_link
from fermix.errors import ActorUnavailableError, SupervisorEscalationError

__all__ = ["SupervisorLoop"]

# The logger fermix.supervisor has always used, so hosts' logging settings still apply.
logger = logging.getLogger("fermix.supervisor")

T = TypeVar("T")


class _Exit(NamedTuple):
    link: ExitLink
    reason: BaseException | None


class _Call(NamedTuple):
    run: Callable[[], Any]
    future: Future[Any]


class SupervisorLoop:
    """A supervisor's thread and life: started once, stopped or given up once.

    ``name`` appears in logs and errors; ``urn`` identifies this instance. ``on_escalate``
    is called with the error when a top-level supervisor gives up (a nested one reports to
    its parent instead). A subclass manages the children, on the thread: it starts them in
    ``_start_children``, stops them in ``_stop_children``, handles the exits reported to
    ``_report`` in ``_on_exit``, and gives up by setting ``_failure`` and calling
    ``_shutdown``.
    """

    def __init__(
        self, name: str, on_escalate: Callable[[SupervisorEscalationError], None] | None
    ) -> None:
        self.name = name
        self.urn = uuid.uuid4().urn
        self._on_escalate = on_escalate
        self._parent = claim_link(self.urn)
        self._events: queue.SimpleQueue[_Exit | _Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after every event
        self._closed = False  # no call is queued any more; set under _lock
        self._stopping = False  # the worker leaves its loop after the current event
        self._done = threading.Event()
        self._failure: SupervisorEscalationError | None = None
        self._thread: threading.Thread | None = None

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

    def _start_children(self) -> None:
        raise NotImplementedError

    def _stop_children(self) -> None:
        raise NotImplementedError

    def _on_exit(self, link: ExitLink, reason: BaseException | None) -> None:
        raise NotImplementedError

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
