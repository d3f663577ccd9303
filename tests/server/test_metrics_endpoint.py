"""``GET /metrics`` on a real memory server process, scraped while it is under load (O1, N2).

The server runs as ``fermix server start --foreground``; host threads append through
``fermix.Client`` while the test scrapes, and every scrape is parsed with
prometheus_client's own parser. Least privilege: the scrape token of
``[fermix_core.server] metrics_token_sha256`` reads the metrics and nothing else, a host
token gets a 403, no token a 401.
"""

from __future__ import annotations

import hashlib
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import AGENT, ServerProcess, StartServer

SCRAPE_SECRET = "scrape-only-secret-for-the-test"
CONFIG = f"""
[fermix_core.server]
metrics_token_sha256 = "{hashlib.sha256(SCRAPE_SECRET.encode()).hexdigest()}"

[fermix_core.embedding]
enabled = false
"""
THREADS, PER_THREAD = 4, 25


def get(url: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
    """A GET with an optional bearer token: status, headers, body (errors included)."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def scrape(
    server: ServerProcess, token: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, headers, body = get(f"{server.url}/metrics", token)
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def stored(found: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return found.get(("fermix_appends_total", (("outcome", "stored"),)), 0.0)


@pytest.fixture
def scraped(start_server: StartServer) -> ServerProcess:
    return start_server(CONFIG)


@pytest.mark.slow  # a server process and a hundred appends over HTTP
def test_o1_metrics_scraped_under_load_move_by_what_the_hosts_appended(
    scraped: ServerProcess,
) -> None:
    server = scraped
    before = scrape(server, SCRAPE_SECRET)
    failures: list[BaseException] = []
    done = threading.Event()
    scraped_once = threading.Event()
    """Set after a scrape taken while every host is halfway: the scrapes overlap the load."""

    def host(t: int) -> None:
        try:
            with server.client(server.host_token) as client:
                conv = client.conversation(AGENT, "load", f"chat-{t}", owner_id=f"user-{t}")
                for n in range(PER_THREAD):
                    conv.append_user(f"message {n} of thread {t}")
                    if n == 0:
                        assert scraped_once.wait(30)
        except BaseException as exc:  # noqa: BLE001 - handed to the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=host, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    waiter = threading.Thread(target=lambda: ([t.join() for t in threads], done.set()))
    waiter.start()
    during = [stored(scrape(server, SCRAPE_SECRET))]
    scraped_once.set()
    while not done.is_set():  # scraped while the hosts append: each one parses
        during.append(stored(scrape(server, SCRAPE_SECRET)))
    waiter.join()
    assert failures == []
    after = scrape(server, server.operator_token)

    appended = THREADS * PER_THREAD
    assert stored(after) - stored(before) == appended
    assert during == sorted(during)  # a counter never goes back
    assert all(stored(before) <= seen <= stored(after) for seen in during)
    assert during[0] < stored(before) + appended  # the first was taken halfway
    count = ("fermix_append_seconds_count", (("outcome", "stored"),))
    assert after[count] - before.get(count, 0.0) == appended
    commits = after[("fermix_commits_total", ())] - before[("fermix_commits_total", ())]
    assert 1 <= commits <= appended  # concurrent appends share commits
    units = after[("fermix_commit_batch_size_sum", ())] - before.get(
        ("fermix_commit_batch_size_sum", ()), 0.0
    )
    assert units >= appended
    assert after[("fermix_storage_errors_total", ())] == 0
    assert ("fermix_write_queue_depth", ()) in after
    with server.client(server.host_token) as client:  # a read starts the conversation's actor
        conv = client.conversation(AGENT, "load", "chat-0", owner_id="user-0")
        assert len(conv.history()) == PER_THREAD
    assert scrape(server, SCRAPE_SECRET)[("fermix_live_conversations", ())] >= 1
    text = get(f"{server.url}/metrics", SCRAPE_SECRET)[2].decode()
    assert "user-0" not in text and "chat-0" not in text  # no owner nor chat id as a label


def test_o1_n2_metrics_need_an_operator_or_the_scrape_token(scraped: ServerProcess) -> None:
    server = scraped
    url = f"{server.url}/metrics"
    status, _, body = get(url, None)
    assert status == 401
    assert b'"header.authorization"' in body
    status, _, body = get(url, "not-a-token")
    assert status == 401
    status, headers, body = get(url, server.host_token)
    assert status == 403
    assert headers["content-type"].startswith("application/json")
    assert b"metrics_token_sha256" in body
    assert get(url, SCRAPE_SECRET)[0] == 200
    assert get(url, server.operator_token)[0] == 200


def test_o1_n2_the_scrape_token_reads_nothing_but_the_metrics(scraped: ServerProcess) -> None:
    server = scraped
    for path in ("/v1/status", f"/v1/agents/{AGENT}/memories", "/v1/jobs"):
        status, _, body = get(server.url + path, SCRAPE_SECRET)
        assert status == 401, (path, body)


def test_o1_without_a_scrape_token_configured_only_the_operator_reads_metrics(
    start_server: StartServer,
) -> None:
    server = start_server("[fermix_core.embedding]\nenabled = false\n")
    url = f"{server.url}/metrics"
    assert get(url, SCRAPE_SECRET)[0] == 401
    assert get(url, server.host_token)[0] == 403
    status, _, body = get(url, server.operator_token)
    assert status == 200
    families: dict[str, Any] = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert {"fermix_appends", "fermix_commits", "fermix_reviews", "fermix_model_calls"} <= set(
        families
    )
