"""``Pool``: a runtime's supervised Reviewers or Compactors, and how requests reach them (M3).

A conversation's requests go in order to one actor of the pool, and otherwise to the least
busy one, so a model call that hangs for one conversation holds one actor, not the others'
turns. The actors' runners (:class:`PooledReviews`, :class:`PooledCompactions`) tell the
pool when each request ends.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pykka

from fermix.actors.base import ask_found
from fermix.actors.compactor import CompactionRunner
from fermix.actors.reviewer import ReviewRunner
from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.errors import ActorUnavailableError, FermixError, InvalidInputError, NotFoundError
from fermix.model import ConversationKey
from fermix.supervisor import ChildSpec, Supervisor


class Pool:
    """``size`` supervised actors of one kind, each a child of the tree (M3).

    Named ``name``, ``name-2``, ``name-3``... A conversation's requests go in order to one
    actor: the one still holding an earlier request of it, else the one with the fewest
    requests pending (the first of a tie). So a request never queues behind another
    conversation's while an actor is idle, one conversation's requests keep their order
    (asked after a tell, answered after it), and at most ``size`` run at once. The actors'
    runners report each finished request (:meth:`finished`); a restarted actor starts with
    nothing pending, its predecessor's queue being lost with it.
    """

    def __init__(self, name: str, size: int, tree: Callable[[], Supervisor]) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidInputError(f"{name} workers must be an integer >= 1, not {size!r}")
        self.name = name
        self.ids = [name, *(f"{name}-{n}" for n in range(2, size + 1))]
        self._tree = tree
        self._lock = threading.Lock()
        self._pending = [0] * size
        self._holders: dict[ConversationKey, tuple[int, int]] = {}
        """The actor holding requests of a conversation, and how many."""

    def specs(self, start: Callable[[int], pykka.ActorRef[Any]]) -> list[ChildSpec]:
        """The tree's child specs: actor ``n`` is started by ``start(n)``."""
        return [
            ChildSpec(child, functools.partial(self._start, n, start))
            for n, child in enumerate(self.ids)
        ]

    def _start(self, n: int, start: Callable[[int], pykka.ActorRef[Any]]) -> pykka.ActorRef[Any]:
        with self._lock:
            self._pending[n] = 0
            for key in [k for k, (holder, _) in self._holders.items() if holder == n]:
                del self._holders[key]
        return start(n)

    def pending(self) -> list[int]:
        """Requests sent to each actor and not finished yet (for tests and status)."""
        with self._lock:
            return list(self._pending)

    def _assign(self, key: ConversationKey, *, unless_pending: bool) -> int | None:
        with self._lock:
            held = self._holders.get(key)
            if held is not None and unless_pending:
                return None
            if held is not None:
                n, count = held
            else:
                n = min(range(len(self._pending)), key=self._pending.__getitem__)
                count = 0
            self._holders[key] = (n, count + 1)
            self._pending[n] += 1
            return n

    def finished(self, n: int, key: ConversationKey) -> None:
        """Actor ``n`` is done with a request of ``key`` (or it never reached it)."""
        with self._lock:
            self._pending[n] = max(0, self._pending[n] - 1)
            held = self._holders.get(key)
            if held is not None and held[0] == n:
                if held[1] <= 1:
                    del self._holders[key]
                else:
                    self._holders[key] = (n, held[1] - 1)

    def tell(self, key: ConversationKey, message: Any, *, unless_pending: bool = False) -> bool:
        """Send ``message`` about ``key`` without waiting; False when ``unless_pending`` and
        a request of ``key`` is still pending (nothing is sent)."""
        n = self._assign(key, unless_pending=unless_pending)
        if n is None:
            return False
        try:
            _ref(self._tree().child_ref(self.ids[n])).tell(message)
        except (FermixError, pykka.ActorDeadError):
            self.finished(n, key)
            raise
        return True

    def ask(self, key: ConversationKey, message: Any, *, timeout: float | None) -> Any:
        """Send ``message`` about ``key`` and wait for the reply, at most ``timeout`` seconds
        (``pykka.Timeout``: the request stays queued and runs later)."""
        n = self._assign(key, unless_pending=False)
        assert n is not None
        child = self.ids[n]
        try:
            return ask_found(
                lambda: _ref(self._tree().await_child(child)),
                message,
                timeout=timeout,
                what=f"the {child} actor",
            )
        except (ActorUnavailableError, NotFoundError):
            self.finished(n, key)  # it never reached an actor
            raise


class PooledReviews:
    """The runner of Reviewer ``n``: tells the pool when each review ends; only the first
    Reviewer repairs the prompt files at start (they are the same files for all)."""

    def __init__(self, runner: ReviewRunner, pool: Pool, n: int) -> None:
        self._runner = runner
        self._pool = pool
        self._n = n

    def start(self) -> None:
        if self._n == 0:
            self._runner.start()

    def review(self, key: ConversationKey, *, force: bool = False) -> ReviewResult:
        try:
            return self._runner.review(key, force=force)
        finally:
            self._pool.finished(self._n, key)


class PooledCompactions:
    """The runner of Compactor ``n``: tells the pool when each compaction ends."""

    def __init__(self, runner: CompactionRunner, pool: Pool, n: int) -> None:
        self._runner = runner
        self._pool = pool
        self._n = n

    def compact(self, key: ConversationKey, *, force: bool) -> CompactionResult:
        try:
            return self._runner.compact(key, force=force)
        finally:
            self._pool.finished(self._n, key)


def _ref(child: object) -> pykka.ActorRef[Any]:
    # The tree's children named here are actors, never nested supervisors.
    assert isinstance(child, pykka.ActorRef)
    return child
