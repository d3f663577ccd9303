"""Sweeps in every host (M7): a running Memory, embedded or the service's, reviews its due
conversations on its own timer (``[fermix_core.memory] sweep_interval_s``), voice
transcripts included, with no ``commit`` and no ``tick()`` from the host; 0 turns it off,
and closing stops the timer's thread. Waits are on the loopback model server receiving the
review request, with a timeout: no sleeps."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from factories import StartMemory, config_for, reading
from model_server import ModelServer

from fermix.config import Config, MemoryConfig
from fermix.core.review import Skip
from fermix.home import Home
from fermix.model import ConversationKey, NewMessage
from fermix.runtime.engine import Runtime

KITCHEN = ConversationKey("agent", "realtime", "kitchen")
SAVE_CITY = {
    "operations": [{"op": "add", "category": "identity", "key": "home_city", "value": "Porto"}]
}


def _config(server: ModelServer, sweep_interval_s: float) -> Config:
    """Transcripts kept, reviews due at once (never reviewed, 24 h interval), the sweep's
    interval as given."""
    return config_for(
        server,
        persist_transcripts=True,
        memory=MemoryConfig(sweep_interval_s=sweep_interval_s),
    )


def _shown(server: ModelServer, text: str, index: int = 0) -> bool:
    """Whether the review request ``index`` showed the model ``text``."""
    return text in json.dumps(server.requests[index]["messages"], ensure_ascii=False)


def test_m7_v1_an_embedded_memory_reviews_a_voice_transcript_with_no_commit_nor_tick(
    start_memory: StartMemory, model_server: ModelServer, home: Path
) -> None:
    memory = start_memory(_config(model_server, sweep_interval_s=0.05))
    model_server.reply_json(SAVE_CITY)
    memory.voice_transcript("agent", "kitchen", "user", "I moved to Porto", owner_id="alice")
    memory.voice_transcript("agent", "kitchen", "assistant", "Welcome!", owner_id="alice")
    assert model_server.wait_for_requests(1, timeout=30)  # the sweep sent it
    assert _shown(model_server, "I moved to Porto")
    conv = memory.conversation("agent", "realtime", "kitchen", owner_id="alice")
    # asked after the sweep's review of it, so answered after it
    assert memory.review(conv, force=False).skip is Skip.UNDER_INTERVAL
    with reading(home) as reads:
        rows = reads.rows(agent_id="agent")
    assert [(r.key, r.value, r.owner_id) for r in rows] == [("home_city", "Porto", "alice")]
    assert len(model_server.requests) == 1  # swept again and again, reviewed once


def test_m7_with_the_sweep_off_the_timer_has_no_sweep_and_only_tick_sweeps(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(_config(model_server, sweep_interval_s=0))
    # idle_s / 2 (A7), and the retry of an erasure a reader held back (F3)
    assert memory._runtime.services.timer.jobs() == {"passivation": 300.0, "erasures": 60.0}
    memory.voice_transcript("agent", "kitchen", "user", "I moved to Porto", owner_id="alice")
    assert model_server.requests == []
    model_server.reply_json(SAVE_CITY)
    assert memory.tick() == 1  # a host may still sweep by hand
    assert model_server.wait_for_requests(1, timeout=30)


def test_m7_a_sweep_does_not_dispatch_a_review_already_pending(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    release = threading.Event()
    memory = start_memory(_config(model_server, sweep_interval_s=0))
    model_server.hang(release)
    try:
        memory.voice_transcript("agent", "kitchen", "user", "I moved to Porto", owner_id="a")
        assert memory.tick() == 1
        assert model_server.wait_for_requests(1, timeout=30)
        assert memory.tick() == 0  # its review still hangs in the model
    finally:
        release.set()


def test_m7_close_stops_the_timer_thread_without_waiting_for_its_interval(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(_config(model_server, sweep_interval_s=3600))
    timer = memory._runtime.services.timer
    assert timer.jobs() == {"passivation": 300.0, "sweep": 3600.0, "erasures": 60.0}
    assert timer.thread.is_alive()
    memory.close(timeout=30)
    assert not timer.thread.is_alive()


def test_m7_the_service_runtime_sweeps_by_the_same_timer(
    model_server: ModelServer, home: Path
) -> None:
    """The service runs a Runtime on the home's config (``fermix server start``): the
    same timer sweeps there; its status loop need not tick."""
    runtime = Runtime(Home(home), _config(model_server, sweep_interval_s=0.05))
    runtime.start()
    try:
        model_server.reply_json(SAVE_CITY)
        runtime.append(
            NewMessage(KITCHEN, "user", "I moved to Porto", owner_id="alice", kind="voice_turn"),
            trust="operator",
            peak_prompt_tokens=None,
        )
        assert model_server.wait_for_requests(1, timeout=30)
        assert _shown(model_server, "I moved to Porto")
    finally:
        runtime.close()
    assert not runtime.services.timer.thread.is_alive()
