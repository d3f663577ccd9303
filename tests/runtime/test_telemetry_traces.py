"""OpenTelemetry spans of a Memory (O2): the SDK's in-memory exporter, and OTLP over HTTP.

A host hands its own ``TracerProvider`` (``Memory(tracer_provider=...)``) or sets
``[fermix_core.tracing] enabled`` with an ``otlp_endpoint``; the spans carry OpenTelemetry's
GenAI attributes, and the reviewer's model calls are tagged ``memory_reviewer``, nested in
the review's span. Real Memory, real SQLite, the loopback model server.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from factories import StartMemory, config_for
from model_server import ModelServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from fermix.config import Config, EmbeddingConfig, TracingConfig
from fermix.errors import ConfigError
from fermix.runtime.telemetry import Telemetry


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_o2_an_append_and_a_compose_each_make_a_span(
    start_memory: StartMemory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    memory = start_memory(
        Config(embedding=EmbeddingConfig(enabled=False)), tracer_provider=provider
    )
    conv = memory.conversation("bot", "telegram", "1", owner_id="alice")
    conv.append_user("hello")
    conv.compose("You are kind.")

    (append,) = named(exporter, "fermix.append")
    assert append.attributes is not None
    assert append.attributes["fermix.agent_id"] == "bot"
    assert append.attributes["fermix.channel"] == "telegram"
    assert append.attributes["fermix.message.role"] == "user"
    assert append.attributes["fermix.replayed"] is False
    (compose,) = named(exporter, "fermix.compose")
    assert compose.end_time is not None and compose.start_time is not None
    assert compose.end_time >= compose.start_time


def test_o2_a_review_span_holds_its_model_call_with_gen_ai_attributes(
    start_memory: StartMemory,
    model_server: ModelServer,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    memory = start_memory(config_for(model_server), tracer_provider=provider)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("I moved to Porto")
    model_server.reply_json({"operations": []})
    memory.review(conv)

    (review,) = named(exporter, "invoke_agent memory_reviewer")
    (call,) = named(exporter, "chat openai/test")
    assert review.attributes is not None and call.attributes is not None
    assert review.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert review.attributes["gen_ai.agent.name"] == "memory_reviewer"
    assert review.attributes["fermix.outcome"] == "nothing"
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["gen_ai.request.model"] == "openai/test"
    assert call.attributes["gen_ai.provider.name"] == "openai"
    assert call.attributes["gen_ai.agent.name"] == "memory_reviewer"
    assert call.attributes["gen_ai.usage.input_tokens"] > 0  # type: ignore[operator]
    assert call.attributes["gen_ai.usage.output_tokens"] > 0  # type: ignore[operator]
    assert call.parent is not None and review.context is not None
    assert call.parent.span_id == review.context.span_id
    assert call.status.status_code is not StatusCode.ERROR


def test_o2_a_failed_model_call_is_an_error_span_naming_its_error_class(
    start_memory: StartMemory,
    model_server: ModelServer,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    memory = start_memory(config_for(model_server), tracer_provider=provider)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    conv.append_user("I moved to Porto")
    model_server.fail(500)
    assert memory.review(conv).status == "failed"
    (call,) = named(exporter, "chat openai/test")
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes is not None
    assert str(call.attributes["error.type"]).endswith("Error")
    (review,) = named(exporter, "invoke_agent memory_reviewer")
    assert review.attributes is not None and review.attributes["fermix.outcome"] == "failed"


def test_o2_a_compaction_and_its_model_call_make_spans(
    start_memory: StartMemory,
    model_server: ModelServer,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    memory = start_memory(config_for(model_server, context_window=8_000), tracer_provider=provider)
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    for n in range(12):
        conv.append_user(f"message {n}: " + "words " * 150)
        conv.append_assistant(f"answer {n}: " + "more " * 150)
    model_server.reply("A short summary of the talk so far.")
    result = memory.compact(conv, force=True)

    (compaction,) = [
        s
        for s in named(exporter, "invoke_agent compactor")
        if s.attributes is not None and s.attributes["fermix.forced"] is True
    ]
    assert compaction.attributes is not None
    assert compaction.attributes["fermix.outcome"] == result.status
    assert result.status == "compacted", result
    (call,) = named(exporter, "chat openai/test")
    assert call.attributes is not None and call.attributes["gen_ai.agent.name"] == "compactor"
    assert call.parent is not None and compaction.context is not None
    assert call.parent.span_id == compaction.context.span_id


def test_o2_a_recall_by_the_host_and_by_the_memory_tool_each_make_a_span(
    start_memory: StartMemory, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    memory = start_memory(
        Config(embedding=EmbeddingConfig(enabled=False)), tracer_provider=provider
    )
    memory.recall_rows("porto", agent_id="bot")
    conv = memory.conversation("bot", "cli", "1", owner_id="alice")
    call = {"id": "c1", "function": {"name": "memory_recall", "arguments": '{"query": "porto"}'}}
    assert "error" not in json.loads(memory.tools.run(call, conv))
    sources = sorted(
        str((s.attributes or {})["fermix.source"]) for s in named(exporter, "fermix.recall")
    )
    assert sources == ["host", "tool"]


def test_o2_no_span_attribute_carries_an_owner_id_or_a_chat_id(
    start_memory: StartMemory,
    model_server: ModelServer,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    memory = start_memory(config_for(model_server), tracer_provider=provider)
    conv = memory.conversation("bot", "cli", "chat-4242", owner_id="owner-secret-77")
    conv.append_user("hello")
    conv.compose("sys")
    model_server.reply_json({"operations": []})
    memory.review(conv)
    spans = exporter.get_finished_spans()
    assert len(spans) >= 4
    shown = " ".join(f"{s.name} {dict(s.attributes or {})}" for s in spans)
    assert "chat-4242" not in shown
    assert "owner-secret-77" not in shown


def test_o2_tracing_off_makes_no_tracer() -> None:
    assert Telemetry(TracingConfig()).tracer is None


def test_o2_tracing_asked_for_without_opentelemetry_is_a_config_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if the extra were missing
    with pytest.raises(ConfigError, match=r"fermix\[otel\]"):
        Telemetry(TracingConfig(enabled=True))


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each POST's path and body."""

    received: list[tuple[str, bytes]]
    arrived: threading.Event

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.received.append((self.path, body))
        self.arrived.set()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def collector() -> Iterator[tuple[str, type[_Collector]]]:
    handler = type("Handler", (_Collector,), {"received": [], "arrived": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_o2_configured_tracing_exports_the_spans_over_otlp_http(
    start_memory: StartMemory, home: Path, collector: tuple[str, type[_Collector]]
) -> None:
    url, handler = collector
    config = Config(
        embedding=EmbeddingConfig(enabled=False),
        tracing=TracingConfig(enabled=True, otlp_endpoint=url, service_name="fermix-test"),
    )
    memory = start_memory(config)
    memory.conversation("bot", "cli", "1", owner_id="alice").append_user("hello")
    memory.close()  # flushes the batch of spans
    assert handler.arrived.wait(10)
    paths = {path for path, _ in handler.received}
    assert paths == {"/v1/traces"}
    names, services = set(), set()
    for _, body in handler.received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope in resource_spans.scope_spans:
                names |= {span.name for span in scope.spans}
    assert "fermix.append" in names
    assert services == {"fermix-test"}


def test_o2_without_an_endpoint_the_standard_otel_variables_say_where_spans_go(
    start_memory: StartMemory,
    collector: tuple[str, type[_Collector]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, handler = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    config = Config(embedding=EmbeddingConfig(enabled=False), tracing=TracingConfig(enabled=True))
    memory = start_memory(config)
    memory.conversation("bot", "cli", "1", owner_id="alice").append_user("hello")
    memory.close()
    assert handler.arrived.wait(10)
    assert {path for path, _ in handler.received} == {"/v1/traces"}
