"""The TypeScript client and its Vercel AI SDK middleware (I5), against a real server.

``clients/typescript`` is tested by node's own test runner (``npm test``: the client's
turn, its retries through a proxy that loses answers, the middleware through the real
``ai`` package's ``generateText`` and ``streamText``, the schema against the server's
OpenAPI document, ``npm pack``). This wrapper starts the memory server those tests talk
to, runs them, and asserts on their report; then it runs docs/integrations.md's
host as written, with the real ``@ai-sdk/openai`` provider pointed at the loopback model
server, and reads what it stored back through the Python client.

Skipped only when node is absent and this is not CI: with ``CI`` set, a missing node, npm
or ``npm ci`` fails instead, so CI cannot go green on skipped TypeScript tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from docs_page import section
from factories import fact, other_process
from model_server import ModelServer
from server_fixtures import AGENT, ServerProcess, StartServer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
SEEDED_OWNER = "seeded-ana"
"""An owner with a fact in USER.md, as a review would have stored it (the P1 test's)."""
NODE_TIMEOUT_S = 240
pytestmark = pytest.mark.slow  # node processes, npm pack, a memory server


def _tools() -> None:
    """Node and npm, or a skip (locally) / a failure (in CI)."""
    missing = [name for name in ("node", "npm") if shutil.which(name) is None]
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{' and '.join(missing)} not on PATH: CI runs the TypeScript tests (I5)")
    pytest.skip(f"{' and '.join(missing)} not on PATH")


@pytest.fixture
def package() -> Path:
    """clients/typescript with its packages installed and its dist/ built."""
    _tools()
    if not (PACKAGE / "node_modules" / "ai").is_dir():
        pytest.fail("clients/typescript has no node_modules: run (cd clients/typescript && npm ci)")
    done = subprocess.run(
        ["npm", "run", "build"], cwd=PACKAGE, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return PACKAGE


def _env(server: ServerProcess, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "LANG")}
    return {
        **keep,
        "FERMIX_URL": server.url,
        "FERMIX_TOKEN": server.host_token,
        "FERMIX_OPERATOR_TOKEN": server.operator_token,
        "FERMIX_AGENT": AGENT,
        **extra,
    }


def _seed(server: ServerProcess) -> None:
    with other_process(server.home) as writer:
        written = writer.write_rows(
            fact("identity", "job", "nurse in Porto", agent_id=AGENT, owner_id=SEEDED_OWNER),
            label="a fact the reviewer would have stored",
            also=[(AGENT, SEEDED_OWNER)],
        )
        assert written.error is None


def _tap_counts(report: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^# (\w+) (\d+)$", report, flags=re.MULTILINE)}


def test_i5_n3_the_node_suite_passes_against_a_real_server(
    package: Path, start_server: StartServer
) -> None:
    """``npm test``: the client, its retries (N3), the AI SDK middleware, the schema check
    and ``npm pack``, all passing, none skipped, against a server started here (I5)."""
    server = start_server()
    _seed(server)
    done = subprocess.run(
        ["npm", "test"],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        env=_env(server, FERMIX_SEEDED_OWNER=SEEDED_OWNER),
    )
    failures = "\n".join(line for line in done.stdout.splitlines() if line.startswith("not ok"))
    assert done.returncode == 0, f"{failures}\n{done.stdout[-6000:]}\n{done.stderr}\n{server.log()}"
    counts = _tap_counts(done.stdout)
    assert counts.get("fail") == 0 and counts.get("cancelled") == 0, counts
    assert counts.get("skipped") == 0 and counts.get("todo") == 0, counts
    assert counts.get("pass", 0) >= 28 and counts["pass"] == counts["tests"], counts
    passed = "\n".join(line for line in done.stdout.splitlines() if line.startswith("ok "))
    for name in (
        "N3: an append whose answer was lost after the server stored it",
        "a 503 is tried again",
        "generateText composes fermix's prompt",
        "streamText commits the reply",
        "fermix's memory tools in the AI SDK's tool loop",
        "a guest stays a guest",
        "the committed src/schema.ts is the server's OpenAPI document",
        "npm pack makes an installable package",
    ):
        assert name in passed, f"{name!r} did not run:\n{passed}"


def _doc_host() -> str:
    text = section("TypeScript and the Vercel AI SDK (I5)")
    host = text[text.index("### A host") :]
    match = re.search(r"```js\n(.*?)```", host, re.DOTALL)
    assert match is not None, "the host is gone from docs/integrations.md"
    return match.group(1)


def test_i5_the_docs_host_runs_as_written_with_the_ai_sdk_against_the_server(
    package: Path, start_server: StartServer, model_server: ModelServer
) -> None:
    """docs/integrations.md's host, as written: ``generateText`` over the
    middleware with ``@ai-sdk/openai`` on the loopback model server, a memory tool call,
    then the reply; what it stored is read back through the Python client (I5, M1, N3)."""
    server = start_server()
    model_server.reply_tool_call(
        "memory_store", {"key": "job", "value": "nurse in Porto"}, prompt_tokens=100
    )
    model_server.reply("Nice to meet you, Ana!", prompt_tokens=321)
    # Inside the package, so that its imports resolve as an installed host's do.
    script = package / "test" / f".docs-host-{os.getpid()}.mjs"
    script.write_text(_doc_host(), encoding="utf-8")
    try:
        env = _env(server, OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=model_server.url)
        done = subprocess.run(
            ["node", str(script)], capture_output=True, text=True, timeout=60, env=env
        )
    finally:
        script.unlink()
    assert done.returncode == 0, f"{done.stderr}\n{server.log()}"
    assert done.stdout.strip() == "Nice to meet you, Ana!"

    first, second = model_server.requests
    assert "memory_store" in [t["function"]["name"] for t in first["tools"]]
    assert first["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    assert first["messages"][-1]["role"] == "user"
    assert "Hi! I'm Ana, a nurse in Porto." in str(first["messages"][-1]["content"])
    assert [m["role"] for m in second["messages"]][-3:] == ["user", "assistant", "tool"]

    conv = server.client().conversation(AGENT, "telegram", "42", owner_id="ana")
    history = conv.history()
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    said = history[0]
    assert (said.content, said.sender, said.trust) == (
        "Hi! I'm Ana, a nurse in Porto.",
        "ana",
        "guest",
    )
    assert said.client_key == "telegram-42-1001"
    assert history[1].metadata["tool_calls"][0]["function"]["name"] == "memory_store"
    assert history[-1].content == "Nice to meet you, Ana!"
    state = conv.state()
    assert state is not None and state.peak_prompt_tokens == 321  # the turn's peak (K3)
    rows = server.client().list_rows(agent_id=AGENT, key="job")
    assert [r.value for r in rows] == ["nurse in Porto"]
