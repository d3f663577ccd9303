"""One CPU for the threads of a contended group commit, while they are in it (A1, S8).

Under the GIL, the callers of a group commit run their Python one at a time whatever the
number of CPUs, and hand it to each other at every wake-up: a follower woken with its
outcome, a leader handed the connection, the GIL passed on when a statement releases it.
On Linux a thread woken while another CPU is idle is placed on that idle CPU, where it
first waits for the GIL still held on the waker's: every hand-off then costs an
inter-processor interrupt, and on a virtual machine the wake of a halted virtual CPU.
That is the old result that GIL-bound threads run slower on several cores than on one
(Beazley, "Understanding the Python GIL", 2010). ``bench/append.py`` measured it here
(2 virtual CPUs, 8 threads appending to 64 conversations, full runs): about 11,900
appends/s with the threads free to move, 15,500 to 16,500 with contended callers narrowed,
against 11,700 to 14,700 for one thread committing each row alone.

So while the writer is contended, a caller of the group commit narrows its own thread to
the writer's CPU for the length of its call and gives the thread back the CPUs it had on
the way out: the host's threads are never left changed. An uncontended caller (one
conversation appending turn after turn) pays nothing. The CPU is one the process may use,
picked by its process id so that several processes on one machine spread over the CPUs;
a thread whose CPUs exclude it is left alone. Off where the calls do not exist (not
Linux), on one CPU, without a GIL, or when ``FERMIX_WRITER_AFFINITY=0``; a refused call
(a sandbox) turns it off for the process.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

ENV_SWITCH = "FERMIX_WRITER_AFFINITY"
"""``0`` keeps fermix from narrowing any thread's CPUs."""


class WriterCpu:
    """Narrows a calling thread to one CPU and gives it back its own (see the module)."""

    def __init__(self, cpu: int | None) -> None:
        self.cpu = cpu
        """The writer's CPU, or None: off."""
        self._only = frozenset() if cpu is None else frozenset({cpu})

    @classmethod
    def for_process(cls) -> WriterCpu:
        """The writer CPU of this process, or an instance that is off (see the module)."""
        return cls(_choose())

    def narrow(self) -> set[int] | None:
        """Move the calling thread to the writer's CPU; return the CPUs to give back to it
        (:meth:`restore`), or None when it was left alone."""
        cpu = self.cpu
        if cpu is None:
            return None
        try:
            own = os.sched_getaffinity(0)
            if cpu not in own or len(own) == 1:
                return None
            os.sched_setaffinity(0, self._only)
        except OSError as exc:
            self._turn_off(exc)
            return None
        return own

    def restore(self, own: set[int]) -> None:
        """Give the calling thread back ``own``, the CPUs :meth:`narrow` returned."""
        try:
            os.sched_setaffinity(0, own)
        except OSError as exc:  # the host's set changed under it (a cgroup): keep theirs
            self._turn_off(exc)

    def _turn_off(self, exc: OSError) -> None:
        if self.cpu is not None:
            log.info("writer CPU affinity off for this process: %s", exc)
        self.cpu = None


def _choose() -> int | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return None  # free-threaded: the callers do run at once, on CPUs of their own
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except OSError:
        return None
    if len(cpus) < 2:
        return None
    return cpus[os.getpid() % len(cpus)]
