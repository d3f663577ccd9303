"""A scripted OpenAI-compatible model server on 127.0.0.1, for tests and benchmarks.

litellm talks to it over real HTTP (``openai/<name>`` with ``api_base=server.url``), so a
test exercises the whole client path: request building, status-code mapping, timeouts,
response parsing. Each test scripts the answers it needs, in order::

    server.fail(500)                 # the first request gets a 500
    server.reply("hello")            # the second gets a completion
    server.default = hanging()       # every later one never answers

A scripted step may be limited to one model (``for_model=``, the name in the request body:
litellm sends ``openai/llama3`` as ``llama3``): a request takes the first step meant for its
model (or for any model), so a fallback test does not depend on which request comes first.
When no step is left the server answers with :attr:`ModelServer.default`.

``POST /v1/embeddings`` answers every input with a deterministic vector of
:data:`EMBEDDING_DIM` floats (hashed character trigrams: texts that share words get close
vectors), recorded in :attr:`ModelServer.embedding_requests`.

Besides that, only ``POST /v1/chat/completions`` is served (anything else is a 404). A
request with ``stream: true`` (no caller of fermix streams, but a framework such as Hermes
Agent always does) gets the same scripted completion as server-sent events: one chunk with
the role and content, one per tool call, one with the finish reason, a usage chunk when
``stream_options.include_usage`` asks for it, then ``data: [DONE]``; a failure or a hang
is the same as for a buffered request. litellm's ``metadata`` never goes over HTTP, so it
is not in :attr:`ModelServer.requests`; everything the OpenAI client sends (model, messages,
tools, response_format, reasoning_effort, max_tokens, stream, ...) is.

Run it in its own process with ``python tests/model_server.py --port 0 --script FILE``: it
prints its URL on the first line of stdout and serves until it is interrupted. ``FILE``
holds a JSON list of steps such as ``{"reply": "text"}``, ``{"json": {...}}``,
``{"tool_call": {"name": "f", "arguments": {}}}``, ``{"fail": 500}`` or ``{"hang": true}``,
each with optional ``for_model`` and ``prompt_tokens``; ``{"default": true, ...}`` marks
the step used when the script is empty.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_ids = itertools.count(1)


@dataclass(frozen=True)
class Step:
    """One scripted answer: a completion, an error status, or no answer at all (``hang``)."""

    status: int = 200
    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    error_body: Any = None
    hang: bool = False
    release: threading.Event | None = None
    for_model: str | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    before: Callable[[], None] | None = None
    """Run on the server's thread before it answers (what happens while the model thinks)."""

    def matches(self, model: object) -> bool:
        """Whether this step may answer a request for ``model``."""
        return self.for_model is None or self.for_model == model


def text_reply(text: str, **options: Any) -> Step:
    """A completion whose message content is ``text``."""
    return Step(content=text, **options)


def json_reply(obj: object, **options: Any) -> Step:
    """A completion whose content is ``obj`` serialized as JSON."""
    return Step(content=json.dumps(obj), **options)


def tool_call_reply(name: str, arguments: dict[str, Any], **options: Any) -> Step:
    """A completion that calls tool ``name`` with ``arguments`` (finish_reason ``tool_calls``)."""
    call = {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    options.setdefault("finish_reason", "tool_calls")
    return Step(tool_calls=(call,), **options)


def failure(status: int, body: Any = None, **options: Any) -> Step:
    """An HTTP error; ``body`` defaults to an OpenAI-style error object."""
    return Step(status=status, error_body=body, **options)


def hanging(release: threading.Event | None = None, **options: Any) -> Step:
    """No answer until ``release`` is set or the server stops; then the connection closes."""
    return Step(hang=True, release=release, **options)


def _rough_tokens(value: object) -> int:
    return max(1, len(json.dumps(value)) // 4)


def _completion(step: Step, request: dict[str, Any]) -> dict[str, Any]:
    prompt = step.prompt_tokens
    if prompt is None:
        prompt = _rough_tokens(request.get("messages", []))
    answer = _rough_tokens(step.content or "") + sum(_rough_tokens(c) for c in step.tool_calls)
    message: dict[str, Any] = {"role": "assistant", "content": step.content}
    if step.tool_calls:
        message["tool_calls"] = list(step.tool_calls)
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "unknown"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": step.finish_reason or "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": answer,
            "total_tokens": prompt + answer,
        },
    }


def _stream_chunks(step: Step, request: dict[str, Any]) -> list[dict[str, Any]]:
    """The completion of ``step`` as ``chat.completion.chunk`` objects (``stream: true``)."""
    whole = _completion(step, request)
    choice = whole["choices"][0]

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": whole["id"],
            "object": "chat.completion.chunk",
            "created": whole["created"],
            "model": whole["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    chunks = [chunk({"role": "assistant", "content": step.content or ""})]
    for index, call in enumerate(step.tool_calls):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if (request.get("stream_options") or {}).get("include_usage"):
        chunks.append({**chunk({}), "choices": [], "usage": whole["usage"]})
    return chunks


def _error(status: int, message: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


@dataclass
class ModelServer:
    """The scripted server; :meth:`start` it (or use it as a context manager), then script it."""

    default: Step = field(default_factory=lambda: text_reply("ok"))
    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list, init=False)
    """Every request body received, in arrival order."""
    headers: list[dict[str, str]] = field(default_factory=list, init=False)
    """The headers of each request in :attr:`requests`, in the same order."""
    embedding_requests: list[dict[str, Any]] = field(default_factory=list, init=False)
    """Every ``/v1/embeddings`` request body received, in arrival order."""

    def __post_init__(self) -> None:
        self._script: list[Step] = []
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def bound_port(self) -> int:
        """The port the server listens on (chosen by the OS when ``port`` is 0)."""
        if self._httpd is None:
            raise RuntimeError("the model server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give litellm as ``api_base``, ending in ``/v1``."""
        return f"http://127.0.0.1:{self.bound_port}/v1"

    def start(self) -> ModelServer:
        """Listen on 127.0.0.1 (``port`` 0 picks a free one) and serve in a daemon thread."""
        self._httpd = _HTTPServer(("127.0.0.1", self.port), _Handler)
        self._httpd.model_server = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},  # stop() waits up to one poll interval
            name="model-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release every hanging answer, close every connection and stop serving."""
        self._stopping.set()
        if self._httpd is None:
            return
        self._httpd.shutdown()
        with self._lock:
            for sock in list(self._sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # the client already closed it
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def script(self, *steps: Step) -> None:
        """Queue ``steps`` after those already scripted."""
        with self._lock:
            self._script.extend(steps)

    def reply(self, text: str, **options: Any) -> None:
        """Queue a completion with content ``text``."""
        self.script(text_reply(text, **options))

    def reply_json(self, obj: object, **options: Any) -> None:
        """Queue a completion whose content is ``obj`` as JSON."""
        self.script(json_reply(obj, **options))

    def reply_tool_call(self, name: str, arguments: dict[str, Any], **options: Any) -> None:
        """Queue a completion that calls tool ``name`` with ``arguments``."""
        self.script(tool_call_reply(name, arguments, **options))

    def fail(self, status: int, body: Any = None, **options: Any) -> None:
        """Queue an HTTP error ``status`` with an OpenAI-style (or the given) error body."""
        self.script(failure(status, body, **options))

    def hang(self, release: threading.Event | None = None, **options: Any) -> None:
        """Queue an answer that never comes (until ``release`` is set or the server stops)."""
        self.script(hanging(release, **options))

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until at least ``count`` requests have arrived; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self.requests) >= count, timeout)

    @property
    def models(self) -> list[str]:
        """The ``model`` of each request received, in order."""
        with self._lock:
            return [str(r.get("model")) for r in self.requests]

    def _take(self, body: dict[str, Any], headers: dict[str, str]) -> Step:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self._lock.notify_all()
            for index, step in enumerate(self._script):
                if step.matches(body.get("model")):
                    return self._script.pop(index)
            return self.default

    def _wait_released(self, step: Step) -> None:
        waiters = [self._stopping] + ([step.release] if step.release is not None else [])
        while not any(event.wait(0.05) for event in waiters):
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    model_server: ModelServer

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.model_server._lock:
            self.model_server._sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.model_server._lock:
            self.model_server._sockets.discard(request)
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the OpenAI client expects
    # Headers and body go out in two writes: without TCP_NODELAY, loopback adds a ~40 ms
    # delayed-ACK stall to every answer and skews the benchmarks' model round trip.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: pytest shows failures, not access logs."""

    def do_GET(self) -> None:
        self._send(404, _error(404, f"no route GET {self.path}"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") == "/v1/embeddings":
            self._embeddings(raw)
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, _error(404, f"no route POST {self.path}"))
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, _error(400, "request body is not JSON"))
            return
        owner = self.server.model_server
        step = owner._take(body, {k.lower(): v for k, v in self.headers.items()})
        if step.hang:
            owner._wait_released(step)
            self.close_connection = True  # the client gave up long ago; answer nothing
        elif step.status != 200:
            message = f"scripted failure {step.status}"
            self._send(step.status, step.error_body or _error(step.status, message))
        else:
            if step.before is not None:
                step.before()
            if body.get("stream"):
                self._send_events(_stream_chunks(step, body))
            else:
                self._send(200, _completion(step, body))

    def _embeddings(self, raw: bytes) -> None:
        body = json.loads(raw or b"{}")
        self.server.model_server.embedding_requests.append(body)
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else texts
        data = [
            {"object": "embedding", "index": i, "embedding": _hashed_vector(str(text))}
            for i, text in enumerate(texts)
        ]
        usage = {"prompt_tokens": sum(len(str(t).split()) for t in texts), "total_tokens": 0}
        self._send(
            200,
            {"object": "list", "data": data, "model": body.get("model", ""), "usage": usage},
        )

    def _send_events(self, chunks: list[dict[str, Any]]) -> None:
        """Answer with ``chunks`` as server-sent events, then ``[DONE]``, in one write."""
        events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
        data = "".join(events).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send(self, status: int, payload: Any) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


EMBEDDING_DIM = 16


def _hashed_vector(text: str) -> list[float]:
    """Character trigrams of ``text`` hashed into :data:`EMBEDDING_DIM` buckets (stable
    across runs: no Python ``hash``)."""
    vector = [0.0] * EMBEDDING_DIM
    padded = f"  {text.lower()}  "
    for i in range(len(padded) - 2):
        gram = padded[i : i + 3].encode("utf-8", "surrogatepass")
        vector[int.from_bytes(gram, "little") % EMBEDDING_DIM] += 1.0
    return vector


def step_from_dict(spec: dict[str, Any]) -> Step:
    """Build a :class:`Step` from its JSON form (see the module docstring)."""
    options = {k: spec[k] for k in ("for_model", "prompt_tokens") if k in spec}
    if "reply" in spec:
        return text_reply(str(spec["reply"]), **options)
    if "json" in spec:
        return json_reply(spec["json"], **options)
    if "tool_call" in spec:
        call = spec["tool_call"]
        return tool_call_reply(call["name"], call.get("arguments", {}), **options)
    if "fail" in spec:
        return failure(int(spec["fail"]), spec.get("body"), **options)
    if spec.get("hang"):
        return hanging(**options)
    raise ValueError(f"unknown step: {spec!r}")


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve scripted OpenAI-compatible answers.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", type=Path, help="JSON list of steps")
    args = parser.parse_args(argv)
    server = ModelServer(port=args.port)
    if args.script is not None:
        for spec in json.loads(args.script.read_text()):
            step = step_from_dict(spec)
            if spec.get("default"):
                server.default = replace(step, for_model=None)
            else:
                server.script(step)
    with server:
        print(server.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    _main(sys.argv[1:])
