"""``Telemetry``: what one process counts (O1) and traces (O2), for any monitoring stack.

One :class:`Telemetry` per ``Memory`` (the runtime's), handed by the composition root to
the write path, the group commit (as its :class:`~fermix.storage.leaders.CommitObserver`),
the reviews, the compactions and every model call (as :func:`fermix.llm.complete`'s
observer), so that storage and the model edge import nothing of it.

**Metrics.** Every path counts into plain Python series (:class:`Counter`,
:class:`Histogram`: a lock and a few numbers each), so an append imports nothing and costs a
clock read and an increment. ``prometheus_client`` is imported the first time someone asks
for :attr:`Telemetry.registry` (``Memory.metrics``, the server's ``GET /metrics``); that
registry reads the series through a custom collector, prometheus_client's own way of
exposing numbers kept elsewhere, so what was counted before is there too and the text
format is the library's. Label values are bounded: outcomes, model names from the config,
error classes; never an owner id or a chat id.

**Traces.** Off unless ``[fermix_core.tracing] enabled`` or a host hands its own
``TracerProvider`` (``Memory(tracer_provider=...)``); then OpenTelemetry (the ``otel``
extra) is imported and spans are made for an append, a compose, a review, a compaction, a
recall and each model call, with OpenTelemetry's GenAI attributes (``gen_ai.*``). Off,
:attr:`Telemetry.tracer` is None and each call site takes its one untraced branch.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fermix.config import TracingConfig
from fermix.errors import ConfigError, FermixError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from fermix.llm import Usage
    from fermix.storage.leaders import CommitStats

log = logging.getLogger(__name__)

Labels = tuple[str, ...]

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds of an append, a commit or a compose: tens of microseconds to seconds."""
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
"""Seconds of one model call, up to twice the default timeout."""

RECENT_WINDOW_S = 60.0
"""Seconds over which the status document gives the append and compose latency (W1, N7)."""
RECENT_KEEP = 4096
"""Values a latency window keeps at most (the newest): its quantiles stay cheap to read."""

OTEL_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""OpenTelemetry's standard variables naming where OTLP spans go."""
NO_OTEL = (
    "[fermix_core.tracing] enabled needs OpenTelemetry: pip install 'fermix[otel]'"
    " (opentelemetry-sdk and its OTLP/HTTP exporter)"
)


class Counter:
    """A monotonic count per label values; thread-safe."""

    __slots__ = ("_lock", "_values", "doc", "labels", "name")

    def __init__(self, name: str, doc: str, labels: Labels = ()) -> None:
        self.name = name
        """The Prometheus name without ``_total`` (the library adds it)."""
        self.doc = doc
        self.labels = labels
        self._lock = threading.Lock()
        self._values: dict[Labels, float] = {}

    def inc(self, values: Labels = (), n: float = 1.0) -> None:
        """Add ``n`` to the series of label ``values``."""
        with self._lock:
            self._values[values] = self._values.get(values, 0.0) + n

    def value(self, values: Labels = ()) -> float:
        """The count of label ``values`` (0 if never counted)."""
        with self._lock:
            return self._values.get(values, 0.0)

    def series(self) -> list[tuple[Labels, float]]:
        """Every label values and its count."""
        with self._lock:
            return list(self._values.items())


class Histogram:
    """Observations per label values in fixed buckets, with their sum; thread-safe.

    On the append path: one bisect and one lock per observation (a third of a microsecond).
    """

    __slots__ = ("_lock", "_series", "bounds", "doc", "labels", "name")

    def __init__(self, name: str, doc: str, bounds: Sequence[float], labels: Labels = ()) -> None:
        self.name = name
        self.doc = doc
        self.labels = labels
        self.bounds = tuple(bounds)
        self._lock = threading.Lock()
        self._series: dict[Labels, list[float]] = {}
        """Per label values: the count in each bucket (the one past the bounds is +Inf),
        then the sum of the values."""

    def observe(self, value: float, values: Labels = ()) -> None:
        """Count ``value`` in its bucket of label ``values``."""
        at = bisect.bisect_left(self.bounds, value)
        with self._lock:
            series = self._series.get(values)
            if series is None:
                series = self._series[values] = [0.0] * (len(self.bounds) + 2)
            series[at] += 1
            series[-1] += value

    def counts(self) -> list[tuple[Labels, float]]:
        """Every label values and how many values it observed (a counter of them)."""
        with self._lock:
            return [(values, sum(series[:-1])) for values, series in self._series.items()]

    def series(self) -> list[tuple[Labels, list[tuple[str, float]], float]]:
        """Every label values with its cumulative buckets (``le``, count) and sum."""
        with self._lock:
            copied = [(values, list(series)) for values, series in self._series.items()]
        out = []
        les = [*(repr(bound) for bound in self.bounds), "+Inf"]
        for values, series in copied:
            running, buckets = 0.0, []
            for le, n in zip(les, series[:-1], strict=True):
                running += n
                buckets.append((le, running))
            out.append((values, buckets, series[-1]))
        return out


class Recent:
    """The values observed over the last :data:`RECENT_WINDOW_S` seconds (the newest
    :data:`RECENT_KEEP` of them): their median and 99th percentile for the status document,
    where a histogram since the start would hide a recent slowdown.

    Adding is one clock read and one ``deque.append`` (atomic), no lock: it sits on the
    append path beside the histogram.
    """

    __slots__ = ("_clock", "_values", "window_s")

    def __init__(
        self,
        window_s: float = RECENT_WINDOW_S,
        keep: int = RECENT_KEEP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._values: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)

    def add(self, value: float) -> None:
        """Keep ``value``, observed now."""
        self._values.append((self._clock(), value))

    def summary(self) -> dict[str, float | int | None]:
        """``count``, ``p50_ms`` and ``p99_ms`` of the values of the window (None without
        any), in milliseconds, nearest rank."""
        since = self._clock() - self.window_s
        values = sorted(v for at, v in list(self._values) if at >= since)
        return {
            "count": len(values),
            "p50_ms": _rank(values, 0.50),
            "p99_ms": _rank(values, 0.99),
        }


def _rank(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` by nearest rank, in milliseconds."""
    if not values:
        return None
    index = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return round(values[index] * 1000, 3)


class Tally:
    """A counter read off a :class:`Histogram`: how many values each label values observed
    (the appends by outcome are their latency histogram's counts: one update per append)."""

    __slots__ = ("doc", "histogram", "name")

    def __init__(self, name: str, doc: str, histogram: Histogram) -> None:
        self.name = name
        self.doc = doc
        self.histogram = histogram


Read = Callable[[], float]
"""A gauge's or an external counter's reading, taken at each scrape."""


class Telemetry:
    """The metrics and the tracer of one process's services (see the module's docstring).

    ``tracing`` is ``[fermix_core.tracing]``; ``tracer_provider`` (an OpenTelemetry
    ``TracerProvider``, the host's own) turns tracing on whatever the config says. Raises
    :class:`~fermix.errors.ConfigError` when tracing is asked for and OpenTelemetry is not
    installed.
    """

    def __init__(
        self, tracing: TracingConfig | None = None, *, tracer_provider: Any | None = None
    ) -> None:
        self.append_seconds = Histogram(
            "fermix_append_seconds",
            "Seconds from an append's call to its commit, by outcome.",
            LATENCY_BUCKETS,
            ("outcome",),
        )
        self.appends = Tally(
            "fermix_appends",
            "Messages appended, by outcome (stored, replayed, failed).",
            self.append_seconds,
        )
        self.storage_retries = Counter(
            "fermix_storage_retries",
            "Write batches that failed with an error that can pass and were tried again.",
        )
        self.storage_errors = Counter(
            "fermix_storage_errors", "Writes not kept: their batch failed for good."
        )
        self.compose_seconds = Histogram(
            "fermix_compose_seconds",
            "Seconds to compose a prompt (files and window).",
            LATENCY_BUCKETS,
        )
        self.reviews = Counter(
            "fermix_reviews",
            "Reviews by outcome (applied, nothing, failed, skipped).",
            ("outcome",),
        )
        self.compactions = Counter(
            "fermix_compactions",
            "Compactions by outcome (compacted, skipped, failed).",
            ("outcome",),
        )
        self.recalls = Counter(
            "fermix_recalls", "Recalls of memory rows, by who asked (tool, host).", ("source",)
        )
        self.model_calls = Counter(
            "fermix_model_calls",
            "Model calls (one per model tried), by model, agent and outcome.",
            ("model", "agent", "outcome"),
        )
        self.model_failures = Counter(
            "fermix_model_failures",
            "Failed model calls by model, agent and error class.",
            ("model", "agent", "error"),
        )
        self.model_seconds = Histogram(
            "fermix_model_call_seconds",
            "Seconds of one model call, by model and agent.",
            MODEL_BUCKETS,
            ("model", "agent"),
        )
        self.recent_appends = Recent()
        """The appends of the last minute, whatever their outcome (the status document)."""
        self.recent_composes = Recent()
        """The composes of the last minute (the status document)."""
        self.model_tokens = Counter(
            "fermix_model_tokens",
            "Tokens the models reported, by model, agent and direction.",
            ("model", "agent", "direction"),
        )
        self._registry: CollectorRegistry | None = None
        self._commit_stats: Callable[[], CommitStats] | None = None
        self._gauges: dict[str, tuple[str, Read]] = {}
        self._external: dict[str, tuple[str, Read]] = {}
        self._lock = threading.Lock()
        self._own_provider: Any | None = None
        self.tracer: Any | None = None
        """The OpenTelemetry tracer of fermix's spans; None when tracing is off."""
        config = tracing if tracing is not None else TracingConfig()
        if tracer_provider is not None or config.enabled:
            self.tracer = self._make_tracer(config, tracer_provider)

    # -- what the runtime counts ---------------------------------------------------------

    def gauge(self, name: str, doc: str, read: Read) -> None:
        """Expose ``read()`` as gauge ``name`` at each scrape (a queue depth, live actors)."""
        with self._lock:
            self._gauges[name] = (doc, read)

    def counted(self, name: str, doc: str, read: Read) -> None:
        """Expose ``read()``, a count kept elsewhere, as counter ``name`` (without ``_total``)."""
        with self._lock:
            self._external[name] = (doc, read)

    def appended(self, outcome: str, seconds: float) -> None:
        """One append ended: ``stored``, ``replayed`` or ``failed``, after ``seconds``."""
        self.append_seconds.observe(seconds, (outcome,))
        self.recent_appends.add(seconds)

    def composed(self, seconds: float) -> None:
        """One compose took ``seconds``."""
        self.compose_seconds.observe(seconds)
        self.recent_composes.add(seconds)

    def latency(self) -> dict[str, Any]:
        """The append and compose latency of the last :data:`RECENT_WINDOW_S` seconds:
        their count, median and 99th percentile in milliseconds (the status document)."""
        return {
            "window_s": RECENT_WINDOW_S,
            "append": self.recent_appends.summary(),
            "compose": self.recent_composes.summary(),
        }

    def commits_from(self, read: Callable[[], CommitStats]) -> None:
        """Expose the group commit's own counts at each scrape: commits, their batch sizes
        (a histogram) and the writes queued behind it (a gauge)."""
        self._commit_stats = read

    # CommitObserver (fermix.storage.leaders): the group commit's retries and failures.

    def retried(self) -> None:
        """A batch is tried again after an error that can pass."""
        self.storage_retries.inc()

    def failed(self, units: int) -> None:
        """A batch of ``units`` writes failed for good."""
        self.storage_errors.inc(n=units)

    # CallObserver (fermix.llm): each model tried.

    def attempt(self, agent: str, model: str) -> ModelAttempt:
        """One model call about to be made: a span when tracing, and its metrics at end."""
        return ModelAttempt(self, agent, model)

    # -- spans ---------------------------------------------------------------------------

    def span(
        self, name: str, attributes: Mapping[str, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """A current span ``name`` (None inside when tracing is off: a shared no-op)."""
        if self.tracer is None:
            return _NO_SPAN
        return self.tracer.start_as_current_span(name, attributes=dict(attributes))  # type: ignore[no-any-return]

    # -- exposition ----------------------------------------------------------------------

    @property
    def registry(self) -> CollectorRegistry:
        """A prometheus-client ``CollectorRegistry`` of these metrics (``Memory.metrics``),
        made on first use, the same one after: an embedded host serves it with its own
        exporter, the server at ``GET /metrics``."""
        with self._lock:
            if self._registry is None:
                from prometheus_client import CollectorRegistry

                registry = CollectorRegistry(auto_describe=False)
                registry.register(_Collector(self))
                self._registry = registry
            return self._registry

    def readings(self) -> Iterator[tuple[str, str, str, float]]:
        """Each gauge and external counter read now: kind, name, doc, value. A reading
        that fails (the store closed under a scrape) is left out and logged."""
        with self._lock:
            taken = [("gauge", n, d, r) for n, (d, r) in self._gauges.items()]
            taken += [("counter", n, d, r) for n, (d, r) in self._external.items()]
        for kind, name, doc, read in taken:
            try:
                yield kind, name, doc, float(read())
            except (FermixError, OSError) as exc:
                log.warning("metric %s not read: %s", name, exc)

    def commit_families(self) -> Iterator[Any]:
        """The group commit's counts as metric families (see :meth:`commits_from`)."""
        read = self._commit_stats
        if read is None:
            return
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        try:
            stats = read()
        except (FermixError, OSError) as exc:
            log.warning("commit metrics not read: %s", exc)
            return
        yield CounterMetricFamily(
            "fermix_commits", "Write transactions the group commit committed.", stats.commits
        )
        running, buckets = 0, []
        for slot, n in enumerate(stats.sizes[:-1]):
            running += n
            buckets.append((repr(float(2**slot)), float(running)))
        buckets.append(("+Inf", float(running + stats.sizes[-1])))
        yield HistogramMetricFamily(
            "fermix_commit_batch_size",
            "Writes committed together in one transaction by the group commit.",
            buckets=buckets,
            sum_value=float(stats.units),
        )
        yield GaugeMetricFamily(
            "fermix_write_queue_depth",
            "Writes waiting behind the group commit's running batch.",
            stats.queued,
        )

    def close(self) -> None:
        """Send the spans still buffered by a provider this made itself, and stop it."""
        provider, self._own_provider = self._own_provider, None
        if provider is not None:
            provider.shutdown()

    # -- the tracer ----------------------------------------------------------------------

    def _make_tracer(self, config: TracingConfig, provider: Any | None) -> Any:
        """The tracer: of ``provider`` when given; else of a provider exporting over OTLP/HTTP
        to ``otlp_endpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables; else of the global
        provider (a host that set up OpenTelemetry itself)."""
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ConfigError(NO_OTEL) from exc
        if provider is None:
            if config.otlp_endpoint is not None or any(
                os.environ.get(v) for v in OTEL_ENDPOINT_VARIABLES
            ):
                provider = self._own_provider = _otlp_provider(config)
            else:
                provider = trace.get_tracer_provider()
        return provider.get_tracer("fermix", _version())


def _otlp_provider(config: TracingConfig) -> Any:
    """A TracerProvider batching spans to OTLP/HTTP (``<endpoint>/v1/traces``)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(NO_OTEL) from exc
    endpoint = config.otlp_endpoint
    exporter = OTLPSpanExporter(
        endpoint=None if endpoint is None else endpoint.rstrip("/") + "/v1/traces"
    )
    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class ModelAttempt:
    """One model call under way (:meth:`Telemetry.attempt`): its span and its clock."""

    __slots__ = ("_agent", "_model", "_span", "_started", "_telemetry")

    def __init__(self, telemetry: Telemetry, agent: str, model: str) -> None:
        self._telemetry = telemetry
        self._agent = agent
        self._model = model if model.isascii() else _utf8(model)
        self._span: Any | None = None
        tracer = telemetry.tracer
        if tracer is not None:
            from opentelemetry.trace import SpanKind

            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": self._model,
                "gen_ai.agent.name": agent,
            }
            if "/" in self._model:
                attributes["gen_ai.provider.name"] = self._model.split("/", 1)[0]
            self._span = tracer.start_span(
                f"chat {self._model}", kind=SpanKind.CLIENT, attributes=attributes
            )
        self._started = time.perf_counter()

    def succeeded(self, usage: Usage, finish_reason: str | None) -> None:
        """The model answered, reporting ``usage``."""
        t = self._telemetry
        seconds = time.perf_counter() - self._started
        labels = (self._model, self._agent)
        t.model_calls.inc((*labels, "ok"))
        t.model_seconds.observe(seconds, labels)
        t.model_tokens.inc((*labels, "input"), usage.prompt_tokens)
        t.model_tokens.inc((*labels, "output"), usage.completion_tokens)
        span = self._span
        if span is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            if finish_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
            span.end()

    def failed(self, error: str) -> None:
        """The call failed with an error of class ``error``."""
        t = self._telemetry
        seconds = time.perf_counter() - self._started
        labels = (self._model, self._agent)
        t.model_calls.inc((*labels, "failed"))
        t.model_failures.inc((*labels, error))
        t.model_seconds.observe(seconds, labels)
        span = self._span
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
            span.end()


class _Collector:
    """prometheus-client's custom collector over a :class:`Telemetry`'s series."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        t = self._telemetry
        for metric in vars(t).values():
            if isinstance(metric, Counter):
                family = CounterMetricFamily(metric.name, metric.doc, labels=metric.labels)
                series = metric.series() or ([] if metric.labels else [((), 0.0)])
                for values, value in series:
                    family.add_metric(_labels(values), value)
                yield family
            elif isinstance(metric, Tally):
                family = CounterMetricFamily(
                    metric.name, metric.doc, labels=metric.histogram.labels
                )
                counts = metric.histogram.counts()
                for values, value in counts or ([] if metric.histogram.labels else [((), 0.0)]):
                    family.add_metric(_labels(values), value)
                yield family
            elif isinstance(metric, Histogram):
                histogram = HistogramMetricFamily(metric.name, metric.doc, labels=metric.labels)
                for values, buckets, total in metric.series():
                    histogram.add_metric(_labels(values), buckets, total)
                yield histogram
        yield from t.commit_families()
        for kind, name, doc, value in t.readings():
            yield (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
                name, doc, value=value
            )


def _labels(values: Labels) -> list[str]:
    """Label values as the text format can carry them: a lone surrogate would fail the whole
    scrape's UTF-8 encoding, so it becomes ``?`` (model names are made so when counted)."""
    return [v if v.isascii() else _utf8(v) for v in values]


def _utf8(text: str) -> str:
    """``text`` with what UTF-8 cannot carry (a lone surrogate) as ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


_NO_SPAN: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
"""What :meth:`Telemetry.span` returns when tracing is off (reentrant, shared)."""


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fermix")
    except metadata.PackageNotFoundError:
        return "unknown"
