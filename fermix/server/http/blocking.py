"""Blocking memory calls from ``async`` routes, on the server's worker threads.

An append waits for its commit; on the event loop it would hold up every other request,
so the hot routes hand it to a worker thread and await it: one hop per request. A plain
:class:`~concurrent.futures.ThreadPoolExecutor` costs less per hop than the framework's
generic ``run_in_threadpool`` (measured with py-spy in bench/server.py's load: its limiter
and task bookkeeping were about a quarter of the server's CPU), and its threads are the
committer's callers, whose concurrent appends share commits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WORKERS = 64
"""Blocking calls running at once; more wait in the executor's queue."""

_executor = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="fermix-http")


async def run(call: Callable[[], T]) -> T:
    """Run ``call`` on a worker thread and return its result (or raise its error)."""
    return await asyncio.get_running_loop().run_in_executor(_executor, call)
