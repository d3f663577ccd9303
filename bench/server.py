"""Appends over HTTP to the memory server, against the bare stack and embedded appends (N1).

Usage: ``python bench/server.py [--quick]``

The server under test is a real ``fermix server start --foreground --port 0`` process on a
fresh home, with a host token made by ``fermix token create``. Each measure sends the same
requests: an append of a user message (``POST /v1/conversations/{handle}/messages`` with
``role``, ``text``, ``sender`` and a fresh ``client_key``) to one of 1,000 conversations in
turn, whose handles were opened first (``POST /v1/conversations/open``, not measured).

(a) fermix: 32 keep-alive connections from aiohttp (on uvloop), in this process, which is
    not the server's: acknowledged appends per second over the whole run, p50 / p99 of each
    request (send to body read).
(b) the bare stack, the baseline: ``bench/_bare_server.py``, the same framework and uvicorn
    settings with one ``async def`` endpoint doing one raw apsw insert per request into a
    database opened with ``fermix.storage.open_database``: the most this stack can answer.
    The same requests from the same load generator. Target: fermix at least 0.7x bare
    (issue 13).
(c) embedded: ``Memory`` in this process, 32 threads appending the same texts with client
    keys to 1,000 conversations: what the HTTP hop costs. ``ratio_vs_embedded`` is (a) over
    (c).
(d) the Python client's transport: ``fermix.Client`` (urllib3, one pool of 32 keep-alive
    connections) from 32 threads against the same server; ``client_vs_aiohttp`` is (d) over
    (a). A Python client spends the GIL on every request: this measures the client as much
    as the server, which is why (a) and (b) use aiohttp.
(e) the load generator's ceiling: aiohttp's ``GET /v1/health`` on the bare server, 32
    connections. When it is far above (b), the load generator is not what limits (a), (b).
(f) cold start: from ``Popen`` of the server on a fresh home (its database made by the
    token command beforehand) to the first 200 of ``GET /v1/health``, and to the first 201
    of an append (an open then an append, one connection). The median of several starts.

(a) to (d) run in interleaved rounds in a rotating order, so that a change in the machine's
load hits them alike; warm-up requests (every conversation once) are not counted. On a
machine with few cores the load generator and the server share them: the ratio of (a) to
(b), measured alike, is the figure, more than either rate. The last line printed is one JSON
object with the headline numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _timing import percentile
from rich.console import Console
from rich.table import Table

from fermix import Memory
from fermix.server.service import READY_LINE

BENCH = Path(__file__).resolve().parent
AGENT, CHANNEL, OWNER = "bench", "http", "alice"
CLIENTS, CONVERSATIONS, ROUNDS = 32, 1000, 5
TARGET_BARE = 0.7
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
_WORDS = ("porto", "moved", "rain", "coffee", "train", "meeting", "sister", "python", "garden")


@dataclass(frozen=True)
class Sizes:
    per_round: int
    cold_starts: int


FULL = Sizes(per_round=6000, cold_starts=5)
QUICK = Sizes(per_round=600, cold_starts=2)


@dataclass(frozen=True)
class Run:
    """Requests timed one by one, and the wall time from the first sent to the last read."""

    count: int
    elapsed_s: float
    latencies_ms: Sequence[float]

    @property
    def rate(self) -> float:
        return self.count / self.elapsed_s

    def p(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    @staticmethod
    def merge(runs: Sequence[Run]) -> Run:
        return Run(
            sum(r.count for r in runs),
            sum(r.elapsed_s for r in runs),
            [ms for r in runs for ms in r.latencies_ms],
        )


def text(i: int) -> str:
    return f"{i}: " + " ".join(_WORDS[(i * 7 + k) % len(_WORDS)] for k in range(12))


def body(i: int) -> bytes:
    """Append ``i``'s request body; a fresh client key, as every client sends."""
    return json.dumps(
        {"role": "user", "text": text(i), "sender": OWNER, "client_key": uuid.uuid4().hex}
    ).encode()


def fermix_cli(home: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), *args],
        capture_output=True, text=True, check=True, env=ENV, timeout=120,
    ).stdout  # fmt: skip


def make_token(home: Path) -> str:
    data = json.loads(fermix_cli(home, "token", "create", "--agent", AGENT, "--json"))
    secret: str = data["secret"]
    return secret


def http(url: str, *, token: str = "", data: dict[str, Any] | None = None) -> Any:
    """One request with the standard library (the cold start's and the setup's)."""
    request = urllib.request.Request(url, data=None if data is None else json.dumps(data).encode())
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


@dataclass
class Server:
    """A server process and where it answers."""

    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_fermix(home: Path) -> tuple[Server, float]:
    """``fermix server start --foreground`` on ``home``; returns it and the seconds to its
    first answered ``GET /v1/health``, counted from ``Popen``."""
    log = (home / "bench-server.log").open("wb")
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), "server", "start",
         "--foreground", "--announce", "--port", "0"],
        stdout=subprocess.PIPE, stderr=log, env=ENV,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline().decode().strip()  # written once it listens
    if line != READY_LINE:
        process.kill()
        raise RuntimeError(f"the server did not start; see {home / 'bench-server.log'}")
    url = json.loads((home / "server.json").read_text())["url"]
    assert http(f"{url}/v1/health")["status"] == "ok"
    return Server(process, url), time.perf_counter() - start


def start_bare(db_path: Path) -> Server:
    process = subprocess.Popen(
        [sys.executable, str(BENCH / "_bare_server.py"), str(db_path)],
        stdout=subprocess.PIPE, env=ENV,
    )  # fmt: skip
    assert process.stdout is not None
    url = process.stdout.readline().decode().split()[-1]
    deadline = time.monotonic() + 60
    while True:  # it prints its address just before it listens
        try:
            http(f"{url}/v1/health")
            return Server(process, url)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def open_handles(url: str, token: str) -> list[str]:
    return [
        http(
            f"{url}/v1/conversations/open",
            token=token,
            data={"agent_id": AGENT, "channel": CHANNEL, "chat_id": f"c{i}", "owner_id": OWNER},
        )["handle"]
        for i in range(CONVERSATIONS)
    ]


def cold_start(tmp: Path) -> tuple[float, float]:
    """(f): seconds from ``Popen`` to the first health answer and to the first append."""
    home = Path(tempfile.mkdtemp(prefix="cold-", dir=tmp))
    token = make_token(home)
    server, health_s = start_fermix(home)
    try:
        start = time.perf_counter() - health_s
        handle = http(
            f"{server.url}/v1/conversations/open",
            token=token,
            data={"agent_id": AGENT, "channel": CHANNEL, "chat_id": "cold", "owner_id": OWNER},
        )["handle"]
        http(f"{server.url}/v1/conversations/{handle}/messages", token=token,
             data={"role": "user", "text": "hello", "sender": OWNER})  # fmt: skip
        return health_s, time.perf_counter() - start
    finally:
        server.stop()


# -- the load generators ----------------------------------------------------------------


async def _aio_load(
    url: str, token: str, requests: Sequence[tuple[str, bytes | None]], expect: int
) -> Run:
    """``requests`` (path, body or None for a GET) from :data:`CLIENTS` connections."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    latencies: list[float] = []
    work = iter(requests)
    async with aiohttp.ClientSession(url, connector=connector, headers=headers) as session:

        async def connect() -> None:
            async with session.get("/v1/health") as answer:
                await answer.read()

        async def client() -> None:
            clock = time.perf_counter
            for path, data in work:
                t0 = clock()
                method = session.get(path) if data is None else session.post(path, data=data)
                async with method as answer:
                    await answer.read()
                    if answer.status != expect:
                        raise RuntimeError(f"{path}: {answer.status} {await answer.text()}")
                latencies.append((clock() - t0) * 1000)

        # All connections open before the clock starts (32 requests at once need 32).
        await asyncio.gather(*(connect() for _ in range(CLIENTS)))
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        elapsed = time.perf_counter() - start
    return Run(len(latencies), elapsed, latencies)


def aio_load(
    url: str, token: str, requests: Sequence[tuple[str, bytes | None]], expect: int
) -> Run:
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_aio_load(url, token, requests, expect))


def appends(handles: Sequence[str], first: int, count: int) -> list[tuple[str, bytes | None]]:
    return [
        (f"/v1/conversations/{handles[i % len(handles)]}/messages", body(i))
        for i in range(first, first + count)
    ]


def threaded(one: Callable[[int], object], first: int, count: int, pool: Any) -> Run:
    """``one(i)`` for ``count`` values of ``i`` from :data:`CLIENTS` threads, each its share."""
    barrier = threading.Barrier(CLIENTS)

    def share(t: int) -> tuple[float, float, list[float]]:
        clock, latencies = time.perf_counter, []
        barrier.wait()
        start = clock()
        for i in range(first + t, first + count, CLIENTS):
            t0 = clock()
            one(i)
            latencies.append((clock() - t0) * 1000)
        return start, clock(), latencies

    results = list(pool.map(share, range(CLIENTS)))
    elapsed = max(end for _, end, _ in results) - min(start for start, _, _ in results)
    return Run(count, elapsed, [ms for _, _, lat in results for ms in lat])


@contextlib.contextmanager
def setups(tmp: Path) -> Iterator[dict[str, Callable[[int, int], Run]]]:
    """The servers, client and memory of (a) to (e), warmed; yields each measure by name."""
    import fermix

    home = tmp / "server-home"
    home.mkdir()
    token = make_token(home)
    server, _ = start_fermix(home)
    bare = start_bare(tmp / "bare.db")
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        stack.callback(bare.stop)
        handles = open_handles(server.url, token)
        client = stack.enter_context(fermix.Client(server.url, token))
        remote = [
            client.conversation(AGENT, CHANNEL, f"c{i}", owner_id=OWNER)
            for i in range(CONVERSATIONS)
        ]
        memory = stack.enter_context(Memory(tmp / "embedded-home"))
        local = [
            memory.conversation(AGENT, CHANNEL, f"c{i}", owner_id=OWNER)
            for i in range(CONVERSATIONS)
        ]
        pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(CLIENTS))

        def remote_append(i: int) -> object:
            return remote[i % CONVERSATIONS].append_user(text(i))

        def local_append(i: int) -> object:
            return local[i % CONVERSATIONS].append_user(text(i), client_key=uuid.uuid4().hex)

        warm = -CONVERSATIONS  # negative indexes: the warm-up's texts, never measured again
        aio_load(server.url, token, appends(handles, warm, CONVERSATIONS), 201)
        aio_load(bare.url, token, appends(handles, warm, CONVERSATIONS), 201)
        threaded(remote_append, warm, CONVERSATIONS, pool)
        threaded(local_append, warm, CONVERSATIONS, pool)
        yield {
            "fermix": lambda first, n: aio_load(server.url, token, appends(handles, first, n), 201),
            "bare": lambda first, n: aio_load(bare.url, token, appends(handles, first, n), 201),
            "client": lambda first, n: threaded(remote_append, first, n, pool),
            "embedded": lambda first, n: threaded(local_append, first, n, pool),
            "ceiling": lambda first, n: aio_load(bare.url, token, [("/v1/health", None)] * n, 200),
            "counted": lambda first, n: json.loads(fermix_cli(home, "server", "status", "--json"))[
                "totals"
            ]["appends"],
        }


def measure(sizes: Sizes) -> dict[str, Any]:
    """Every section; the rounds of (a) to (d) interleaved, in a rotating order."""
    runs: dict[str, list[Run]] = {"fermix": [], "bare": [], "client": [], "embedded": []}
    with tempfile.TemporaryDirectory(prefix="fermix-bench-server-") as name:
        tmp = Path(name)
        colds = [cold_start(tmp) for _ in range(sizes.cold_starts)]
        with setups(tmp) as measures:
            order = list(runs)
            for r in range(ROUNDS):
                shift = r % len(order)
                for which in order[shift:] + order[:shift]:
                    runs[which].append(measures[which](r * sizes.per_round, sizes.per_round))
            ceiling = measures["ceiling"](0, sizes.per_round)
            counted = measures["counted"](0, 0)
    merged = {name: Run.merge(rs) for name, rs in runs.items()}
    fx, bare, client, emb = (merged[n] for n in ("fermix", "bare", "client", "embedded"))
    out: dict[str, Any] = {
        "ratio_vs_bare": fx.rate / bare.rate,
        "ratio_vs_embedded": fx.rate / emb.rate,
        "client_vs_aiohttp": client.rate / fx.rate,
        "fermix_appends_s": fx.rate,
        "bare_appends_s": bare.rate,
        "embedded_appends_s": emb.rate,
        "client_appends_s": client.rate,
        "aiohttp_ceiling_rps": ceiling.rate,
        "cold_start_health_ms": statistics.median(h for h, _ in colds) * 1000,
        "cold_start_first_append_ms": statistics.median(a for _, a in colds) * 1000,
        "cold_starts": len(colds),
        "server_appends_counted": counted,
        "appends_sent_to_server": CONVERSATIONS + fx.count + client.count + CONVERSATIONS,
    }
    for name, run in merged.items():
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = run.p(50), run.p(99)
    out.update(clients=CLIENTS, conversations=CONVERSATIONS, per_measure=fx.count, rounds=ROUNDS)
    return out


def render(console: Console, r: dict[str, Any]) -> None:
    def mark(value: float, target: float) -> str:
        return f"≥ {target:g}x " + ("[green]met[/]" if value >= target else "[red]missed[/]")

    table = Table(title=f"appends over HTTP, {CLIENTS} clients: req/s, latency in ms")
    for column in ("measure", "req/s", "p50", "p99", "ratio", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    rows = [
        ("(a) fermix server, aiohttp", "fermix", f"{r['ratio_vs_bare']:.2f}x vs bare",
         mark(r["ratio_vs_bare"], TARGET_BARE)),
        ("(b) bare FastAPI + 1 apsw insert", "bare", "", ""),
        ("(c) embedded Memory, 32 threads", "embedded",
         f"(a) is {r['ratio_vs_embedded']:.2f}x", ""),
        ("(d) fermix.Client (urllib3), 32 threads", "client",
         f"{r['client_vs_aiohttp']:.2f}x of (a)", ""),
    ]  # fmt: skip
    for label, key, ratio, target in rows:
        table.add_row(
            label,
            f"{r[f'{key}_appends_s']:,.0f}",
            f"{r[f'{key}_p50_ms']:.2f}",
            f"{r[f'{key}_p99_ms']:.2f}",
            ratio,
            target,
        )
    table.caption = (
        f"(e) aiohttp GET /v1/health on the bare server: {r['aiohttp_ceiling_rps']:,.0f} req/s;"
        f" (f) cold start: first health {r['cold_start_health_ms']:.0f} ms, first append"
        f" {r['cold_start_first_append_ms']:.0f} ms (median of {r['cold_starts']});"
        f" the server counted {r['server_appends_counted']:,} appends of"
        f" {r['appends_sent_to_server']:,} sent; load {r['loadavg_start']:.1f} →"
        f" {r['loadavg_end']:.1f}"
    )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fermix server benchmark (see its docstring)")
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    results = measure(QUICK if args.quick else FULL)
    results.update(loadavg_start=load_start, loadavg_end=os.getloadavg()[0], quick=args.quick)
    render(Console(), results)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
