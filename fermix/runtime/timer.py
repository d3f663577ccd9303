"""``Timer``: the one thread of a runtime's periodic work (passivation A7, review sweep M7)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class _Job:
    """One periodic job of a :class:`Timer`."""

    def __init__(self, name: str, interval_s: float, run: Callable[[], bool]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.run = run
        self.last = time.monotonic()

    @property
    def due_at(self) -> float:
        return self.last + self.interval_s


class Timer:
    """The one thread of a runtime's periodic work (A7, M7): passivating idle conversation
    actors and sweeping for due reviews.

    Each job runs every ``interval_s`` seconds counted from its last run, whoever ran it
    (:meth:`ran`: an explicit ``tick()`` restarts the sweep's interval, so a host that also
    sweeps on its own timer does not sweep twice as often). A job returning False is dropped;
    one raising is logged and kept. :meth:`stop` wakes the thread and joins it.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified when a job is moved sooner or the timer stops: the thread looks again."""
        self._stopped = False
        self.thread = threading.Thread(target=self._run, name="fermix-timer", daemon=True)

    def every(self, name: str, interval_s: float, run: Callable[[], bool]) -> None:
        """Run ``run`` every ``interval_s`` seconds, the first time one interval from now."""
        with self._lock:
            self._jobs[name] = _Job(name, interval_s, run)
            self._changed.notify_all()

    def cancel(self, name: str) -> bool:
        """Run job ``name`` no more (a run in progress finishes); True if there was one."""
        with self._lock:
            found = self._jobs.pop(name, None) is not None
            self._changed.notify_all()
        return found

    def jobs(self) -> dict[str, float]:
        """Each job's name and interval in seconds."""
        with self._lock:
            return {job.name: job.interval_s for job in self._jobs.values()}

    def ran(self, name: str) -> None:
        """Job ``name`` runs now (if there is one): its next run is one interval from now."""
        with self._lock:
            job = self._jobs.get(name)
            if job is not None:
                job.last = time.monotonic()

    def soon(self, name: str, delay_s: float) -> None:
        """Run job ``name`` (if there is one) within ``delay_s`` seconds, unless it is due
        sooner anyway; later runs keep its interval."""
        with self._lock:
            job = self._jobs.get(name)
            if job is not None and job.due_at > time.monotonic() + delay_s:
                job.last = time.monotonic() + delay_s - job.interval_s
                self._changed.notify_all()

    def start(self) -> None:
        self.thread.start()

    def _next(self) -> tuple[_Job | None, float | None] | None:
        """The job due first and how long until it is due, after waiting for that (or for a
        change) at most once; None once stopped."""
        with self._lock:
            if self._stopped:
                return None
            if not self._jobs:
                self._changed.wait()
                return self._none()
            job = min(self._jobs.values(), key=lambda j: j.due_at)
            delay = job.due_at - time.monotonic()
            if delay > 0:
                self._changed.wait(delay)
                return self._none()
            return job, delay

    def _none(self) -> tuple[_Job | None, float | None] | None:
        return None if self._stopped else (None, None)

    def _run(self) -> None:
        while True:
            found = self._next()
            if found is None:
                return
            job, delay = found
            if job is None or delay is None or delay > 0:
                continue  # woken, or an interval restarted meanwhile: look again
            self.ran(job.name)
            try:
                keep = job.run()
            except Exception:
                log.exception("the periodic %s failed", job.name)
                keep = True
            if not keep:
                with self._lock:
                    self._jobs.pop(job.name, None)

    def stop(self, timeout: float) -> None:
        """Stop the jobs and wait (at most ``timeout`` seconds) for one in progress."""
        with self._lock:
            self._stopped = True
            self._changed.notify_all()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)
