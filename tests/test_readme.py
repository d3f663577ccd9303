"""The README's host loop runs as written, against the loopback model server (H1)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from model_server import ModelServer

README = Path(__file__).resolve().parents[1] / "README.md"


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
