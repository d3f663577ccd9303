"""The config a running runtime applies without a restart (W1: the console's setup).

:func:`~fermix.runtime.live_config.applied` is a pure rule; ``Runtime.reconfigure`` swaps
each service's settings whole: a review running while the route changes finishes on the
route it started with, the next one takes the new one, and the retention sweep's timer job
comes and goes with ``[fermix_core.retention]``.
"""

from __future__ import annotations

import dataclasses
import threading

from factories import StartMemory, config_for
from model_server import ModelServer

from fermix.config import (
    CompactionConfig,
    Config,
    MemoryConfig,
    ModelConfig,
    RetentionConfig,
    ServerConfig,
    StorageConfig,
)
from fermix.core.review import ReviewResult
from fermix.runtime.live_config import LIVE_KEYS, applied
from fermix.server.http.console import SETUP_KEYS


def test_w1_a_running_process_takes_the_live_keys_and_keeps_the_others_for_its_next_start() -> None:
    current = Config()
    new = Config(
        memory=MemoryConfig(review_interval_hours=0, review_workers=9, sweep_interval_s=1),
        compaction=CompactionConfig(enabled=False, threshold=0.5, workers=7),
        model=ModelConfig(primary="openai/other", timeout_s=5),
        retention=RetentionConfig(messages_days=30),
        server=ServerConfig(port=9999),
        storage=StorageConfig(url="postgresql://elsewhere/db"),
    )
    now = applied(current, new)
    assert now.memory.review_interval_hours == 0 and now.compaction.enabled is False
    assert now.compaction.threshold == 0.5 and now.model == new.model
    assert now.retention == new.retention
    # fixed at the start: pool sizes, the sweep's period, the server, the store
    assert now.memory.review_workers == current.memory.review_workers
    assert now.memory.sweep_interval_s == current.memory.sweep_interval_s
    assert now.compaction.workers == current.compaction.workers
    assert now.server == current.server and now.storage == current.storage


def test_w1_every_key_the_console_s_setup_edits_applies_live() -> None:
    assert set(SETUP_KEYS) <= LIVE_KEYS
    assert "fermix_core.server.port" not in LIVE_KEYS
    assert "fermix_core.storage.url" not in LIVE_KEYS


def test_w1_a_review_running_while_the_route_changes_finishes_on_its_own_route(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    """No torn config: the review that asked "first" is not switched to "second" halfway,
    and the next review asks "second"."""
    config = config_for(model_server, primary="openai/first")
    memory = start_memory(config)
    conv = memory.conversation("agent", "telegram", "1", owner_id="ana")
    conv.append_user("I'm Ana")
    release = threading.Event()
    model_server.hang(release)
    results: list[ReviewResult] = []
    running = threading.Thread(target=lambda: results.append(memory.review(conv)))
    running.start()
    try:
        assert model_server.wait_for_requests(1, timeout=30)
        second = dataclasses.replace(
            config, model=dataclasses.replace(config.model, primary="openai/second")
        )
        assert memory._reconfigure(second).model.primary == "openai/second"
    finally:
        release.set()
        running.join(60)
    (first,) = results
    assert first.status == "failed" and [m for m, _ in first.tried] == ["openai/first"]
    assert model_server.models == ["first"]

    model_server.reply_json({"operations": []})
    assert memory.review(conv).status in ("nothing", "applied")
    assert model_server.models == ["first", "second"]


def test_w1_retention_turned_on_and_off_live_starts_and_stops_its_timer_job(
    start_memory: StartMemory,
) -> None:
    memory = start_memory(Config())
    timer = memory._runtime.services.timer
    assert "retention" not in timer.jobs()
    on = Config(retention=RetentionConfig(messages_days=30))
    assert memory._reconfigure(on).retention.messages_days == 30
    assert "retention" in timer.jobs()
    assert memory._runtime.services.retention.enabled
    memory._reconfigure(Config())
    assert "retention" not in timer.jobs()
    assert not memory._runtime.services.retention.enabled
