"""Shared fixtures: a temporary home and database, the loopback model server, and stopping
every actor after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import apsw
import pykka
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from model_server import ModelServer

from fermix.api import Memory
from fermix.storage import open_database


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty fermix home in a temporary directory, also set as FERMIX_HOME."""
    root = tmp_path / "home"
    root.mkdir()
    monkeypatch.setenv("FERMIX_HOME", str(root))
    return root


@pytest.fixture
def db(tmp_path: Path) -> Iterator[apsw.Connection]:
    """A migrated database in a temporary directory."""
    conn = open_database(tmp_path / "memory.db")
    yield conn
    conn.close()


@pytest.fixture(autouse=True)
def _stop_all_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop every actor after each test, except in modules that share one running tree
    (marked ``keep_actors``: their module-scoped fixture stops it at the end)."""
    yield
    if request.node.get_closest_marker("keep_actors") is None:
        pykka.ActorRegistry.stop_all()


@pytest.fixture
def memory(home: Path) -> Iterator[Memory]:
    """A running Memory (the whole actor tree) on the temporary home."""
    with Memory(home) as running:
        yield running


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A started loopback OpenAI-compatible server (tests/model_server.py), stopped after.

    Script it per test (``reply``, ``fail``, ``hang``...) and point litellm at ``.url``.
    """
    with ModelServer() as server:
        yield server
