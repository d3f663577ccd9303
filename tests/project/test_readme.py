"""The README's host loop runs as written, against the loopback model server (H1)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer

README = Path(__file__).resolve().parents[2] / "README.md"


def _host_loop() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Embedding fermix in a bot") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


@pytest.mark.slow  # a fresh python running the README's code imports litellm
def test_h1_the_readme_host_loop_runs_with_a_tool_call(
    model_server: ModelServer, home: Path
) -> None:
    model_server.reply_tool_call("memory_store", {"key": "job", "value": "nurse in Porto"})
    model_server.reply("Nice to meet you, Ana!")
    env = {
        "PATH": "/usr/bin:/bin",
        "FERMIX_HOME": str(home),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": model_server.url,
        "OPENAI_API_BASE": model_server.url,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    run = subprocess.run(
        [sys.executable, "-c", _host_loop()], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "Nice to meet you, Ana!" in run.stdout
    roles = [m["role"] for m in model_server.requests[1]["messages"]]
    assert roles[-3:] == ["user", "assistant", "tool"]
    assert (home / "memory.db").exists()


@pytest.mark.slow  # a memory server process, then a fresh python importing litellm
def test_n4_the_readme_host_loop_runs_against_the_server_with_one_line_changed(
    model_server: ModelServer, start_server: Any
) -> None:
    """The README's host loop, its ``Memory(...)`` line swapped for ``Client(url, token)``
    as the server section says, runs the same turn against a real server (N4)."""
    server = start_server()
    code = _host_loop()
    line = "with Memory(model=MODEL) as memory:"
    assert line in code
    code = code.replace(line, "with Client(URL, TOKEN) as memory:").replace(
        "from fermix import Memory", "from fermix import Client"
    )
    model_server.reply_tool_call("memory_store", {"key": "job", "value": "nurse in Porto"})
    model_server.reply("Nice to meet you, Ana!")
    env = {
        "PATH": "/usr/bin:/bin",
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": model_server.url,
        "OPENAI_API_BASE": model_server.url,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    prelude = f"URL = {server.url!r}\nTOKEN = {server.operator_token!r}\n"
    run = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "Nice to meet you, Ana!" in run.stdout
    with server.client(server.operator_token) as client:
        rows = client.list_rows(agent_id="assistant", key="job")
        history = client.conversation("assistant", "telegram", "42", owner_id="me").history()
    assert [r.value for r in rows] == ["nurse in Porto"]
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
