"""``fermix server status`` tells what the server is doing (N7).

Against a real server process (``fermix server start --port 0``) on loopback: since
when and where it serves, the live conversations, requests and appends per second, the
reviews and compactions in flight, and the last errors, as a table and with ``--json``.
Rates are over the last complete seconds: the tests check the totals exactly and wait for a
rate by appending until the server reports it, never by sleeping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from fastapi.testclient import TestClient
from model_server import ModelServer

from fermix.api import Memory
from fermix.errors import StorageError
from fermix.home import Home
from fermix.server.http.app import create_app
from fermix.server.service import ServicePaths, query_status
from fermix.server.serving import read_server_file

DEADLINE_S = 20.0


def _fermix(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200"},
    )


class Api:
    """The server's HTTP API with one token, through the standard library."""

    def __init__(self, url: str, secret: str) -> None:
        self.url = url
        self.secret = secret

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float = 30
    ) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"{self.url}/v1{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.secret}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def open(self, chat_id: str) -> str:
        status, body = self.call(
            "POST",
            "/conversations/open",
            {"agent_id": "tutor", "channel": "cli", "chat_id": chat_id},
        )
        assert status == 200, body
        handle: str = body["handle"]
        return handle

    def append(self, handle: str, text: str, *, timeout: float = 30) -> tuple[int, Any]:
        return self.call(
            "POST",
            f"/conversations/{handle}/messages",
            {"role": "user", "text": text},
            timeout=timeout,
        )


def _wait_until(check: Callable[[], bool], what: str) -> None:
    """Poll an effect outside this process (the server's status) until it holds."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.05)


@pytest.fixture
def served(home: Path) -> Iterator[tuple[Path, Api]]:
    """A running server on ``home`` and an API client with a token for agent ``tutor``."""
    made = _fermix(home, "token", "create", "--agent", "tutor", "--json")
    assert made.returncode == 0, made.stderr
    started = _fermix(home, "server", "start", "--port", "0")
    assert started.returncode == 0, started.stderr
    try:
        found = read_server_file(Home(home))
        assert found is not None
        yield home, Api(str(found["url"]), json.loads(made.stdout)["secret"])
    finally:
        _fermix(home, "server", "stop")


def _status(home: Path) -> dict[str, Any]:
    return query_status(ServicePaths.of(Home(home)))


@pytest.mark.slow
def test_n7_w1_status_says_since_when_where_what_it_holds_how_fast_and_how_long_it_takes(
    served: tuple[Path, Api],
) -> None:
    home, api = served
    began = time.time()
    handles = [api.open(f"c{i}") for i in range(3)]
    appended = 0

    def append_and_check() -> bool:
        # Appends go on until the server reports a rate: a rate counts complete seconds
        # only, so it shows once a second with appends has passed, whenever that is.
        nonlocal appended
        status, body = api.append(handles[appended % 3], f"message {appended}")
        assert status == 201, body
        appended += 1
        return appended >= 6 and _status(home)["per_second"]["appends"] > 0

    _wait_until(append_and_check, "append rate")
    for handle in handles:  # a read starts the conversation's actor
        status, body = api.call("GET", f"/conversations/{handle}/messages")
        assert (
            status == 200 and len(body["messages"]) == (appended + 2 - handles.index(handle)) // 3
        )

    for handle in handles:
        status, body = api.call("POST", f"/conversations/{handle}/compose", {"system": "be brief"})
        assert status == 200, body

    shown = _fermix(home, "server", "status", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    # W1: append and compose latency of the last minute, what the console charts
    latency = data["latency"]
    assert latency["window_s"] == 60 and latency["append"]["count"] == appended
    assert latency["compose"]["count"] == 3
    for name in ("append", "compose"):
        assert 0 < latency[name]["p50_ms"] <= latency[name]["p99_ms"], latency
    assert data["running"] is True and data["url"] == api.url
    assert began - 60 < data["started_at"] <= time.time()
    assert data["live_conversations"] == 3
    assert data["totals"]["appends"] == appended
    assert data["totals"]["requests"] >= appended + 3 + 3
    assert data["per_second"]["appends"] >= 0 and data["rate_window_s"] == 10
    for field in ("reviews_running", "reviews_queued", "compactions_running"):
        assert isinstance(data[field], int) and data[field] >= 0, field
    assert isinstance(data["compactions_queued"], int)
    assert data["last_errors"] == [] and data["failure"] is None

    table = _fermix(home, "server", "status")
    assert table.returncode == 0, table.stderr
    for words in ("running since", api.url, "live conversations", "appends per second"):
        assert words in table.stdout, words
    assert "reviews in flight" in table.stdout and "compactions in flight" in table.stdout
    assert "append latency (last 60 s)" in table.stdout and "compose latency" in table.stdout
    assert f"({appended} in all)" in table.stdout


@pytest.mark.slow
def test_n7_a_review_waiting_on_its_model_shows_in_flight(home: Path) -> None:
    release = threading.Event()
    with ModelServer() as model:
        model.hang(release)
        (home / "config.toml").write_text(
            "[fermix_core.model]\n"
            f'primary = "openai/test"\napi_base = "{model.url}"\ntimeout_s = 30\n'
            "[fermix_core.memory]\nreview_interval_hours = 0\n"
        )
        made = _fermix(home, "token", "create", "--agent", "tutor", "--operator", "--json")
        assert made.returncode == 0, made.stderr
        assert _fermix(home, "server", "start", "--port", "0").returncode == 0
        try:
            found = read_server_file(Home(home))
            assert found is not None
            api = Api(str(found["url"]), json.loads(made.stdout)["secret"])
            handle = api.open("c1")
            assert api.append(handle, "I moved to Porto last month")[0] == 201
            answered: list[tuple[int, Any]] = []
            review = threading.Thread(
                target=lambda: answered.append(
                    api.call("POST", f"/conversations/{handle}/review", {"force": True}, timeout=60)
                )
            )
            review.start()
            try:
                assert model.wait_for_requests(1, timeout=DEADLINE_S)
                data = _status(home)
                assert (data["reviews_running"], data["reviews_queued"]) == (1, 0)
            finally:
                release.set()
                review.join(timeout=60)
            assert answered and answered[0][0] == 200
            _wait_until(lambda: _status(home)["reviews_running"] == 0, "review finished")
        finally:
            _fermix(home, "server", "stop")


@pytest.mark.slow
def test_n7_a_5xx_answer_is_in_the_last_errors(served: tuple[Path, Api]) -> None:
    """Another process holds the database's write lock past the write path's retries (three
    attempts, each waiting out the busy timeout): the append is answered 503, and status
    lists it under the route's template, never with a traceback."""
    home, api = served
    handle = api.open("c1")
    lock = apsw.Connection(str(Home(home).db_path))
    # The server's own background writes (the embedder's first, a checkpoint) may hold the
    # lock for a moment: the test's BEGIN waits them out, as any second process would.
    lock.set_busy_timeout(30_000)
    try:
        lock.execute("BEGIN IMMEDIATE")
        status, body = api.append(handle, "lost to the lock", timeout=120)
    finally:
        lock.close()  # rolls back, releasing the lock
    assert status == 503 and body["error"]["type"] == "unavailable"
    assert api.append(handle, "after the lock")[0] == 201

    (error,) = json.loads(_fermix(home, "server", "status", "--json").stdout)["last_errors"]
    assert error["where"] == "POST /v1/conversations/{handle}/messages"
    assert error["message"].startswith("503 WriteFailedError")
    assert "Traceback" not in error["message"] and handle not in error["where"]
    shown = _fermix(home, "server", "status").stdout
    assert "last errors" in shown and "WriteFailedError" in shown


def test_n7_errors_answered_with_5xx_are_recorded_and_others_are_not(memory: Memory) -> None:
    app = create_app(memory)

    @app.get("/v1/boom")
    def boom() -> None:
        raise RuntimeError("an unexpected bug")

    @app.get("/v1/storage")
    def storage() -> None:
        raise StorageError("the disk went away")

    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/v1/boom").status_code == 500
    assert client.get("/v1/storage").status_code == 503
    assert client.get("/v1/nowhere").status_code == 404
    assert client.post("/v1/conversations/open", json={}).status_code == 401
    errors = app.state.metrics.snapshot()["last_errors"]
    assert [(e["where"], e["message"]) for e in errors] == [
        ("GET /v1/boom", "500 RuntimeError: an unexpected bug"),
        ("GET /v1/storage", "503 StorageError: the disk went away"),
    ]
