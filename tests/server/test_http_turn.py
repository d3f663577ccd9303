"""The turn routes over real HTTP to a real server process: statuses, errors, trust (N1-N3).

Raw requests (urllib3), so each test sees exactly what any host in any language gets: the
status, the headers and the JSON. The Python client's own tests are in test_client.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from server_fixtures import AGENT, ServerProcess, StartServer

from fermix.home import Home
from fermix.server import service
from fermix.wire import decode_handle, encode_handle

HTTP = urllib3.PoolManager(retries=False, timeout=30)


def call(
    server: ServerProcess,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request; its status, headers (lower-case names) and decoded JSON."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    answer = HTTP.request(method, server.url + path, json=body, headers=sent)
    data = answer.json() if answer.data else None
    return answer.status, {k.lower(): v for k, v in answer.headers.items()}, data


def open_conv(
    server: ServerProcess, chat: str, *, token: str | None = None, **body: Any
) -> dict[str, Any]:
    status, _, data = call(
        server,
        "POST",
        "/v1/conversations/open",
        token=token or server.host_token,
        body={"agent_id": AGENT, "channel": "http", "chat_id": chat, **body},
    )
    assert status == 200, data
    opened: dict[str, Any] = data
    return opened


def messages_path(opened: dict[str, Any]) -> str:
    return f"/v1/conversations/{opened['handle']}/messages"


def test_n1_the_openapi_document_describes_the_turn_routes(module_server: ServerProcess) -> None:
    status, _, doc = call(module_server, "GET", "/openapi.json")
    assert status == 200
    paths = doc["paths"]
    for path in ("/v1/conversations/open", "/v1/conversations/{handle}/messages"):
        assert path in paths
    append = paths["/v1/conversations/{handle}/messages"]["post"]
    assert set(append["responses"]) >= {"201", "200", "422"}
    fields = doc["components"]["schemas"]["AppendRequest"]["properties"]
    assert fields["role"]["enum"] == ["user", "assistant", "system", "tool"]
    assert all(fields[name].get("description") for name in ("role", "text", "client_key"))


def test_n3_a_replayed_append_is_stored_once_and_answered_200(
    module_server: ServerProcess,
) -> None:
    opened = open_conv(module_server, "replay")
    body = {"role": "user", "text": "I moved to Porto", "client_key": "turn-1"}
    token = module_server.host_token
    first = call(module_server, "POST", messages_path(opened), token=token, body=body)
    again = call(module_server, "POST", messages_path(opened), token=token, body=body)
    assert first[0] == 201 and "idempotent-replayed" not in first[1]
    assert again[0] == 200 and again[1]["idempotent-replayed"] == "true"
    assert again[2] == first[2] and first[2]["client_key"] == "turn-1"
    _, _, window = call(module_server, "GET", messages_path(opened), token=token)
    assert [m["content"] for m in window["messages"]] == ["I moved to Porto"]

    status, _, error = call(
        module_server,
        "POST",
        messages_path(opened),
        token=token,
        body={**body, "text": "something else"},
    )
    assert status == 409 and error["error"]["type"] == "conflict"
    assert "turn-1" in error["error"]["message"]
    _, _, window = call(module_server, "GET", messages_path(opened), token=token)
    assert len(window["messages"]) == 1


def test_n3_a_replayed_commit_is_stored_once(module_server: ServerProcess) -> None:
    opened = open_conv(module_server, "commit-replay")
    path = f"/v1/conversations/{opened['handle']}/commit"
    body = {"reply": "Noted.", "usage": {"prompt_tokens": 12}, "client_key": "reply-1"}
    token = module_server.host_token
    assert call(module_server, "POST", path, token=token, body=body)[0] == 201
    status, headers, message = call(module_server, "POST", path, token=token, body=body)
    assert status == 200 and headers["idempotent-replayed"] == "true"
    assert message["role"] == "assistant" and message["content"] == "Noted."
    _, _, state = call(
        module_server, "GET", f"/v1/conversations/{opened['handle']}/state", token=token
    )
    assert state["peak_prompt_tokens"] == 12


def test_n7_stored_appends_are_counted_and_replays_are_not(module_server: ServerProcess) -> None:
    paths = service.ServicePaths.of(Home(module_server.home))
    before = service.query_status(paths)["totals"].get("appends", 0)
    opened = open_conv(module_server, "count")
    for key in ("a", "b", "a"):
        body = {"role": "user", "text": f"text {key}", "client_key": key}
        call(
            module_server, "POST", messages_path(opened), token=module_server.host_token, body=body
        )
    assert service.query_status(paths)["totals"]["appends"] - before == 2


def test_n2_no_token_unknown_or_revoked_is_401_json(module_server: ServerProcess) -> None:
    server = module_server
    opened = open_conv(server, "auth")
    status, headers, error = call(server, "GET", messages_path(opened))
    assert status == 401 and error["error"]["field"] == "header.authorization"
    assert headers["www-authenticate"] == "Bearer"
    assert call(server, "GET", messages_path(opened), token="fmx_" + "x" * 43)[0] == 401
    status, _, error = call(
        server, "GET", messages_path(opened), headers={"Authorization": "Basic abc"}
    )
    assert status == 401 and error["error"]["type"] == "unauthorized"

    token, secret = server.create_token([AGENT], name="soon revoked")
    assert call(server, "GET", messages_path(opened), token=secret)[0] == 200
    server.revoke_token(token.id)
    status, _, error = call(server, "GET", messages_path(opened), token=secret)
    assert status == 401 and "revoked" in error["error"]["message"]


def test_n2_a_token_acts_only_for_its_agents(module_server: ServerProcess) -> None:
    server = module_server
    _, other = server.create_token(["another-agent"], name="other")
    opened = open_conv(server, "agents")
    status, _, error = call(server, "GET", messages_path(opened), token=other)
    assert status == 403 and error["error"]["field"] == "path.handle"
    status, _, error = call(
        server,
        "POST",
        "/v1/conversations/open",
        token=other,
        body={"agent_id": AGENT, "channel": "http", "chat_id": "agents"},
    )
    assert status == 403 and error["error"]["field"] == "body.agent_id"


def test_n2_m2_a_host_token_is_a_guest_even_for_a_listed_operator(
    start_server: StartServer,
) -> None:
    server = start_server('[fermix_core.security]\noperators = ["alice"]\n')
    host = server.host_token
    status, _, error = call(
        server,
        "POST",
        "/v1/conversations/open",
        token=host,
        body={"agent_id": AGENT, "channel": "http", "chat_id": "t", "trust": "operator"},
    )
    assert status == 403 and error["error"]["field"] == "body.trust"

    opened = open_conv(server, "t", owner_id="alice")
    assert opened["trust"] == "guest"
    _, _, message = call(
        server, "POST", messages_path(opened), token=host, body={"role": "user", "text": "hi"}
    )
    assert message["owner_id"] == "alice" and message["trust"] == "guest"
    status, _, _ = call(
        server,
        "POST",
        messages_path(opened),
        token=host,
        body={"role": "user", "text": "hi", "trust": "operator"},
    )
    assert status == 403
    # A handle edited to say "operator" gains nothing: the trust follows the token.
    key, owner, _ = decode_handle(opened["handle"])
    forged = f"/v1/conversations/{encode_handle(key, owner, 'operator')}/messages"
    assert call(server, "GET", forged, token=host)[0] == 403

    # The operator token gets the config's default for alice: operator.
    as_operator = open_conv(server, "t", token=server.operator_token, owner_id="alice")
    assert as_operator["trust"] == "operator"
    _, _, message = call(
        server,
        "POST",
        messages_path(as_operator),
        token=server.operator_token,
        body={"role": "user", "text": "hello"},
    )
    assert message["trust"] == "operator"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "owner", "text": "hi"}, "body.role"),
        ({"role": "user"}, "body.text"),
        ({"role": "user", "text": 5}, "body.text"),
        ({"role": "user", "text": "hi", "owner_id": "a\x00b"}, "body.owner_id"),
        ({"role": "user", "text": "hi", "metadata": []}, "body.metadata"),
        ({"role": "user", "text": "hi", "txt": "typo"}, "body.txt"),
    ],
)
def test_n1_a_bad_append_is_422_naming_the_field(
    module_server: ServerProcess, body: dict[str, Any], field: str
) -> None:
    opened = open_conv(module_server, "bad-append")
    status, _, error = call(
        module_server, "POST", messages_path(opened), token=module_server.host_token, body=body
    )
    assert status == 422, error
    assert error["error"]["type"] == "invalid_input" and error["error"]["field"] == field


@pytest.mark.parametrize("handle", ["not-a-handle", "bm9wZQ", "e30"])
def test_n1_a_bad_handle_is_422_naming_the_path(module_server: ServerProcess, handle: str) -> None:
    status, _, error = call(
        module_server,
        "GET",
        f"/v1/conversations/{handle}/messages",
        token=module_server.host_token,
    )
    assert status == 422 and error["error"]["field"] == "path.handle"
    assert "Traceback" not in error["error"]["message"]


def test_k4_a_guests_new_is_refused_and_changes_nothing(module_server: ServerProcess) -> None:
    opened = open_conv(module_server, "guest-new")
    token = module_server.host_token
    call(
        module_server,
        "POST",
        messages_path(opened),
        token=token,
        body={"role": "user", "text": "a"},
    )
    command = f"/v1/conversations/{opened['handle']}/command"
    status, _, answer = call(module_server, "POST", command, token=token, body={"text": "/new"})
    assert status == 200 and "operator" in answer["reply"]
    _, _, window = call(module_server, "GET", messages_path(opened), token=token)
    assert [m["content"] for m in window["messages"]] == ["a"]
    status, _, answer = call(module_server, "POST", command, token=token, body={"text": "hello"})
    assert status == 200 and answer["reply"] is None

    as_operator = open_conv(
        module_server, "guest-new", token=module_server.operator_token, trust="operator"
    )
    path = f"/v1/conversations/{as_operator['handle']}/command"
    status, _, answer = call(
        module_server, "POST", path, token=module_server.operator_token, body={"text": "/new"}
    )
    assert status == 200 and answer["reply"]
    _, _, window = call(module_server, "GET", messages_path(opened), token=token)
    assert window["messages"] == []


def test_n1_state_of_an_empty_conversation_is_404_json(module_server: ServerProcess) -> None:
    opened = open_conv(module_server, "never-written")
    path = f"/v1/conversations/{opened['handle']}/state"
    status, _, error = call(module_server, "GET", path, token=module_server.host_token)
    assert status == 404 and error["error"]["type"] == "not_found"


def test_t4_tools_run_for_the_conversation_and_refusals_are_content(
    module_server: ServerProcess,
) -> None:
    token = module_server.host_token
    status, _, tools = call(module_server, "GET", "/v1/tools", token=token)
    names = {tool["function"]["name"] for tool in tools["tools"]}
    assert status == 200 and "memory_store" in names
    opened = open_conv(module_server, "tools", owner_id="bob")
    path = f"/v1/conversations/{opened['handle']}/tools/run"
    store = {"function": {"name": "memory_store", "arguments": '{"key": "pet", "value": "cat"}'}}
    status, _, stored = call(module_server, "POST", path, token=token, body={"tool_call": store})
    assert status == 200 and "error" not in stored["content"]
    recall = {"function": {"name": "memory_recall", "arguments": '{"key": "pet"}'}}
    _, _, found = call(module_server, "POST", path, token=token, body={"tool_call": recall})
    assert "cat" in found["content"]
    unknown = {"function": {"name": "rm_rf", "arguments": "{}"}}
    status, _, refused = call(module_server, "POST", path, token=token, body={"tool_call": unknown})
    assert status == 200 and "error" in refused["content"]
