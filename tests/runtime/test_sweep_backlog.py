"""A backlog of many due conversations drains at the reviewers' pace (M7, B2).

The sweep claims only as many due conversations as its reviewers can start well before the
claims expire (``SWEEP_CLAIMS_PER_WORKER`` each). A sweep that claimed all it had room for
has the timer sweep again within ``SWEEP_AGAIN_S``, so the rest of a large backlog does not
wait a whole ``sweep_interval_s`` per handful.
"""

from __future__ import annotations

import threading

from factories import StartMemory, config_for
from model_server import ModelServer

from fermix.config import MemoryConfig
from fermix.core.review_answer import NOTHING_TO_SAVE
from fermix.runtime.reviewing import SWEEP_CLAIMS_PER_WORKER
from fermix.runtime.timer import Timer


def test_timer_soon_runs_a_job_long_before_its_interval() -> None:
    ran = threading.Event()
    timer = Timer()
    timer.every("job", 3600, lambda: ran.set() or True)
    timer.start()
    try:
        assert not ran.wait(0.05)
        timer.soon("job", 0.0)
        assert ran.wait(5)
        assert timer.jobs() == {"job": 3600}
    finally:
        timer.stop(5)


def test_m7_one_sweep_starts_the_review_of_a_backlog_larger_than_its_room(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    """One reviewer has room for SWEEP_CLAIMS_PER_WORKER claims; three times as many
    conversations are due, and the sweep interval is an hour: every one of them is still
    reviewed after a single sweep, by the timer's sweeps that follow a full one."""
    memory = start_memory(
        config_for(model_server, memory=MemoryConfig(review_workers=1, sweep_interval_s=3600))
    )
    due = 3 * SWEEP_CLAIMS_PER_WORKER
    for i in range(due):
        memory.conversation("agent", "tg", str(i), owner_id=f"o{i}").append_user(f"fact {i}")
    for _ in range(due):
        model_server.reply(NOTHING_TO_SAVE)
    assert memory.tick() == SWEEP_CLAIMS_PER_WORKER
    assert model_server.wait_for_requests(due, timeout=30)
