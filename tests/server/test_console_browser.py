"""The operator's console in a real browser: headless Chromium driven by Playwright (W3).

One walk through every page against a real server process (``start_server``), at 360 px
wide (W1): sign in, find a row, archive and restore it, forget one, roll USER.md back and
read the diff, change the review interval and find it in config.toml (its comment kept),
create and revoke a token, read why a review failed (its model answered 500: the loopback
model server) and the latency chart; hostile values from the catalogue show as text; a
host token, a forged
cross-site form and writes without the session's CSRF token change nothing (W2). A
screenshot of each page is saved under the test's ``tmp_path`` and its path printed.

Debian's ``chromium`` is the browser (Playwright's own download is not used). In CI
(``CI=true``) a missing browser fails the test; elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import fact, other_process
from hostile_data import TEXTS
from model_server import ModelServer
from server_fixtures import AGENT, ServerProcess, StartServer

from fermix.server.http.sessions import COOKIE

CHROMIUM = os.environ.get("FERMIX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDTH = 360
TIMEOUT_MS = 15_000
MARKUP = [t for t in TEXTS if "<script" in t] + [
    t for t in TEXTS if ("<" in t or "&" in t) and "<script" not in t
][:5]
"""Hostile catalogue texts that would be markup if a page ever parsed them as HTML."""
HOSTILE_OWNER = "<script>alert(1)</script>"
"""An owner id from the catalogue: shown as an option's text, never run."""
BROKEN_MODEL = "openai/broken"
"""The route's model: the loopback server answers its review with a 500."""


def config(model_server: ModelServer) -> str:
    return f"""\
# Hand-written: this comment must survive the console's edit (W1).
[fermix_core.memory]
review_interval_hours = 24.0

[fermix_core.model]
primary = "{BROKEN_MODEL}"
api_base = "{model_server.url}"
"""


def _browser_or_skip() -> Any:
    """Playwright's sync API, or a skip (locally) / failure (CI) saying what is missing."""
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing = f"playwright is not installed ({exc})"
    if missing is None and not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"W3 needs a browser in CI: {missing}")
        pytest.skip(f"W3 needs a browser: {missing}")
    return sync_playwright


def _seed(home: Path) -> None:
    """alice's drink, tea then coffee (USER.md revisions), and hostile facts, written as
    another process writes them before the server starts."""
    rows = [("drink", "Drinks green tea"), ("drink", "Drinks black coffee")]
    rows += [(f"hostile{i}", text) for i, text in enumerate(MARKUP)]
    for key, value in rows:
        with other_process(home) as writer:
            unit = fact("preference", key, value, agent_id=AGENT, owner_id="alice")
            assert writer.write_rows(unit, label="seed", also=[(AGENT, "alice")]).error is None


class _Attacker(BaseHTTPRequestHandler):
    """Another site's page: a form that posts to the console as soon as it loads."""

    target = ""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        page = (
            "<!doctype html><html><body>"
            f'<form id="f" method="post" action="{self.target}"></form>'
            "<script>document.getElementById('f').submit()</script></body></html>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)


@pytest.fixture
def attacker() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


class Walk:
    """The page, the server, and the screenshots taken so far."""

    def __init__(self, page: Any, server: ServerProcess, shots: Path) -> None:
        self.page = page
        self.server = server
        self.shots = shots
        self.taken: list[Path] = []
        self.api = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {server.operator_token}"},
            timeout=10,
        )

    def shot(self, name: str) -> None:
        path = self.shots / f"console-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.taken.append(path)
        # Readable at 360 px: nothing wider than the viewport but what scrolls in its box.
        width = self.page.evaluate("document.documentElement.scrollWidth")
        assert width <= WIDTH + 1, f"{name} is {width} px wide at {WIDTH} px"
        # Labelled controls: every input and select has a label a screen reader names.
        unlabelled = self.page.evaluate(
            "[...document.querySelectorAll('input, select, textarea')]"
            ".filter(e => e.labels.length === 0 && !e.getAttribute('aria-label'))"
            ".map(e => e.id || e.name)"
        )
        assert unlabelled == [], f"{name}: controls without a label: {unlabelled}"

    def notice(self, pattern: str) -> None:
        self.page.wait_for_function(
            "p => new RegExp(p).test(document.getElementById('notice').textContent)",
            arg=pattern,
        )

    def go(self, page: str) -> None:
        self.page.get_by_role("link", name=page, exact=True).click()

    def row(self, key: str) -> dict[str, Any]:
        found = self.api.get(
            f"/v1/agents/{AGENT}/memories",
            params={"owner_id": "alice", "key": key, "include_archived": True},
        ).json()["memories"]
        assert len(found) == 1, found
        return dict(found[0])

    def user_md(self) -> dict[str, Any]:
        answer = self.api.get(f"/v1/agents/{AGENT}/resources/user_md", params={"owner_id": "alice"})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def test_w3_the_console_in_headless_chromium_does_each_page_and_refuses_forgeries(
    start_server: StartServer,
    home: Path,
    tmp_path: Path,
    attacker: ThreadingHTTPServer,
    model_server: ModelServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """W1-W3: every page by its labelled controls in a real browser, and what is refused.
    The screenshots' paths are printed past pytest's capture, so a CI log names them."""
    sync_playwright = _browser_or_skip()
    _seed(home)
    server = start_server(config(model_server))
    client = server.client()
    talk = client.conversation(AGENT, "telegram", "hostile", owner_id=HOSTILE_OWNER)
    for text in MARKUP:
        talk.append_user(text)
    model_server.fail(500)  # the review's one model call: failed, and the reason kept
    assert client.review(talk).status == "failed"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": 800})
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
            walk = Walk(page, server, tmp_path)
            try:
                _walk(walk, context, attacker, dialogs)
            finally:
                walk.api.close()
                with capsys.disabled():
                    for path in walk.taken:
                        print(f"\nW3 screenshot: {path}", end="")
        finally:
            browser.close()


def _walk(walk: Walk, context: Any, attacker: ThreadingHTTPServer, dialogs: list[str]) -> None:
    page, server = walk.page, walk.server

    # -- sign-in: a host token is refused, the operator's gets in ---------------------------
    page.goto(f"{server.url}/console")
    walk.shot("signin")
    page.get_by_label("Operator token", exact=True).fill(server.host_token)
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.get_by_role("alert").wait_for()
    assert "not a live operator token" in page.get_by_role("alert").text_content()
    assert not [c for c in context.cookies() if c["name"] == COOKIE]
    page.get_by_label("Operator token", exact=True).fill(server.operator_token)
    page.keyboard.press("Enter")  # by keyboard: the form submits from its field
    page.get_by_label("Owner", exact=True).wait_for()
    cookie = next(c for c in context.cookies() if c["name"] == COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    # -- people: find a row, archive it, restore it ------------------------------------------
    page.get_by_label("Owner", exact=True).select_option("alice")
    page.get_by_label("Search", exact=True).fill("coffee")
    page.get_by_role("button", name="Find", exact=True).click()
    page.locator("#rows td", has_text="Drinks black coffee").wait_for()
    page.get_by_label("Search", exact=True).fill("")
    page.get_by_role("button", name="Find", exact=True).click()
    page.get_by_role("cell", name="hostile0", exact=True).wait_for()
    cells = page.locator("#rows td").all_text_contents()
    for text in MARKUP:  # hostile values are text in cells, never elements
        assert text in cells, text
    assert page.locator("main script, main img, main iframe").count() == 0
    walk.shot("people")
    page.get_by_role("button", name="Archive drink", exact=True).click()
    walk.notice("archived")
    assert walk.row("drink")["archived_at"] is not None
    page.get_by_label("Archived", exact=True).select_option("archived")
    page.get_by_role("button", name="Find", exact=True).click()
    page.get_by_role("button", name="Restore drink", exact=True).click()
    walk.notice("restored")
    assert walk.row("drink")["archived_at"] is None

    # -- forget a row: erased for good, after the browser's confirmation ---------------------
    page.get_by_label("Archived", exact=True).select_option("live")
    page.get_by_role("button", name="Find", exact=True).click()
    doomed = walk.row("hostile0")
    page.get_by_role("button", name="Forget hostile0", exact=True).click()
    walk.notice(f"Row {doomed['id']} forgotten")
    assert dialogs == [f"Erase row {doomed['id']} for good?"]
    dialogs.clear()
    gone = walk.api.get(
        f"/v1/agents/{AGENT}/memories",
        params={"owner_id": "alice", "key": "hostile0", "include_archived": True},
    )
    assert gone.json()["memories"] == []
    assert page.get_by_role("cell", name="hostile1", exact=True).count() == 1
    assert page.get_by_role("cell", name="hostile0", exact=True).count() == 0

    # -- prompt files: roll USER.md back to the tea, read the diff ---------------------------
    before = walk.user_md()
    assert "black coffee" in before["content"]
    page.get_by_label("File", exact=True).select_option("user_md")
    page.locator("#file-text", has_text="black coffee").wait_for()
    # The file holds "&lt;" as the renderer escaped it: as text it stays those four letters.
    assert "&lt;/memory-context&gt;" in page.locator("#file-text").text_content()
    page.get_by_role("button", name="Roll USER.md back to revision 1", exact=True).click()
    walk.notice("rolled back to revision 1")
    after = walk.user_md()
    assert "green tea" in after["content"] and "black coffee" not in after["content"]
    page.get_by_role(
        "button", name=f"Diff USER.md revision {before['revision']} with current", exact=True
    ).click()
    diff = page.locator("#diff")
    diff.filter(has_text="green tea").wait_for()
    assert "-" in diff.locator(".diff-del").first.text_content()
    assert "black coffee" in " ".join(diff.locator(".diff-del").all_text_contents())
    assert "green tea" in " ".join(diff.locator(".diff-add").all_text_contents())
    walk.shot("people-diff")

    # -- a hostile owner's conversation: its id and messages are text ----------------------
    assert HOSTILE_OWNER in page.locator("#owner option").all_text_contents()
    page.get_by_label("Owner", exact=True).select_option(HOSTILE_OWNER)
    page.get_by_role("button", name="Messages of telegram hostile", exact=True).click()
    page.locator("#messages td").first.wait_for()
    cells = page.locator("#messages td").all_text_contents()
    for text in MARKUP:
        assert text in cells, text
    assert page.locator("main script, main img, main iframe").count() == 0
    walk.shot("people-messages")

    # -- setup: the review interval, written into config.toml with its comment kept ----------
    walk.go("Setup")
    interval = page.get_by_label("memory.review_interval_hours", exact=True)
    interval.fill("6")
    interval.press("Enter")
    walk.notice("saved")
    written = (server.home / "config.toml").read_text(encoding="utf-8")
    assert "review_interval_hours = 6" in written
    assert "# Hand-written: this comment must survive" in written
    interval = page.get_by_label("memory.review_interval_hours", exact=True)
    interval.fill("-3")
    interval.press("Enter")
    walk.notice("must be")
    assert "bad" in (page.locator("#notice").get_attribute("class") or "")
    assert (server.home / "config.toml").read_text(encoding="utf-8") == written
    walk.shot("setup")

    # -- tokens: create one (its secret once), revoke it --------------------------------------
    walk.go("Tokens")
    page.get_by_label("Name", exact=True).fill("temporary")
    page.get_by_role("button", name="Create token", exact=True).click()
    secret = page.locator("#new-secret").text_content()
    assert secret.startswith("fmx_")
    assert httpx.get(f"{server.url}/v1/jobs", headers=_bearer(secret)).status_code == 200
    revoke = page.get_by_role("button", name=re.compile(r"^Revoke token \d+$")).last
    revoke.click()
    walk.notice("revoked")
    assert httpx.get(f"{server.url}/v1/jobs", headers=_bearer(secret)).status_code == 401
    walk.shot("tokens")

    # -- reviews and jobs; status ------------------------------------------------------------
    walk.go("Reviews and jobs")
    page.get_by_role("heading", name="Recent reviews and compactions").wait_for()
    reason = f"model_error: unavailable: {BROKEN_MODEL} InternalServerError"
    page.get_by_role("cell", name=reason, exact=True).wait_for()  # why it failed, as text
    failed = page.locator("section", has_text="Failed").locator("li").all_text_contents()
    assert any(HOSTILE_OWNER in f and f.endswith(f"review: {reason}") for f in failed), failed
    walk.shot("reviews")
    walk.go("Status")
    page.locator("#status-now td", has_text="live_conversations").wait_for()
    assert page.get_by_role("img", name=re.compile("^Append and compose latency")).count() == 1
    page.locator("#status-now td", has_text="latency.append.p99_ms").wait_for()
    page.get_by_role("button", name="Run doctor's checks", exact=True).click()
    page.locator("#doctor td").first.wait_for()
    walk.shot("status")

    # -- what is refused: a host token, writes without CSRF, a forged cross-site form -------
    archived = walk.api.post(
        f"/v1/agents/{AGENT}/memories/archive",
        json={
            "key": "drink",
            "scope_type": "owner",
            "scope_id": "alice",
            "owner_id": "alice",
            "trust": "operator",
            "source": "test",
        },
    )
    assert archived.status_code == 200, archived.text
    drink = walk.row("drink")
    assert drink["archived_at"] is not None
    file_now = walk.user_md()
    host = httpx.post(
        f"{server.url}/v1/agents/{AGENT}/resources/user_md/rollback",
        json={"revision": 2, "owner_id": "alice"},
        headers=_bearer(server.host_token),
    )
    assert host.status_code == 403
    restore = f"/v1/memories/{drink['id']}/restore"
    for headers in ({}, {"X-CSRF-Token": "forged"}, {"Origin": "http://evil.example"}):
        answer = context.request.post(f"{server.url}{restore}", headers=headers)
        assert answer.status == 403, answer.text()
    evil = f"http://localhost:{attacker.server_address[1]}/"
    _Attacker.target = f"{server.url}{restore}"
    with page.expect_navigation(url=re.compile(re.escape(server.url))):
        page.goto(evil)
    assert walk.row("drink")["archived_at"] is not None  # nothing restored
    assert walk.user_md()["revision"] == file_now["revision"]
    assert dialogs == []  # no hostile value ever ran as script

    # -- sign-out ends the session on the server ----------------------------------------------
    page.goto(f"{server.url}/console/#people")
    page.get_by_role("button", name="Sign out", exact=True).click()
    page.get_by_label("Operator token", exact=True).wait_for()
    # The old cookie, sent again by hand, is dead on the server, not merely cleared.
    again = httpx.get(f"{server.url}/console/api/session", cookies={COOKIE: cookie["value"]})
    assert again.status_code == 401


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}
