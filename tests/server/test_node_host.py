"""A host in another language: Node 20's fetch and the ``curl`` turn of docs/http.md, each
through one full turn against a real server (N1, N3).

``tests/node/turn.mjs`` uses no package, only Node's global ``fetch``; the curl commands are
taken from the ``bash`` blocks of docs/http.md's "A turn" section as they are written, so
the page cannot drift from what the server answers. Both send their writes with a
``client_key`` and repeat them: history must hold each message once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import AGENT, ServerProcess

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "http.md"
SCRIPT = ROOT / "tests" / "node" / "turn.mjs"
TURN_HEADING = "## A turn"
pytestmark = pytest.mark.slow


def _run(command: list[str], server: ServerProcess, **env: str) -> str:
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FERMIX_URL": server.url, "FERMIX_TOKEN": server.host_token, **env},
    )
    assert done.returncode == 0, f"{done.stderr}\n{server.log()}"
    return done.stdout


def _history(server: ServerProcess, channel: str, chat_id: str) -> list[tuple[str, str]]:
    conv = server.client().conversation(AGENT, channel, chat_id, owner_id="ana")
    return [(m.role, m.content) for m in conv.history()]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not on PATH")
def test_n1_n3_a_node_script_runs_a_full_turn_and_a_repeated_append_is_stored_once(
    server: ServerProcess,
) -> None:
    result: dict[str, Any] = json.loads(_run(["node", str(SCRIPT)], server, FERMIX_AGENT=AGENT))
    said = "Hi! I am Ana, a nurse. I moved to Porto last month."
    assert result["trust"] == "guest"  # a host token's conversation, whatever owner it names
    assert result["append"]["status"] == 201
    assert result["again"] == {"status": 200, "id": result["append"]["id"], "replayed": "true"}
    assert result["preflight"] == {"notice": None}
    assert result["composed"][0] == {"role": "system", "content": result["composed"][0]["content"]}
    assert result["composed"][0]["content"].startswith("You are a friendly assistant.")
    assert result["composed"][-1] == {"role": "user", "content": said}
    assert result["commit"]["status"] == 201 and result["commit"]["role"] == "assistant"
    assert [(m["role"], m["content"], m["client_key"]) for m in result["history"]] == [
        ("user", said, "node-1-msg-1"),
        ("assistant", "Welcome to Porto, Ana!", "node-1-reply-1"),
    ]

    again = json.loads(_run(["node", str(SCRIPT)], server, FERMIX_AGENT=AGENT))
    assert again["append"]["status"] == 200 and again["commit"]["status"] == 200
    assert [m["id"] for m in again["history"]] == [m["id"] for m in result["history"]]
    assert _history(server, "node", "node-1") == [
        ("user", said),
        ("assistant", "Welcome to Porto, Ana!"),
    ]


def doc_turn() -> str:
    """The ``bash`` blocks of docs/http.md's "A turn" section, as one script."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(TURN_HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) >= 5, "the turn's commands are gone from docs/http.md"
    return "\n".join(blocks)


def _json_values(text: str) -> list[Any]:
    decoder, values, at = json.JSONDecoder(), [], 0
    while (at := _skip_space(text, at)) < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


@pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("jq") is None, reason="curl or jq is missing"
)
def test_n1_the_curl_turn_of_docs_http_md_runs_and_stores_each_message_once(
    server: ServerProcess,
) -> None:
    script = "set -euo pipefail\n" + doc_turn().replace('"assistant"', f'"{AGENT}"')
    first = _json_values(_run(["bash", "-c", script], server))
    roles = [v["role"] for v in first if isinstance(v, dict) and "role" in v and "id" in v]
    assert roles == ["user", "assistant"]  # the append's and the commit's answers
    assert first[-2:] == [
        {"role": "user", "content": "Hi! I am Ana, a nurse. I moved to Porto last month."},
        {"role": "assistant", "content": "Welcome to Porto, Ana! How are the new shifts?"},
    ]
    composed = next(v for v in first if isinstance(v, list))
    assert composed[0]["role"] == "system" and composed[-1]["role"] == "user"

    _run(["bash", "-c", script], server)  # the whole turn again: both writes replayed
    assert _history(server, "telegram", "42") == [
        ("user", "Hi! I am Ana, a nurse. I moved to Porto last month."),
        ("assistant", "Welcome to Porto, Ana! How are the new shifts?"),
    ]


def test_n1_every_route_docs_http_md_uses_is_in_the_openapi_document(
    server: ServerProcess,
) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{server.url}/openapi.json", timeout=30) as answer:
        paths: dict[str, dict[str, Any]] = json.loads(answer.read())["paths"]
    used = re.findall(
        r'curl -sSf(?: -X (\w+))? "\$FERMIX_URL(/v1/[^"]+)"(.*?)(?=\n\n|```)',
        DOC.read_text(encoding="utf-8"),
        flags=re.DOTALL,
    )
    assert len(used) >= 6
    for method, path, rest in used:
        verb = (method or ("post" if " -d " in rest else "get")).lower()
        route = path.replace("$H", "{handle}")
        assert route in paths, f"{route} is not a route of the server"
        assert verb in paths[route], f"{verb.upper()} {route} is not a route of the server"
