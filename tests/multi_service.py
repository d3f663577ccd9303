"""Several fermix services on one PostgreSQL database, each a separate process (B2, B3).

A :class:`Fleet` is N ``fermix server start --foreground --port 0`` processes, each on
a home of its own (its own ``config.toml``, ``server.json`` and prompt-file cache), all
pointed at one database through ``FERMIX_STORAGE_URL`` in their environment, as services
on several machines would be. They start together on an empty database, so they also
race to migrate it. Their wall clocks disagree (:data:`SKEWS_MS`), as those of machines
do. The tokens are made afterwards through the test's own store: the tokens table is
shared, so one token works on every service.

Also here: :class:`ReviewModel`, a loopback model server that answers each review for the
conversation it shows and counts reviews per conversation (and how many ran at once), and
:func:`agent_snapshot`, a dump of every table's rows that belong to one agent.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from model_server import ModelServer, Step, json_reply
from server_fixtures import AGENT, ServerProcess

from fermix.config import STORAGE_URL_ENV, Config, StorageConfig
from fermix.home import Home
from fermix.runtime.access import Tokens
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Storage, open_storage

SERVICES = 3
SKEWS_MS = (0, 1_500, -1_500)
"""How far each service's wall clock is from the test's: services on several machines do not
agree on the time, and every time they store (a message's, a claim's) comes from theirs."""
_SKEWED = (
    "import runpy, sys, time\n"
    "_time_ns = time.time_ns\n"
    "time.time_ns = lambda: _time_ns() + {skew} * 1_000_000\n"
    "sys.argv[0] = 'fermix'\n"
    "runpy.run_module('fermix.cli', run_name='__main__', alter_sys=True)\n"
)
"""The service's program: ``python -m fermix.cli`` with its clock (``fermix.clock.now_ms``
reads ``time.time_ns``) moved by ``skew`` milliseconds; monotonic time is left alone."""
KEY_ENV = "FERMIX_TEST_MODEL_KEY"
"""The variable the services' embedding route reads its (dummy) key from."""


def service_config(
    model_url: str,
    *,
    sweep_interval_s: float = 0,
    review_interval_hours: float = 0,
    embedding: bool = False,
    context_window: int | None = None,
) -> str:
    """A service's config.toml: the loopback model for reviews (off unless asked), for
    compactions when ``context_window`` is given (off otherwise), and for embeddings when
    ``embedding`` (the model server's hashed vectors, no download). It names no storage
    URL: that comes from the environment, as a password would."""
    embed = (
        f'model = "openai/test-embed"\napi_base = "{model_url}"\napi_key_env = "{KEY_ENV}"\n'
        "batch_size = 64\n"
        if embedding
        else "enabled = false\n"
    )
    return f"""
[fermix_core.memory]
review_interval_hours = {review_interval_hours}
sweep_interval_s = {sweep_interval_s}

[fermix_core.model]
primary = "openai/test"
api_base = "{model_url}"
timeout_s = 10
{"" if context_window is None else f"context_window = {context_window}"}

[fermix_core.compaction]
enabled = {"false" if context_window is None else "true"}

[fermix_core.embedding]
{embed}"""


@dataclass
class Service(ServerProcess):
    """One service of a fleet: a server process whose environment names the shared store."""

    environ: dict[str, str] = field(default_factory=dict)
    skew_ms: int = 0
    """How far this service's wall clock is from the test's (:data:`SKEWS_MS`)."""

    def start(self) -> None:
        """Start the process with :attr:`environ` and its skewed clock, and wait until it
        answers ``/v1/health`` (``--port 0``: a new port at every start)."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _SKEWED.format(skew=self.skew_ms),
                    *("--home", str(self.home), "server", "start", "--foreground"),
                    *("--port", "0"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **self.environ},
            )
        self.url = self._wait_ready()

    def kill(self) -> None:
        """SIGKILL: no graceful stop, no flush, its connections to PostgreSQL cut."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@dataclass
class Fleet:
    """N services on one database, and the tokens that work on all of them."""

    storage_url: str
    services: list[Service]
    scratch: Path
    host_token: str = ""
    operator_token: str = ""

    def __getitem__(self, index: int) -> Service:
        return self.services[index]

    @property
    def urls(self) -> list[str]:
        """Where each service listens now (a restart moves it)."""
        return [s.url for s in self.services]

    def start(self) -> None:
        """Start every service at once (they migrate the empty database together)."""
        with ThreadPoolExecutor(len(self.services)) as pool:
            list(pool.map(Service.start, self.services))

    def stop(self) -> list[int | None]:
        """SIGTERM every service, at once; their exit codes."""
        with ThreadPoolExecutor(len(self.services)) as pool:
            return list(pool.map(Service.stop, self.services))

    @contextmanager
    def store(self) -> Iterator[Storage]:
        """The shared database opened in the test process, as another service would."""
        db = open_storage(Home(self.scratch), Config(storage=StorageConfig(url=self.storage_url)))
        try:
            yield db
        finally:
            db.close()

    @contextmanager
    def tokens(self) -> Iterator[Tokens]:
        """The shared tokens, as ``fermix token`` reaches them, on no service in particular."""
        with self.store() as db:
            yield Tokens(db, Writer(db, PromptFiles(Home(self.scratch), db)))

    def create_token(self, agents: list[str], *, operator: bool = False) -> str:
        """A token made as ``fermix token create`` does; its secret."""
        with self.tokens() as tokens:
            _, secret = tokens.create(agents, operator=operator)
        return secret

    def logs(self) -> str:
        """The end of every service's log, for an assertion's message."""
        return "\n".join(f"--- service {i}:\n{s.log(2000)}" for i, s in enumerate(self.services))


def launch_fleet(root: Path, storage_url: str, config: str, count: int = SERVICES) -> Fleet:
    """Start ``count`` services under ``root`` (homes ``root/s<i>/home``) on ``storage_url``,
    each with ``config`` as its config.toml and its clock off by :data:`SKEWS_MS`; then make
    a host and an operator token."""
    services = []
    for index in range(count):
        home = root / f"s{index}" / "home"
        home.mkdir(parents=True, mode=0o700)
        (home / "config.toml").write_text(config, encoding="utf-8")
        environ = {STORAGE_URL_ENV: storage_url, KEY_ENV: "sk-test"}
        skew = SKEWS_MS[index % len(SKEWS_MS)]
        services.append(Service(home, "", "", environ=environ, skew_ms=skew))
    scratch = root / "test-process"
    scratch.mkdir(mode=0o700)
    fleet = Fleet(storage_url, services, scratch)
    try:
        fleet.start()
    except BaseException:
        fleet.stop()
        raise
    fleet.host_token = fleet.create_token([AGENT])
    fleet.operator_token = fleet.create_token([AGENT], operator=True)
    for service in services:
        service.host_token, service.operator_token = fleet.host_token, fleet.operator_token
    return fleet


# -- the reviewing model ----------------------------------------------------------------------

TAG = re.compile(r"\bconv-(\d+)\b")
"""How a test's user message names its conversation, so the model knows whose review it is."""


class ReviewModel(ModelServer):
    """A model server whose review answers depend on the conversation under review.

    Every user message of a review names its conversation (``conv-<n>: ...``) and a fact
    (``city=<word>`` or ``drink=<word>``); the answer adds that fact as a row of the
    speaker. Each review is held :attr:`think_s` (a model's thinking time, so two reviews
    of one conversation that overlap are seen to), and counted: :attr:`reviews` per
    conversation, :attr:`most_at_once` the most reviews of one conversation in flight at
    the same time.
    """

    think_s = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        self.reviews: Counter[int] = Counter()
        self.mixed: list[list[str]] = []
        """The user messages of each review that did not show one conversation's alone."""
        self.most_at_once: Counter[int] = Counter()
        self._in_flight: Counter[int] = Counter()

    def _take(self, body: dict[str, Any], headers: dict[str, str]) -> Step:
        data = json.loads(body["messages"][-1]["content"])
        texts = [m["text"] for m in data["user_messages"]]
        conversations = {int(n) for text in texts for n in TAG.findall(text)}
        conversation = min(conversations, default=-1)
        with self._lock:
            if len(conversations) != 1:
                self.mixed.append(texts)
            self.requests.append(body)
            self.headers.append(headers)
            self._in_flight[conversation] += 1
            self.most_at_once[conversation] = max(
                self.most_at_once[conversation], self._in_flight[conversation]
            )
        self._stopping.wait(self.think_s)  # the model thinking, not a wait for a thread
        with self._lock:
            self._in_flight[conversation] -= 1
            self.reviews[conversation] += 1
            self._lock.notify_all()
        operations = [
            {"op": "add", "speaker": "S1", "category": category, "key": key, "value": value}
            for text in texts
            for key, value in re.findall(r"\b(city|drink)=(\S+)", text)
            for category in ["identity" if key == "city" else "preference"]
        ]
        return json_reply({"operations": operations})

    def wait_for_reviews(self, total: int, timeout: float) -> bool:
        """Wait until ``total`` reviews have been answered; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: sum(self.reviews.values()) >= total, timeout)


# -- the database, table by table -------------------------------------------------------------

_THROUGH = {
    "message_vectors": ("message_id", "messages"),
    "memory_vectors": ("memory_id", "memories"),
    "resource_revisions": ("resource_id", "resources"),
    "job_runs": ("job_id", "scheduled_jobs"),
}
"""Tables without an ``agent_id`` that belong to an agent through a parent row."""


class Snapshots:
    """Dumps of the shared database for one agent, on one connection of the test's own.

    :meth:`take` gives every table, sorted: the rows of the agent where a table has an
    ``agent_id`` (or a parent row in :data:`_THROUGH` that has), every row elsewhere.
    Another agent's traffic changes none of it; a table added later is covered as it comes.
    """

    def __init__(self, storage_url: str, agent_id: str) -> None:
        self._conn = psycopg.connect(storage_url, autocommit=True)
        self._queries: dict[str, tuple[str, tuple[str, ...]]] = {}
        columns: dict[str, set[str]] = {}
        for table, column in self._conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name IN (SELECT table_name"
            " FROM information_schema.tables WHERE table_schema = 'public'"
            " AND table_type = 'BASE TABLE')"
        ):
            columns.setdefault(table, set()).add(column)
        for table in sorted(columns):
            if "agent_id" in columns[table]:
                query = f"SELECT t.* FROM {table} AS t WHERE t.agent_id = %s"
                self._queries[table] = (query, (agent_id,))
            elif table in _THROUGH:
                column, parent = _THROUGH[table]
                query = (
                    f"SELECT t.* FROM {table} AS t JOIN {parent} AS p ON p.id = t.{column}"
                    " WHERE p.agent_id = %s"
                )
                self._queries[table] = (query, (agent_id,))
            else:
                self._queries[table] = (f"SELECT t.* FROM {table} AS t", ())

    def take(self) -> dict[str, list[tuple[Any, ...]]]:
        """The agent's rows of every table, as they are now."""
        return {
            table: sorted(self._conn.execute(query, args).fetchall(), key=repr)
            for table, (query, args) in self._queries.items()
        }

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
