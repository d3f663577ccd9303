"""The console's setup applies to the running server without a restart (W1).

A real server process on 127.0.0.1, its model route leading to the loopback model server
(tests/model_server.py) through litellm. Each change goes through the console's own HTTP
route (``POST /console/api/setup``, signed in, with the CSRF token), and the next review or
compaction the running server makes shows the new value: a review the interval turns off or
on, a model name the next review calls, compaction turned off. Nothing waits on time: each
review and compaction is asked for over HTTP and answers when it is done.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from model_server import ModelServer
from server_fixtures import AGENT, ServerProcess, StartServer

from fermix.remote.client import Client
from fermix.remote.conversation import RemoteConversation


def config(model_server: ModelServer) -> str:
    return f"""
# The route of the reviews and compactions.
[fermix_core.model]
primary = "openai/first"
api_base = "{model_server.url}"
timeout_s = 20
context_window = 2000

[fermix_core.memory]
review_interval_hours = 0
sweep_interval_s = 0

[fermix_core.embedding]
enabled = false
"""


@pytest.fixture
def live(start_server: StartServer, model_server: ModelServer) -> ServerProcess:
    return start_server(config(model_server))


@pytest.fixture
def console(live: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, follow_redirects=False, timeout=60) as http:
        answer = http.post(
            "/console/signin",
            content=f"token={live.operator_token}",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert answer.status_code == 303, answer.text
        http.headers["X-CSRF-Token"] = http.get("/console/api/session").json()["csrf"]
        yield http


def setup(console: httpx.Client, key: str, value: str) -> dict[str, Any]:
    """Set ``key`` through the console's setup route; the entry it answers for the key."""
    answer = console.post("/console/api/setup", json={"key": f"fermix_core.{key}", "value": value})
    assert answer.status_code == 200, answer.text
    (entry,) = [k for k in answer.json()["keys"] if k["key"] == f"fermix_core.{key}"]
    assert entry["applies"] == "now"
    return dict(entry)


def review(client: Client, conv: RemoteConversation, *, force: bool) -> dict[str, Any]:
    result = client.review(conv, force=force)
    return {"status": result.status, "skip": result.skip, "model": result.model}


def added(key: str, value: str) -> dict[str, Any]:
    return {"operations": [{"op": "add", "category": "identity", "key": key, "value": value}]}


@pytest.mark.slow  # a server process and model calls through litellm
def test_w1_the_review_interval_and_model_route_set_in_the_console_apply_without_a_restart(
    live: ServerProcess, console: httpx.Client, model_server: ModelServer
) -> None:
    """W1: the interval set through the console turns the running reviewer's background
    reviews on and off, and the model route set there is the one the next review calls;
    the server's process is the same throughout."""
    pid = live.process.pid if live.process is not None else None
    with live.client(live.host_token) as client:
        conv = client.conversation(AGENT, "telegram", "live-1", owner_id="ana")
        conv.append_user("I'm Ana")
        # Interval 0: background reviews are off in the running reviewer.
        assert review(client, conv, force=False)["skip"] == "disabled"
        assert model_server.requests == []

        assert setup(console, "memory.review_interval_hours", "1")["value"] == "1.0"
        model_server.reply_json(added("name", "Ana"), for_model="first")
        # Never reviewed and an interval now: due, and the reviewer runs it unforced.
        assert review(client, conv, force=False) == {
            "status": "applied",
            "skip": None,
            "model": "openai/first",
        }
        assert model_server.models == ["first"]

        setup(console, "model.primary", '"openai/second"')
        conv.append_user("I live in Porto")
        model_server.reply_json(added("city", "Porto"), for_model="second")
        assert review(client, conv, force=True)["model"] == "openai/second"
        assert model_server.models == ["first", "second"]  # the new name, no restart
        state = conv.state()
        assert state is not None and state.review_outcome == "applied"

        setup(console, "memory.review_interval_hours", "0")
        conv.append_user("and I like tea")
        assert review(client, conv, force=False)["skip"] == "disabled"
        assert model_server.models == ["first", "second"]

        reviews = console.get("/console/api/reviews", params={"agent_id": AGENT}).json()
        assert reviews["review_interval_hours"] == 0
    assert live.process is not None and live.process.pid == pid and live.process.poll() is None


@pytest.mark.slow  # a server process and a model call through litellm
def test_w1_compaction_set_in_the_console_is_what_the_running_compactor_reads_next(
    live: ServerProcess, console: httpx.Client, model_server: ModelServer
) -> None:
    """W1: compaction turned off through the console holds back the running compactor, and
    turned on again the next compaction runs, on the same process."""
    setup(console, "compaction.enabled", "false")
    with live.client(live.host_token) as client:
        conv = client.conversation(AGENT, "telegram", "live-2", owner_id="ana")
        for n in range(6):
            conv.append_user(f"message {n}: " + "the harbour in Porto is busy in May " * 30)
        conv.commit("Noted.", {"prompt_tokens": 1_900})
        result = client.compact(conv, force=False)
        assert (result.status, result.reason) == ("skipped", "disabled")
        assert model_server.requests == []

        setup(console, "compaction.enabled", "true")
        model_server.reply("Ana talked about the harbour.", for_model="first")
        result = client.compact(conv, force=False)
        assert result.status == "compacted", result
        assert model_server.models == ["first"]
        state = conv.state()
        assert state is not None and state.compaction_outcome == "compacted"
