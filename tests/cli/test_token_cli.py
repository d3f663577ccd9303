"""``fermix token create | list | revoke`` as real processes, and a revoked token refused by
a running server (N2).

Each command runs as ``python -m fermix.cli --home H token ...``, as an operator types it.
The secret is printed once, by ``create``; nothing printed afterwards contains it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fermix.home import Home
from fermix.server.serving import read_server_file


def _fermix(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200"},
    )


def _create(home: Path, *args: str) -> dict[str, Any]:
    made = _fermix(home, "token", "create", "--json", *args)
    assert made.returncode == 0, made.stderr
    data: dict[str, Any] = json.loads(made.stdout)
    return data


def test_n2_create_prints_the_secret_once_and_says_it_will_not_be_shown_again(home: Path) -> None:
    made = _fermix(home, "token", "create", "--agent", "tutor", "--agent", "coach", "--name", "bot")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    secret = lines[0]
    assert secret.startswith("fmx_") and len(secret) == 47  # alone on its line, to copy
    assert "will not be shown again" in made.stdout
    assert "tutor, coach" in made.stdout and "(bot)" in made.stdout

    listed = _fermix(home, "token", "list")
    assert listed.returncode == 0, listed.stderr
    assert secret[:12] in listed.stdout and secret not in listed.stdout
    assert "bot" in listed.stdout and "tutor, coach" in listed.stdout

    data = json.loads(_fermix(home, "token", "list", "--json").stdout)
    assert secret not in json.dumps(data)
    (token,) = data["tokens"]
    assert token["prefix"] == secret[:12] and "secret" not in token
    assert token["agents"] == ["tutor", "coach"] and token["operator"] is False
    assert token["name"] == "bot" and token["revoked_at"] is None
    assert isinstance(token["created_at"], int)


def test_n2_an_operator_token_says_so_and_json_create_carries_the_secret(home: Path) -> None:
    data = _create(home, "--agent", "tutor", "--operator")
    assert data["operator"] is True and data["secret"].startswith("fmx_")
    assert data["prefix"] == data["secret"][:12] and "not be shown again" in data["note"]
    listed = json.loads(_fermix(home, "token", "list", "--json").stdout)["tokens"]
    assert [(t["id"], t["operator"]) for t in listed] == [(data["id"], True)]


def test_n2_revoke_hides_a_token_from_list_unless_all_and_unknown_ids_exit_3(home: Path) -> None:
    first, second = _create(home, "--agent", "tutor"), _create(home, "--agent", "coach")
    revoked = _fermix(home, "token", "revoke", str(first["id"]))
    assert revoked.returncode == 0 and f"token {first['id']} revoked" in revoked.stdout

    live = json.loads(_fermix(home, "token", "list", "--json").stdout)["tokens"]
    assert [t["id"] for t in live] == [second["id"]]
    every = json.loads(_fermix(home, "token", "list", "--all", "--json").stdout)["tokens"]
    assert [(t["id"], t["revoked_at"] is not None) for t in every] == [
        (first["id"], True),
        (second["id"], False),
    ]

    missing = _fermix(home, "token", "revoke", "999")
    assert missing.returncode == 3 and "no token with id 999" in missing.stderr


def test_n2_create_refuses_a_token_without_an_agent_or_with_a_bad_one(home: Path) -> None:
    none = _fermix(home, "token", "create")
    assert none.returncode == 2 and "--agent" in none.stderr
    bad = _fermix(home, "token", "create", "--agent", "")
    assert bad.returncode == 2 and "must not be empty" in bad.stderr and "fmx_" not in bad.stdout
    assert json.loads(_fermix(home, "token", "list", "--all", "--json").stdout)["tokens"] == []


@pytest.fixture
def server(home: Path) -> Iterator[str]:
    """A running server on ``home`` (the background service, any free port); its url."""
    started = _fermix(home, "server", "start", "--port", "0")
    assert started.returncode == 0, started.stderr
    try:
        found = read_server_file(Home(home))
        assert found is not None
        yield str(found["url"])
    finally:
        _fermix(home, "server", "stop")


def _open(url: str, secret: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(
        f"{url}/v1/conversations/open",
        data=json.dumps({"agent_id": "tutor", "channel": "cli", "chat_id": "c1"}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return (
                answer.status,
                json.loads(answer.read()),
                {k.lower(): v for k, v in answer.headers.items()},
            )
    except urllib.error.HTTPError as error:
        return (
            error.code,
            json.loads(error.read()),
            {k.lower(): v for k, v in error.headers.items()},
        )


@pytest.mark.slow
def test_n2_a_token_revoked_by_the_cli_is_refused_by_the_running_server(
    home: Path, server: str
) -> None:
    token = _create(home, "--agent", "tutor")
    status, body, _ = _open(server, token["secret"])
    assert status == 200 and body["agent_id"] == "tutor"

    assert _fermix(home, "token", "revoke", str(token["id"])).returncode == 0
    status, body, headers = _open(server, token["secret"])
    assert status == 401
    assert body["error"]["type"] == "unauthorized"
    assert body["error"]["field"] == "header.authorization"
    assert headers.get("www-authenticate") == "Bearer"
    assert token["secret"] not in json.dumps(body)

    other = _create(home, "--agent", "tutor")  # made while the server runs: accepted at once
    assert _open(server, other["secret"])[0] == 200
