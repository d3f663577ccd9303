"""``fermix server start | stop | status`` as real processes (A8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix.home import Home
from fermix.server.service import ServicePaths, running_pid


def _fermix(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )


@pytest.fixture
def service_home(home: Path) -> Iterator[Path]:
    yield home
    _fermix(home, "server", "stop")


def test_a8_start_status_and_stop_run_the_tree_as_a_background_service(service_home: Path) -> None:
    home = service_home
    assert _fermix(home, "server", "status").returncode == 1
    started = _fermix(home, "server", "start")
    assert started.returncode == 0, started.stderr
    paths = ServicePaths.of(Home(home))
    pid = running_pid(paths)
    assert pid is not None and paths.socket.exists()

    status = _fermix(home, "server", "status", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["running"] is True and data["pid"] == pid
    assert data["live_conversations"] == 0
    assert data["children"] == [
        *("reviewer", "reviewer-2", "compactor", "compactor-2", "conversations")
    ]

    again = _fermix(home, "server", "start")
    assert again.returncode == 1 and "already runs" in again.stderr

    stopped = _fermix(home, "server", "stop")
    assert stopped.returncode == 0 and f"pid {pid}" in stopped.stdout
    assert running_pid(paths) is None
    assert not paths.pid.exists() and not paths.socket.exists()
    assert "finishing in-flight writes" in paths.log.read_text()


def test_a8_a_stale_pid_file_is_replaced(service_home: Path) -> None:
    home = service_home
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (home / "supervisor.pid").write_text(dead.stdout)
    started = _fermix(home, "server", "start")
    assert started.returncode == 0, started.stderr
    assert running_pid(ServicePaths.of(Home(home))) not in (None, int(dead.stdout))


def test_a8_stop_when_nothing_runs_says_so(home: Path) -> None:
    result = _fermix(home, "server", "stop")
    assert result.returncode == 0 and "not running" in result.stdout


def test_a8_fermix_supervisor_still_works_as_a_deprecated_alias_with_one_line_on_stderr(
    home: Path,
) -> None:
    result = _fermix(home, "supervisor", "status")
    assert result.returncode == 1 and "server is not running" in result.stdout
    assert result.stderr == "fermix: `fermix supervisor` is deprecated; use `fermix server`\n"
    listed = _fermix(home, "--help").stdout
    assert "server" in listed and "supervisor" not in listed
