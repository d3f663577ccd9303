"""The conversation registry: actors started on first use, passivated when idle (A7).

Conversation actors are children of a dynamic :class:`~fermix.supervisor.Supervisor`
(restart ``transient``: a crash brings the actor back from SQLite, a passivation does not).
The registry finds a conversation's actor by key, starts one when there is none, and stops
the least recently used ones past ``cap`` and those idle for ``idle_s``, so the number of
live actors (threads) stays bounded however many conversations exist.

Callers never hold a ref: :meth:`ConversationRegistry.ask` looks the actor up on every call,
and if the actor died in between (crash, passivation) asks again once the supervisor has
dealt with the death. A passivation finishes before the key can start again, so a new
actor never reads the window while the old one still has an append in flight.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pykka

from fermix.actors.base import ask_found
from fermix.errors import ActorUnavailableError, NotFoundError
from fermix.model import ConversationKey
from fermix.supervisor import ChildSpec, Restart, Supervisor

SpecFactory = Callable[[ConversationKey], ChildSpec]


@functools.lru_cache(maxsize=4096)
def child_id(key: ConversationKey) -> str:
    """The supervisor child id of a conversation's actor."""
    return "conversation:" + key.agent_id + "/" + key.scope_id


class ConversationRegistry:
    """Finds, starts and passivates conversation actors under the current ``supervisor()``."""

    def __init__(
        self,
        supervisor: Callable[[], Supervisor],
        spec_for: SpecFactory,
        *,
        cap: int = 256,
        idle_s: float = 600.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._current_supervisor = supervisor
        self._spec_for = spec_for
        self.cap = cap
        self.idle_s = idle_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._live: OrderedDict[ConversationKey, float] = OrderedDict()  # LRU order
        self.passivated = 0
        """How many actors were stopped for idleness or the cap (for status and tests)."""

    @property
    def _supervisor(self) -> Supervisor:
        # Looked up on every use: the supervisor itself is restarted by its parent.
        return self._current_supervisor()

    def ask(self, key: ConversationKey, message: Any, *, timeout: float | None = 30.0) -> Any:
        """Send ``message`` to the actor of ``key`` and return its reply."""
        return ask_found(
            lambda: self._ref(key),
            message,
            timeout=timeout,
            what=f"conversation {key.scope_id} of {key.agent_id}",
        )

    def tell(self, key: ConversationKey, message: Any) -> None:
        """Send ``message`` to the actor of ``key`` without waiting."""
        self._ref(key).tell(message)

    def tell_if_live(self, key: ConversationKey, message: Any) -> bool:
        """Send ``message`` to the actor of ``key`` if it is live; False if it is not.

        An actor that is not live reads its window from SQLite when it starts, so a
        committed message needs no delivery then.
        """
        with self._lock:
            if key not in self._live:
                return False  # the common case of an append: decided before any other work
            self._live.move_to_end(key)
            self._live[key] = self._monotonic()
            try:
                ref = self._supervisor.await_child(child_id(key))
            except NotFoundError:
                del self._live[key]
                return False
            except ActorUnavailableError:
                # Its supervisor gave up (stopping it) or is being restarted: the message
                # is committed, and whatever serves the key next reads it from SQLite.
                # Raising here would fail an append that was stored (A1).
                return False
        assert isinstance(ref, pykka.ActorRef)
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            return False  # it died after the lookup: its successor reads SQLite
        return True

    def live_count(self) -> int:
        """How many conversation actors are live."""
        with self._lock:
            return len(self._live)

    def passivate(self, key: ConversationKey) -> bool:
        """Stop the actor of ``key`` now (its state is in SQLite); False if none was live."""
        with self._lock:
            if key not in self._live:
                return False
            self._terminate(key)
            return True

    def passivate_idle(self) -> int:
        """Stop every actor unused for ``idle_s``; return how many were stopped."""
        cutoff = self._monotonic() - self.idle_s
        with self._lock:
            idle = [key for key, used in self._live.items() if used <= cutoff]
            for key in idle:
                self._terminate(key)
        return len(idle)

    def passivate_agent(self, agent_id: str | None) -> int:
        """Stop every live actor of ``agent_id`` (None: of every agent) now, so that no window
        held in memory outlives an erasure (F4); return how many were stopped."""
        with self._lock:
            keys = [k for k in self._live if agent_id is None or k.agent_id == agent_id]
            for key in keys:
                self._terminate(key)
        return len(keys)

    def _ref(self, key: ConversationKey) -> pykka.ActorRef[Any]:
        cid = child_id(key)
        with self._lock:
            if key in self._live:
                self._live.move_to_end(key)
                self._live[key] = self._monotonic()
                try:
                    # Waits while a crash is being handled and the actor restarted.
                    ref = self._supervisor.await_child(cid)
                except NotFoundError:
                    # A temporary end (restart intensity, crash in on_start) dropped it.
                    del self._live[key]
                    ref = self._start(key)
            else:
                ref = self._start(key)
        assert isinstance(ref, pykka.ActorRef)
        return ref

    def _start(self, key: ConversationKey) -> pykka.ActorRef[Any]:
        # Called with the lock held: evict first so the cap holds while starting.
        while len(self._live) >= self.cap:
            oldest = next(iter(self._live))
            self._terminate(oldest)
        spec = self._spec_for(key)
        ref = self._supervisor.start_child(spec)
        self._live[key] = self._monotonic()
        assert isinstance(ref, pykka.ActorRef)
        return ref

    def _terminate(self, key: ConversationKey) -> None:
        # Called with the lock held, so the key cannot start again until its actor stopped.
        del self._live[key]
        try:
            self._supervisor.terminate_child(child_id(key))
        except NotFoundError:
            return
        self.passivated += 1


def conversation_spec(key: ConversationKey, start: Callable[[], pykka.ActorRef[Any]]) -> ChildSpec:
    """The child spec of a conversation actor: restarted after a crash, not after a stop."""
    return ChildSpec(id=child_id(key), start=start, restart=Restart.TRANSIENT)
