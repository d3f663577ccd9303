"""Shared fixtures: a temporary home and database, the loopback model server, started
Memories, and stopping every actor after each test.

Builders that are not fixtures (``config_for``, ``Clock``, ``other_process``...) are in
``tests/factories.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pykka
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from factories import Clock, StartMemory, config_for
from model_server import ModelServer
from soak import zygote as zygotes

from fermix.api import Memory
from fermix.clock import now_ms
from fermix.config import Config
from fermix.home import Home
from fermix.storage.sqlite.migrations import open_database

pytest_plugins = ["server_fixtures", "pg_fixtures", "storage_fixtures"]
"""The memory server as a process (``server``, ``start_server``): tests/server_fixtures.py."""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``Path`` to an empty fermix home directory in a temporary directory, also set as
    ``FERMIX_HOME``. (``fermix_home`` is the same directory as a :class:`~fermix.home.Home`.)"""
    root = tmp_path / "home"
    root.mkdir(mode=0o700)  # as fermix creates a home (M10): doctor warns on a looser one
    monkeypatch.setenv("FERMIX_HOME", str(root))
    return root


@pytest.fixture
def clock() -> Clock:
    """Epoch milliseconds, starting now, which a test moves forward instead of waiting:
    the ``clock`` a Memory, a Reviewing or a Compacting is given."""
    return Clock(now_ms())


@pytest.fixture
def fermix_home(home: Path) -> Home:
    """The temporary home (``home``) as a :class:`~fermix.home.Home`: its paths inside."""
    return Home(home)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[apsw.Connection]:
    """A migrated database in a temporary directory."""
    conn = open_database(tmp_path / "memory.db")
    yield conn
    conn.close()


@pytest.fixture(autouse=True)
def _stop_all_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop every actor after each test, except in modules that share one running tree
    (marked ``keep_actors``: their module-scoped fixture stops it at the end).

    Autouse, so it is set up before and torn down after every other fixture of the test:
    the Memories those started have closed gracefully by then; this stops what is left.
    """
    yield
    if request.node.get_closest_marker("keep_actors") is None:
        pykka.ActorRegistry.stop_all()


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A started loopback OpenAI-compatible server (tests/model_server.py), stopped after.

    Script it per test (``reply``, ``fail``, ``hang``...) and point litellm at ``.url``
    (``factories.config_for(model_server)`` does).
    """
    with ModelServer() as server:
        yield server


@pytest.fixture(scope="session")
def zygote(request: pytest.FixtureRequest) -> zygotes.Zygote:
    """The fork server of hosts in child processes (``tests/soak/zygote.py``): its imports
    (fermix, litellm, the workloads) are paid once for the whole session."""
    return zygotes.shared(request.config)


@pytest.fixture
def start_memory(home: Path) -> Iterator[StartMemory]:
    """Start Memories: ``start_memory(config=None, **keywords)`` starts one on the temporary
    ``home`` (another with ``home=``), taking any keyword of :class:`~fermix.api.Memory`
    (``clock``, ``route``, ``conversation_cap``, ``idle_s``, ``vfs``). ``config`` None reads
    the home's ``config.toml`` as a host would. Each one started is closed after the test
    (queued writes finish), newest first; then ``_stop_all_actors`` stops any actor left."""
    started: list[Memory] = []

    def start(config: Config | None = None, **keywords: Any) -> Memory:
        memory = Memory(keywords.pop("home", home), config=config, **keywords).start()
        started.append(memory)
        return memory

    yield start
    for memory in reversed(started):
        memory.close()


@pytest.fixture
def memory(start_memory: StartMemory) -> Memory:
    """A running Memory (the whole actor tree) on the temporary home, with no model route:
    for tests that never review nor compact."""
    return start_memory()


@pytest.fixture
def running(start_memory: StartMemory, model_server: ModelServer) -> Memory:
    """A running Memory on the temporary home whose reviewer and compactor call the loopback
    ``model_server`` (``config_for(model_server)``: background review off). A module that
    needs another config overrides it with ``start_memory(config_for(model_server, ...))``."""
    return start_memory(config_for(model_server))
