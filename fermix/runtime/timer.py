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
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fermix-timer", daemon=True)

    def every(self, name: str, interval_s: float, run: Callable[[], bool]) -> None:
        """Run ``run`` every ``interval_s`` seconds, the first time one interval from now."""
        with self._lock:
            self._jobs[name] = _Job(name, interval_s, run)

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

    def start(self) -> None:
        self.thread.start()

    def _next(self) -> tuple[_Job | None, float | None]:
        with self._lock:
            if not self._jobs:
                return None, None
            job = min(self._jobs.values(), key=lambda j: j.due_at)
            return job, job.due_at - time.monotonic()

    def _run(self) -> None:
        while True:
            job, delay = self._next()
            if self._stop.wait(None if delay is None else max(0.0, delay)):
                return
            if job is None or delay is None or delay > 0:
                continue  # an interval may have restarted meanwhile: look again
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
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)
