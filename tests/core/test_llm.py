"""Model access through litellm over real loopback HTTP (E4, E7, K2, H1, H3)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer, text_reply

from fermix.config import ModelConfig
from fermix.errors import ModelError
from fermix.llm import (
    LLM_BUFFERED,
    NO_MODEL_HINT,
    Completion,
    ModelRequestError,
    ModelUnavailableError,
    Route,
    TimeoutPolicy,
    call_name,
    complete,
    context_window,
)

HELLO = [{"role": "user", "content": "hello"}]


def route_to(server: ModelServer, *models: str, timeout_s: float = 5.0) -> Route:
    """A route to the loopback server with a test-sized ``llm_buffered`` timeout."""
    cfg = ModelConfig(
        primary=models[0], fallbacks=models[1:], api_base=server.url, timeout_s=timeout_s
    )
    return Route.from_config(cfg)


def llm_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fermix.llm"]


# -- routes and policies (no litellm) --------------------------------------------------


def test_e7_a_route_from_config_carries_the_llm_buffered_policy_with_its_timeout() -> None:
    route = Route.from_config(
        ModelConfig(primary="openai/a", fallbacks=("openai/b",), api_key_env="KEY", timeout_s=7)
    )
    assert route.models == ("openai/a", "openai/b")
    assert route.api_key_env == "KEY"
    assert route.policy == TimeoutPolicy(name="llm_buffered", timeout_s=7.0)
    assert LLM_BUFFERED.name == "llm_buffered"
    assert LLM_BUFFERED.timeout_s == ModelConfig().timeout_s


def test_h2_a_command_line_model_replaces_the_configured_chain() -> None:
    cfg = ModelConfig(primary="openai/a", fallbacks=("openai/b",), api_base="http://x/v1")
    assert Route.from_config(cfg, model="llama3", api_base="http://y/v1") == Route(
        ("llama3",), "http://y/v1", None, LLM_BUFFERED.configured(cfg)
    )
    assert Route.from_config(cfg, model="m", fallbacks=["f"]).models == ("m", "f")
    assert Route.from_config(cfg, fallbacks=["f"]).models == ("openai/a", "f")
    assert Route.from_config(ModelConfig()).primary is None


def test_h2_an_overridden_api_base_is_not_sent_the_configured_key() -> None:
    cfg = ModelConfig(primary="m", api_base="http://x/v1", api_key_env="KEY")
    assert Route.from_config(cfg).api_key_env == "KEY"
    assert Route.from_config(cfg, api_base="http://x/v1").api_key_env == "KEY"
    assert Route.from_config(cfg, api_base="http://evil/v1").api_key_env is None


def test_e4_a_model_sent_to_an_api_base_without_a_provider_gets_openai_prefixed() -> None:
    providers = ["openai", "ollama", "anthropic"]
    assert call_name("llama3", "http://x/v1", providers) == "openai/llama3"
    assert call_name("meta-llama/L-3", "http://x/v1", providers) == "openai/meta-llama/L-3"
    assert call_name("ollama/llama3", "http://x/v1", providers) == "ollama/llama3"
    assert call_name("gpt-4o-mini", None, providers) == "gpt-4o-mini"


def test_k1_the_configured_context_window_wins_over_litellm_s_table() -> None:
    assert context_window(Route(("openai/gpt-4o-mini",)), override=4096) == 4096
    assert context_window(None) is None


# -- calls over loopback HTTP ----------------------------------------------------------


def test_e4_a_plain_completion_returns_the_answer_with_its_usage(
    model_server: ModelServer,
) -> None:
    model_server.reply("hi there", prompt_tokens=321)
    result = complete(route_to(model_server, "llama3"), HELLO, agent="chat")
    assert isinstance(result, Completion)
    assert (result.content, result.model, result.tried) == ("hi there", "llama3", ())
    assert result.usage.prompt_tokens == 321
    assert result.usage.total_tokens == 321 + result.usage.completion_tokens
    assert result.finish_reason == "stop"
    assert result.tool_calls == []
    assert result.latency_ms > 0
    (sent,) = model_server.requests
    assert sent["model"] == "llama3"  # sent as openai/llama3, the prefix is litellm's
    assert sent["messages"] == HELLO
    assert "reasoning_effort" not in sent and "response_format" not in sent
    assert model_server.headers[0]["authorization"] == "Bearer sk-no-key"


def test_e4_a_model_name_with_a_slash_but_no_provider_still_reaches_the_api_base(
    model_server: ModelServer,
) -> None:
    complete(route_to(model_server, "meta-llama/Llama-3-8B"), HELLO, agent="chat")
    assert model_server.models == ["meta-llama/Llama-3-8B"]


def test_e4_the_api_key_comes_from_the_variable_named_by_api_key_env(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = Route(("llama3",), model_server.url, api_key_env="FERMIX_TEST_KEY")
    monkeypatch.delenv("FERMIX_TEST_KEY", raising=False)
    with pytest.raises(ModelError, match="FERMIX_TEST_KEY"):
        complete(route, HELLO, agent="chat")
    monkeypatch.setenv("FERMIX_TEST_KEY", "sk-secret")
    complete(route, HELLO, agent="chat")
    assert model_server.headers[-1]["authorization"] == "Bearer sk-secret"


def test_e4_when_the_primary_answers_500_the_fallback_answers_and_the_trace_names_both(
    model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model_server.fail(500, for_model="primary")
    model_server.reply("from the fallback", for_model="backup")
    with caplog.at_level(logging.INFO, logger="fermix.llm"):
        result = complete(route_to(model_server, "primary", "backup"), HELLO, agent="reviewer")
    assert result.content == "from the fallback"
    assert result.model == "backup"
    assert result.tried == (("primary", "InternalServerError"),)
    assert model_server.models == ["primary", "backup"]
    (line,) = llm_lines(caplog)
    assert line.levelno == logging.INFO
    text = line.getMessage()
    assert "outcome=ok" in text and "model=backup" in text
    assert "tried=primary:InternalServerError" in text
    assert line.llm["agent"] == "reviewer"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "status, error_body",
    [
        (429, None),
        (502, None),
        (503, None),
        (400, {"error": {"message": "This model's maximum context length is 8192 tokens."}}),
    ],
    ids=["rate-limit", "bad-gateway", "unavailable", "context-window-exceeded"],
)
def test_e4_errors_that_can_pass_move_on_to_the_fallback(
    model_server: ModelServer, status: int, error_body: Any
) -> None:
    model_server.fail(status, error_body, for_model="primary")
    result = complete(route_to(model_server, "primary", "backup"), HELLO, agent="chat")
    assert result.model == "backup"
    assert [model for model, _ in result.tried] == ["primary"]


@pytest.mark.parametrize(
    "status, error_class",
    [
        (400, "BadRequestError"),
        (401, "AuthenticationError"),
        (403, "APIError"),
        (404, "NotFoundError"),
    ],
)
def test_e4_a_request_error_raises_at_once_without_trying_the_fallback(
    model_server: ModelServer, caplog: pytest.LogCaptureFixture, status: int, error_class: str
) -> None:
    model_server.fail(status, for_model="primary")
    with pytest.raises(ModelRequestError) as raised:
        complete(route_to(model_server, "primary", "backup"), HELLO, agent="chat")
    assert model_server.models == ["primary"]
    assert raised.value.tried == (("primary", error_class),)
    assert f"scripted failure {status}" in str(raised.value)
    assert raised.value.__cause__ is not None
    (line,) = llm_lines(caplog)
    assert "outcome=refused" in line.getMessage()


def test_e7_a_model_that_never_answers_hits_the_llm_buffered_timeout(
    model_server: ModelServer,
) -> None:
    model_server.hang()
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError) as raised:
        complete(route_to(model_server, "slow", timeout_s=0.5), HELLO, agent="memory_reviewer")
    assert time.monotonic() - started < 3
    assert "slow: timed out after 0.5 s (llm_buffered policy)" in str(raised.value)
    assert raised.value.tried == (("slow", "Timeout"),)


def test_e7_a_timed_out_primary_passes_to_the_fallback(model_server: ModelServer) -> None:
    model_server.hang(for_model="slow")
    model_server.reply("quick", for_model="quick")
    result = complete(route_to(model_server, "slow", "quick", timeout_s=0.5), HELLO, agent="t")
    assert (result.content, result.tried) == ("quick", (("slow", "Timeout"),))


def test_e4_when_every_model_fails_the_error_names_each_model_and_why(
    model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model_server.fail(500, for_model="a")
    model_server.fail(503, for_model="b")
    model_server.fail(429, for_model="c")
    with pytest.raises(ModelUnavailableError) as raised:
        complete(route_to(model_server, "a", "b", "c"), HELLO, agent="chat")
    message = str(raised.value)
    for model, error in [
        ("a", "InternalServerError"),
        ("b", "ServiceUnavailableError"),
        ("c", "RateLimitError"),
    ]:
        assert f"{model}: {error}" in message
    assert raised.value.tried == (
        ("a", "InternalServerError"),
        ("b", "ServiceUnavailableError"),
        ("c", "RateLimitError"),
    )
    (line,) = llm_lines(caplog)
    assert line.levelno == logging.WARNING
    assert "outcome=failed" in line.getMessage()


def test_e4_a_server_that_is_down_is_a_model_error(model_server: ModelServer) -> None:
    route = route_to(model_server, "llama3")
    model_server.stop()
    with pytest.raises(ModelUnavailableError, match="llama3"):
        complete(route, HELLO, agent="chat")


_CALLBACK_LISTS = (
    "callbacks",
    "input_callback",
    "success_callback",
    "failure_callback",
    "_async_success_callback",
    "_async_failure_callback",
)


@pytest.fixture
def litellm_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What litellm was given for each call, recorded by a litellm callback before the call.

    litellm copies ``litellm.callbacks`` into its other callback lists on the first call, so
    every list is swapped for a copy and restored after the test.
    """
    import litellm
    from litellm.integrations.custom_logger import CustomLogger

    seen: list[dict[str, Any]] = []

    class Recorder(CustomLogger):
        def log_pre_api_call(self, model: str, messages: Any, kwargs: dict[str, Any]) -> None:
            seen.append(kwargs)

    for name in _CALLBACK_LISTS:
        monkeypatch.setattr(litellm, name, list(getattr(litellm, name)))
    litellm.callbacks.append(Recorder())
    return seen


def test_e4_the_agent_tag_reaches_litellm_s_metadata(
    model_server: ModelServer,
    litellm_calls: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="fermix.llm"):
        complete(
            route_to(model_server, "llama3"),
            HELLO,
            agent="memory_reviewer",
            metadata={"agent": "spoofed", "conversation": "c1"},
        )
    (call,) = litellm_calls
    metadata = call["litellm_params"]["metadata"]
    assert metadata["agent"] == "memory_reviewer"
    assert metadata["conversation"] == "c1"
    assert "agent=memory_reviewer" in llm_lines(caplog)[0].getMessage()
    assert "metadata" not in model_server.requests[0]  # a trace tag, not sent to the model


def test_k2_reasoning_effort_reaches_the_server_only_when_set(model_server: ModelServer) -> None:
    route = route_to(model_server, "llama3")
    complete(route, HELLO, agent="compactor", reasoning_effort="medium", max_tokens=50)
    complete(route, HELLO, agent="compactor")
    with_effort, without = model_server.requests
    assert with_effort["reasoning_effort"] == "medium"
    assert with_effort["max_tokens"] == 50
    assert "reasoning_effort" not in without and "max_tokens" not in without


def test_k2_reasoning_effort_refused_by_the_server_is_dropped_for_that_model(
    model_server: ModelServer,
) -> None:
    model_server.fail(400, {"error": {"message": "Unrecognized argument: reasoning_effort"}})
    model_server.reply("answered without it")
    result = complete(route_to(model_server, "llama3"), HELLO, agent="c", reasoning_effort="low")
    assert (result.content, result.dropped, result.tried) == (
        "answered without it",
        ("reasoning_effort",),
        (),
    )
    first, second = model_server.requests
    assert first["reasoning_effort"] == "low"
    assert "reasoning_effort" not in second


def test_k2_reasoning_effort_litellm_knows_a_model_lacks_is_dropped_before_sending(
    model_server: ModelServer,
) -> None:
    result = complete(
        route_to(model_server, "openai/gpt-4o-mini"), HELLO, agent="c", reasoning_effort="low"
    )
    assert result.dropped == ("reasoning_effort",)
    (sent,) = model_server.requests
    assert sent["model"] == "gpt-4o-mini"
    assert "reasoning_effort" not in sent


SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "ops", "schema": {"type": "object"}, "strict": True},
}


def test_e4_response_format_reaches_the_server(model_server: ModelServer) -> None:
    model_server.reply_json({"operations": []})
    result = complete(route_to(model_server, "llama3"), HELLO, agent="r", response_format=SCHEMA)
    assert result.content == '{"operations": []}'
    assert model_server.requests[0]["response_format"] == SCHEMA


def test_e4_a_model_refusing_response_format_is_asked_again_for_plain_text(
    model_server: ModelServer,
) -> None:
    model_server.fail(400, {"error": {"message": "response_format is not supported"}})
    model_server.reply("Nothing to save.")
    result = complete(route_to(model_server, "llama3"), HELLO, agent="r", response_format=SCHEMA)
    assert (result.content, result.dropped) == ("Nothing to save.", ("response_format",))
    assert "response_format" not in model_server.requests[1]


def test_e4_tool_calls_are_returned_in_openai_format(model_server: ModelServer) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "memory_recall",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    model_server.reply_tool_call("memory_recall", {"query": "tea"})
    result = complete(route_to(model_server, "llama3"), HELLO, agent="chat", tools=[tool])
    assert model_server.requests[0]["tools"] == [tool]
    assert result.finish_reason == "tool_calls"
    assert result.content == ""
    (call,) = result.tool_calls
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"] == {"name": "memory_recall", "arguments": '{"query": "tea"}'}


def test_h3_no_model_configured_raises_a_model_error_with_the_hint() -> None:
    with pytest.raises(ModelError) as raised:
        complete(Route.from_config(ModelConfig()), HELLO, agent="chat")
    assert str(raised.value) == NO_MODEL_HINT
    assert "[fermix_core.model]" in NO_MODEL_HINT and "--model" in NO_MODEL_HINT


def test_k1_context_window_reads_litellm_s_table_and_is_none_for_an_unknown_model() -> None:
    assert context_window("openai/gpt-4o-mini") == 128_000
    assert context_window(Route(("gpt-4o-mini", "x"))) == 128_000
    assert context_window("openai/no-such-model-anywhere") is None


def test_e4_importing_fermix_llm_does_not_import_litellm() -> None:
    code = "import sys, fermix.llm; print('litellm' in sys.modules, 'openai' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False"]


PRELOAD = """
import sys, threading, fermix.llm as llm
loading = llm.preload()
print(loading is not None and loading.daemon and loading.is_alive())
print(llm.context_window("openai/gpt-4o-mini"))  # a call during the load waits for it
loading.join(60)
print(not loading.is_alive(), "litellm" in sys.modules, llm.preload() is None)
"""


def test_h2_preload_loads_litellm_in_a_background_thread_that_a_call_waits_for() -> None:
    """``fermix chat`` loads the model edge while its user types (issue 25): the load runs
    in a daemon thread, a model call made meanwhile waits for it rather than importing the
    same modules beside it, and once loaded there is nothing left to preload."""
    out = subprocess.run(
        [sys.executable, "-c", PRELOAD],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert out.stdout.split() == ["True", "128000", "True", "True", "True"]
    assert out.stderr == ""


# -- the loopback model server itself -------------------------------------------------


def _post(server: ModelServer, path: str, body: object) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.bound_port, timeout=5)
    try:
        conn.request("POST", path, body=json.dumps(body))
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_model_server_serves_chat_completions_buffered_and_streamed(
    model_server: ModelServer,
) -> None:
    """The loopback model server answers chat completions only, buffered or, with
    ``stream: true``, as server-sent chunks ending in ``[DONE]`` (Hermes streams)."""
    assert _post(model_server, "/v1/completions", {})[0] == 404
    model_server.default = text_reply("the default", prompt_tokens=9)
    status, body = _post(model_server, "/v1/chat/completions", {"model": "m"})
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "the default"
    assert body["usage"]["prompt_tokens"] == 9
    conn = http.client.HTTPConnection("127.0.0.1", model_server.bound_port, timeout=5)
    try:
        request = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(request))
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/event-stream")
        events = [
            line.removeprefix(b"data: ").decode()
            for line in response.read().splitlines()
            if line.startswith(b"data: ")
        ]
    finally:
        conn.close()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"]
    )
    assert text == "the default"
    assert chunks[-1]["usage"]["prompt_tokens"] == 9


def test_the_model_server_stops_promptly_while_an_answer_hangs() -> None:
    server = ModelServer().start()
    server.hang()
    outcome: list[Exception] = []

    def ask() -> None:
        try:
            _post(server, "/v1/chat/completions", {})
        except http.client.RemoteDisconnected as exc:  # the hanging answer never comes
            outcome.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    assert server.wait_for_requests(1)
    started = time.monotonic()
    server.stop()
    asker.join(5)
    assert not asker.is_alive()
    assert time.monotonic() - started < 2
    assert len(outcome) == 1


def test_the_model_server_runs_in_its_own_process_from_a_script(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"reply": "scripted"}, {"default": True, "fail": 503}]))
    command = [sys.executable, str(Path(__file__).resolve().parents[1] / "model_server.py")]
    with subprocess.Popen(
        [*command, "--script", str(script)], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            url = child.stdout.readline().strip()
            route = Route(("llama3",), url)
            assert complete(route, HELLO, agent="t").content == "scripted"
            with pytest.raises(ModelUnavailableError, match="ServiceUnavailableError"):
                complete(route, HELLO, agent="t")
        finally:
            child.terminate()
