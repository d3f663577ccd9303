"""``Memory.metrics``: the embedded host's Prometheus registry (O1).

Each test works a real Memory on a real SQLite home (and the loopback model server where a
model is called), renders the registry with prometheus_client's own ``generate_latest`` and
parses it back with the library's parser: what fermix did is what the counters say.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import apsw
import pytest
from factories import StartMemory, config_for
from faults import FaultVFS
from model_server import ModelServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fermix.api import Memory
from fermix.config import Config, EmbeddingConfig, validate_key
from fermix.errors import ConfigError, WriteFailedError
from fermix.runtime.telemetry import Counter, Histogram, Recent, Telemetry

QUIET = Config(embedding=EmbeddingConfig(enabled=False))
"""No embedder: these tests count appends, not the background vectors."""
_vfs = FaultVFS("fermix-faulty-telemetry")


def samples(memory: Memory) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``memory.metrics`` as parsed by prometheus_client's parser."""
    text = generate_latest(memory.metrics).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of ``name`` over every series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in found.items() if n == name and want <= set(lab))


def test_o1_appends_and_their_commits_are_counted_in_the_embedded_registry(
    start_memory: StartMemory,
) -> None:
    memory = start_memory(QUIET)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    before = samples(memory)
    for n in range(7):
        conv.append_user(f"message {n}")
    after = samples(memory)

    assert (
        value(after, "fermix_appends_total", outcome="stored")
        - value(before, "fermix_appends_total", outcome="stored")
        == 7
    )
    assert (
        value(after, "fermix_append_seconds_count", outcome="stored")
        - value(before, "fermix_append_seconds_count", outcome="stored")
        == 7
    )
    assert total(after, "fermix_append_seconds_sum") > total(before, "fermix_append_seconds_sum")
    commits = value(after, "fermix_commits_total") - value(before, "fermix_commits_total")
    units = value(after, "fermix_commit_batch_size_sum") - value(
        before, "fermix_commit_batch_size_sum"
    )
    assert units >= 7  # every append was a unit of a committed batch
    assert 1 <= commits <= units
    assert value(after, "fermix_commit_batch_size_bucket", le="+Inf") == value(
        after, "fermix_commit_batch_size_count"
    )
    assert value(after, "fermix_storage_errors_total") == 0


def test_o1_a_replayed_client_key_is_counted_as_replayed_not_stored(
    start_memory: StartMemory,
) -> None:
    memory = start_memory(QUIET)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("hello", client_key="k-1")
    conv.append_user("hello", client_key="k-1")
    found = samples(memory)
    assert value(found, "fermix_appends_total", outcome="stored") == 1
    assert value(found, "fermix_appends_total", outcome="replayed") == 1


def test_o1_compose_latency_and_live_conversation_actors_are_exposed(
    start_memory: StartMemory,
) -> None:
    memory = start_memory(QUIET)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("hello")
    conv.compose("You are kind.")
    conv.compose("You are kind.")
    found = samples(memory)
    assert value(found, "fermix_compose_seconds_count") == 2
    assert value(found, "fermix_live_conversations") >= 1  # compose read the window from it
    assert ("fermix_write_queue_depth", ()) in found
    assert value(found, "fermix_review_queue_depth") == 0
    assert value(found, "fermix_compaction_queue_depth") == 0
    assert value(found, "fermix_vectors_pending") == 0  # embedding off


def test_o1_reviews_and_model_calls_are_counted_by_outcome_and_model(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server))
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("I moved to Porto")
    model_server.reply_json({"operations": []})
    assert memory.review(conv).status == "nothing"
    conv.append_user("and I am a nurse")
    model_server.fail(500)
    assert memory.review(conv).status == "failed"

    found = samples(memory)
    assert value(found, "fermix_reviews_total", outcome="nothing") == 1
    assert value(found, "fermix_reviews_total", outcome="failed") == 1
    labels = {"model": "openai/test", "agent": "memory_reviewer"}
    assert value(found, "fermix_model_calls_total", **labels, outcome="ok") == 1
    assert value(found, "fermix_model_calls_total", **labels, outcome="failed") == 1
    assert total(found, "fermix_model_failures_total", **labels) == 1
    assert value(found, "fermix_model_call_seconds_count", **labels) == 2
    assert value(found, "fermix_model_tokens_total", **labels, direction="input") > 0
    assert value(found, "fermix_model_tokens_total", **labels, direction="output") > 0


def test_o1_compactions_are_counted_by_outcome(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server, context_window=100_000))
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("hello")
    result = memory.compact(conv)  # far under the threshold: skipped
    assert result.status == "skipped"
    found = samples(memory)
    assert value(found, "fermix_compactions_total", outcome="skipped") >= 1


def test_o1_no_label_carries_an_owner_id_or_a_chat_id(
    start_memory: StartMemory, model_server: ModelServer
) -> None:
    memory = start_memory(config_for(model_server))
    conv = memory.conversation("bot", "cli", "chat-4242", owner_id="owner-secret-77")
    conv.append_user("hello")
    model_server.reply_json({"operations": []})
    memory.review(conv)
    conv.compose("sys")
    text = generate_latest(memory.metrics).decode()
    assert "fermix_appends_total" in text
    assert "chat-4242" not in text
    assert "owner-secret-77" not in text


def test_o1_h3_storage_retries_and_writes_lost_for_good_are_counted(
    start_memory: StartMemory,
) -> None:
    memory = start_memory(QUIET, vfs=_vfs.vfs_name)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("before")
    _vfs.plan.fail("write", times=2, error=apsw.IOError, suffix="-wal")
    conv.append_user("after two faults")
    found = samples(memory)
    assert value(found, "fermix_storage_retries_total") >= 1
    assert value(found, "fermix_storage_errors_total") == 0
    assert value(found, "fermix_appends_total", outcome="stored") == 2

    _vfs.plan.fail("write", times=None, error=apsw.IOError, suffix="-wal")
    try:
        with pytest.raises(WriteFailedError):
            conv.append_user("lost")
    finally:
        _vfs.plan.clear()
    found = samples(memory)
    assert value(found, "fermix_storage_errors_total") >= 1
    assert value(found, "fermix_appends_total", outcome="failed") == 1
    assert value(found, "fermix_appends_total", outcome="stored") == 2


def test_o1_the_registry_is_one_per_memory(start_memory: StartMemory, tmp_path: Path) -> None:
    first = start_memory(QUIET)
    second = start_memory(QUIET, home=tmp_path / "other")
    first.conversation("bot", "cli", "1", owner_id="a").append_user("one")
    assert first.metrics is first.metrics
    assert first.metrics is not second.metrics
    assert value(samples(first), "fermix_appends_total", outcome="stored") == 1
    assert value(samples(second), "fermix_appends_total", outcome="stored") == 0


def test_o1_counters_and_histograms_keep_their_series_apart() -> None:
    """The plain series behind the registry: labels apart, buckets cumulative."""
    counter = Counter("c", "doc", ("outcome",))
    counter.inc(("ok",))
    counter.inc(("ok",), 2)
    counter.inc(("failed",))
    assert sorted(counter.series()) == [(("failed",), 1.0), (("ok",), 3.0)]
    histogram = Histogram("h", "doc", (1.0, 2.0))
    for observed in (0.5, 1.0, 1.5, 9.0):
        histogram.observe(observed)
    ((labels, buckets, total_),) = histogram.series()
    assert labels == ()
    assert buckets == [("1.0", 2), ("2.0", 3), ("+Inf", 4)]
    assert total_ == 12.0


def test_o1_a_metrics_token_hash_that_is_not_a_sha256_is_refused_by_its_key() -> None:
    with pytest.raises(ConfigError, match="metrics_token_sha256"):
        validate_key("fermix_core.server.metrics_token_sha256", "my-plain-secret")
    good = "a" * 64
    assert validate_key("fermix_core.server.metrics_token_sha256", good) == good


@pytest.mark.slow  # a fresh python importing fermix
def test_o1_o2_a_memory_that_appends_imports_neither_prometheus_nor_opentelemetry(
    home: Path,
) -> None:
    """Counting needs no import: prometheus_client comes with the first look at the
    registry, OpenTelemetry only when tracing is configured."""
    code = textwrap.dedent(
        f"""
        import sys
        from fermix import Memory
        from fermix.config import Config, EmbeddingConfig
        with Memory({str(home)!r}, config=Config(embedding=EmbeddingConfig(enabled=False))) as m:
            m.conversation("bot", "cli", "1", owner_id="a").append_user("hi")
            loaded = sorted(n for n in sys.modules if n.split(".")[0] in
                            ("prometheus_client", "opentelemetry"))
            print("before:", loaded)
            m.metrics
            print("after:", "prometheus_client" in sys.modules, "opentelemetry" in sys.modules)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "before: []" in run.stdout
    assert "after: True False" in run.stdout


def test_o1_hostile_label_values_and_texts_survive_the_text_format() -> None:
    """A model name is the config's (or the code's) and an error class the library's, but
    whatever they hold, the exposition stays parseable and each value intact, but for a
    lone surrogate, which UTF-8 cannot carry: it becomes ``?``."""
    from hostile_data import TEXTS
    from prometheus_client import CollectorRegistry

    from fermix.llm import Usage

    telemetry = Telemetry()
    names = [text for text in TEXTS if text and len(text) < 2000]
    for name in names:
        telemetry.attempt("memory_reviewer", name).succeeded(Usage(3, 4, 7), "stop")
    registry: CollectorRegistry = telemetry.registry
    parsed = {
        s.labels["model"]: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        if family.name == "fermix_model_calls"
        for s in family.samples
    }
    shown = [name.encode("utf-8", "replace").decode("utf-8") for name in names]
    assert parsed == {name: float(shown.count(name)) for name in shown}
    assert any(name != text for name, text in zip(shown, names, strict=True))  # one had one


def test_w1_the_recent_latency_is_the_last_window_s_median_and_99th_percentile() -> None:
    """W1, N7: the status document's latency is the last minute's, by nearest rank, so a
    slowdown shows at once instead of being averaged into everything since the start."""
    now = [1000.0]
    recent = Recent(window_s=60, keep=1000, clock=lambda: now[0])
    assert recent.summary() == {"count": 0, "p50_ms": None, "p99_ms": None}
    for _ in range(100):
        recent.add(5.0)  # slow, and a minute old soon
    now[0] += 61
    for n in range(1, 101):
        recent.add(n / 1000)  # 1 ms .. 100 ms
    assert recent.summary() == {"count": 100, "p50_ms": 50.0, "p99_ms": 99.0}
    now[0] += 61
    assert recent.summary()["count"] == 0


def test_w1_the_newest_values_are_kept_when_a_window_overflows() -> None:
    recent = Recent(window_s=60, keep=10, clock=lambda: 0.0)
    for n in range(1, 21):
        recent.add(n / 1000)
    assert recent.summary() == {"count": 10, "p50_ms": 15.0, "p99_ms": 20.0}


def test_w1_appends_and_composes_feed_the_latency_of_memory_stats(
    start_memory: StartMemory,
) -> None:
    memory = start_memory(Config())
    conv = memory.conversation("agent", "telegram", "1", owner_id="ana")
    for n in range(3):
        conv.append_user(f"message {n}")
    conv.compose(system="be brief")
    latency = memory.stats()["latency"]
    assert latency["append"]["count"] == 3 and latency["compose"]["count"] == 1
    assert 0 < latency["append"]["p50_ms"] <= latency["append"]["p99_ms"]
