"""The operator's console over plain HTTP, no browser: who gets in and what a write needs (W2).

Against a real server process (``module_server``): the sign-in page for anyone without a
session, the session cookie's flags, the security headers, CSRF and cross-site refusals,
sign-out and revocation ending the session server-side, a host token never signing in,
setup's values checked as ``fermix config set`` checks them. Session expiry runs the app
in this process over a real Memory, with the sessions on a clock the test moves (W2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from server_fixtures import ServerProcess

from fermix.api import Memory
from fermix.model import ApiToken
from fermix.server.http.app import create_app
from fermix.server.http.sessions import COOKIE, MAX_SESSIONS, Sessions

ASSETS = Path(__file__).parents[2] / "fermix" / "server" / "http" / "console_assets"


@pytest.fixture
def http(module_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=module_server.url, follow_redirects=False, timeout=10) as client:
        yield client


def sign_in(http: httpx.Client, secret: str) -> httpx.Response:
    return http.post(
        "/console/signin",
        content=f"token={secret}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )


def signed_in(http: httpx.Client, server: ServerProcess) -> str:
    """Sign in with the operator token; the session's CSRF token."""
    answer = sign_in(http, server.operator_token)
    assert answer.status_code == 303, answer.text
    session = http.get("/console/api/session")
    assert session.status_code == 200, session.text
    return str(session.json()["csrf"])


def is_signin_page(answer: httpx.Response) -> bool:
    return (
        answer.status_code in (200, 401)
        and 'name="token"' in answer.text
        and ("app.js" not in answer.text)
    )


def test_w2_without_a_session_every_console_page_is_the_sign_in_page(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    """No token, a bearer operator token and a forged cookie all get the sign-in page."""
    assert is_signin_page(http.get("/console"))
    assert is_signin_page(http.get("/console/"))
    bearer = {"Authorization": f"Bearer {module_server.operator_token}"}
    assert is_signin_page(http.get("/console/", headers=bearer))
    assert http.get("/console/api/session", headers=bearer).status_code == 401
    with httpx.Client(base_url=module_server.url, cookies={COOKIE: "forged"}) as forged:
        assert is_signin_page(forged.get("/console/"))
        assert forged.get("/console/api/setup").status_code == 401


def test_w2_console_answers_carry_a_strict_csp_and_no_sniffing(http: httpx.Client) -> None:
    for path in ("/console/", "/console/assets/app.js", "/console/api/session"):
        headers = http.get(path).headers
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"  # no-referrer would make Origin null


def test_w2_pages_have_no_inline_script_or_style_and_values_go_in_as_text() -> None:
    """What the CSP refuses is not in the pages; no asset writes markup from values."""
    for page in ASSETS.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), page.name
        assert "<style" not in text and " style=" not in text
        assert not re.search(r"\son[a-z]+\s*=", text, re.IGNORECASE), page.name
    for script in ASSETS.glob("*.js"):
        text = script.read_text(encoding="utf-8")
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (script.name, sink)


def test_w2_only_listed_assets_are_served(http: httpx.Client) -> None:
    assert http.get("/console/assets/app.js").headers["content-type"].startswith("text/javascript")
    for name in ("sessions.py", "..%2Fsessions.py", "index.html", "%2e%2e%2fapp.py"):
        assert http.get(f"/console/assets/{name}").status_code == 404


def test_w2_an_operator_token_is_exchanged_for_a_strict_httponly_cookie(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    answer = sign_in(http, module_server.operator_token)
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    flags = [part.strip().lower() for part in cookie.split(";")]
    assert "httponly" in flags
    assert "samesite=strict" in flags
    assert "path=/" in flags
    assert any(f.startswith("max-age=") and int(f.split("=")[1]) > 0 for f in flags)
    assert "secure" not in flags  # plain HTTP on loopback; Secure when over TLS
    assert module_server.operator_token not in cookie
    assert "app.js" in http.get("/console/").text


def test_w2_a_host_token_or_garbage_never_signs_in(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    for secret in (module_server.host_token, "", "fmx_nope", "<script>alert(1)</script>"):
        answer = sign_in(http, secret)
        assert answer.status_code == 401
        assert "set-cookie" not in answer.headers
        assert is_signin_page(answer)
    assert is_signin_page(http.get("/console/"))


def test_w2_a_sign_in_posted_from_another_site_is_refused(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    answer = http.post(
        "/console/signin",
        content=f"token={module_server.operator_token}",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Origin": "http://evil.example",
        },
    )
    assert answer.status_code == 403
    assert "set-cookie" not in answer.headers


def test_w2_every_write_needs_the_sessions_csrf_token_and_this_origin(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    """No, a wrong, or the right token from another Origin: 403 naming the header, and
    config.toml is not touched; then the right token from this origin writes."""
    csrf = signed_in(http, module_server)
    config = module_server.home / "config.toml"
    before = config.read_text(encoding="utf-8") if config.exists() else None
    body = {"key": "fermix_core.memory.review_interval_hours", "value": "3"}
    refusals = [
        ({}, "header.x-csrf-token"),
        ({"X-CSRF-Token": "wrong"}, "header.x-csrf-token"),
        ({"X-CSRF-Token": csrf, "Origin": "http://evil.example"}, "header.origin"),
        ({"X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"}, "header.sec-fetch-site"),
    ]
    for headers, field in refusals:
        answer = http.post("/console/api/setup", json=body, headers=headers)
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["field"] == field
        # The /v1 routes take the session the same way: a forged restore is refused too.
        answer = http.post("/v1/memories/1/restore", headers=headers)
        assert answer.status_code == 403, answer.text
    after = config.read_text(encoding="utf-8") if config.exists() else None
    assert after == before
    assert http.get("/v1/status").status_code == 200  # a read needs the session only
    good = http.post("/console/api/setup", json=body, headers={"X-CSRF-Token": csrf})
    assert good.status_code == 200, good.text
    assert "review_interval_hours = 3" in config.read_text(encoding="utf-8")
    http.post(
        "/console/api/setup",
        json={"key": body["key"], "value": ""},
        headers={"X-CSRF-Token": csrf},
    )


def test_w1_setup_refuses_a_bad_value_naming_the_field_and_changes_nothing(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    csrf = signed_in(http, module_server)
    config = module_server.home / "config.toml"
    before = config.read_text(encoding="utf-8") if config.exists() else None
    for key, value, field in [
        ("fermix_core.memory.review_interval_hours", "-1", "body.value"),
        ("fermix_core.memory.review_interval_hours", "soon", "body.value"),
        ("fermix_core.compaction.threshold", "7", "body.value"),
        ("fermix_core.server.host", "0.0.0.0", "body.key"),
    ]:
        answer = http.post(
            "/console/api/setup", json={"key": key, "value": value}, headers={"X-CSRF-Token": csrf}
        )
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["field"] == field
        assert "Traceback" not in error["message"]
    after = config.read_text(encoding="utf-8") if config.exists() else None
    assert after == before


def test_w2_sign_out_ends_the_session_server_side(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    csrf = signed_in(http, module_server)
    kept = http.cookies[COOKIE]
    assert http.post("/console/api/signout").status_code == 403  # a write: CSRF too
    assert http.post("/console/api/signout", headers={"X-CSRF-Token": csrf}).status_code == 200
    # The old cookie, sent again by hand, is dead on the server: not merely cleared.
    again = httpx.Client(base_url=module_server.url, cookies={COOKIE: kept})
    with again:
        assert again.get("/console/api/session").status_code == 401
        assert is_signin_page(again.get("/console/"))


def test_w2_revoking_the_sessions_token_ends_the_session(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    token, secret = module_server.create_token(["assistant"], operator=True, name="brief")
    sign_in(http, secret)
    assert http.get("/console/api/session").status_code == 200
    module_server.revoke_token(token.id)
    assert http.get("/console/api/session").status_code == 401
    assert is_signin_page(http.get("/console/"))


def test_w2_tokens_are_made_only_for_the_sessions_agents(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    csrf = signed_in(http, module_server)
    headers = {"X-CSRF-Token": csrf}
    refused = http.post("/console/api/tokens", json={"agents": ["other"]}, headers=headers)
    assert refused.status_code == 403
    assert refused.json()["error"]["field"] == "body.agents"
    made = http.post("/console/api/tokens", json={"agents": ["assistant"]}, headers=headers)
    assert made.status_code == 201
    secret = made.json()["secret"]
    assert secret.startswith("fmx_")
    listed = http.get("/console/api/tokens").json()["tokens"]
    assert all(secret not in str(t) for t in listed)  # shown once, never listed


def test_w2_a_session_expires_on_its_clock(memory: Memory) -> None:
    """Expiry is enforced server-side: past ``ttl_s`` the same cookie is refused."""
    now = [1000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    _, secret = memory.tokens.create(["assistant"], operator=True, name="op")
    with TestClient(create_app(memory, console_sessions=sessions)) as client:
        answer = client.post(
            "/console/signin",
            content=f"token={secret}",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        )
        assert answer.status_code == 303
        assert client.get("/console/api/session").status_code == 200
        now[0] += 59
        assert client.get("/console/api/session").status_code == 200
        now[0] += 2
        assert client.get("/console/api/session").status_code == 401
        assert 'name="token"' in client.get("/console/").text


def _token(token_id: int) -> ApiToken:
    return ApiToken(token_id, "op", "fmx_abc", ("assistant",), True, 0)


def test_w2_sessions_are_random_bounded_and_end_with_their_token() -> None:
    """Each id and CSRF token is fresh; the oldest session goes past MAX_SESSIONS; revoking
    a token ends its sessions only; an id is kept by its hash, never as given."""
    sessions = Sessions(ttl_s=60, clock=lambda: 0.0)
    first, session = sessions.create(_token(1))
    second, other = sessions.create(_token(2))
    assert first != second and session.csrf != other.csrf and len(first) >= 43
    assert first not in repr(vars(sessions))
    assert sessions.end_token(1) == 1
    assert sessions.get(first) is None and sessions.get(second) == other
    made = [sessions.create(_token(3))[0] for _ in range(MAX_SESSIONS)]
    assert sessions.get(second) is None  # the oldest went first
    assert sessions.get(made[-1]) is not None
    assert sessions.end(made[-1]) and not sessions.end(made[-1])


def test_w2_signing_in_again_replaces_the_session(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    sign_in(http, module_server.operator_token)
    first = http.cookies[COOKIE]
    sign_in(http, module_server.operator_token)
    assert http.cookies[COOKIE] != first
    assert http.get("/console/api/session").status_code == 200
    with httpx.Client(base_url=module_server.url, cookies={COOKIE: first}) as stale:
        assert stale.get("/console/api/session").status_code == 401


def test_w1_voice_transcripts_set_in_setup_apply_without_a_restart(
    http: httpx.Client, module_server: ServerProcess
) -> None:
    """persist_transcripts is read per transcript: the running server stores one as soon
    as the console turns it on, and stops when it is unset."""
    csrf = signed_in(http, module_server)
    bearer = {"Authorization": f"Bearer {module_server.operator_token}"}
    voice = {"device_id": "kitchen", "role": "user", "text": "hello", "owner_id": "ana"}
    key = "fermix_core.realtime.persist_transcripts"

    def stored() -> bool:
        answer = http.post("/v1/agents/assistant/voice", json=voice, headers=bearer)
        assert answer.status_code == 200, answer.text
        return answer.json()["message"] is not None

    assert not stored()
    state = http.post(
        "/console/api/setup", json={"key": key, "value": "true"}, headers={"X-CSRF-Token": csrf}
    ).json()
    applies = {k["key"]: k["applies"] for k in state["keys"]}
    assert set(applies.values()) == {"now"}  # every setup key applies live (W1)
    try:
        assert stored()
    finally:
        http.post(
            "/console/api/setup", json={"key": key, "value": ""}, headers={"X-CSRF-Token": csrf}
        )
    assert not stored()
