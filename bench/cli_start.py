"""Wall time of ``fermix memory list`` on an empty home, against the same work done by hand,
and the time ``fermix chat`` takes to answer its first message.

Usage: ``python bench/cli_start.py [--quick] [--runs N] [--chat-runs N]``

Every process runs as a user's would, with its bytecode cached: ``PYTHONDONTWRITEBYTECODE``
is removed from the children's environment, so the warm-up writes ``__pycache__`` (an
installed wheel has it from ``pip install``; a checkout gets it on its first run). Left set,
each run would compile fermix's modules from source again, a cost no user pays twice.

Each run starts a real process, as an operator's shell does: ``python -m fermix.cli --home
HOME memory list`` with this interpreter, timed from before the spawn to after the exit
with ``time.perf_counter_ns``, output discarded. In the same run, two baselines:

- by hand (:data:`BY_HAND`): the same interpreter runs a small script that does what the
  command does at the floor, with apsw and nothing of fermix: it opens ``memory.db``,
  reads its schema version (fermix refuses a newer one), runs the same ``SELECT`` of the
  newest 100 live memory rows and prints the same line (``memory rows: no rows``, checked
  equal to the command's output). On a new directory it also creates the database, as the
  command does: WAL on, every migration of fermix's ``schema.sql`` in its own transaction
  with its ``schema_migrations`` row and ``user_version``;
- ``python -c pass``: the interpreter's start and ``site`` alone, the floor of any Python
  command.

The three are timed in rounds, in a rotating order, so that a change in machine load hits
them alike. One warm-up round is not counted (it creates the database and fills the OS's
caches).

- ``memory_list_ms_*`` against ``memory_list_by_hand_ms_*``: on a home whose database
  exists and holds no rows (the warm-up made it), the usual case;
  ``memory_list_ratio_vs_by_hand`` is the ratio of their medians;
- ``memory_list_fresh_ms_p50`` against ``memory_list_fresh_by_hand_ms_p50``: on a brand-new
  directory each run (one of each per round, alternating), so both also create the
  database and apply the migrations;
- ``python_start_ms_*``, and ``fermix_own_ms_p50``: the command's median minus the bare
  interpreter's, the time that is fermix's to cut (imports, mostly);
- ``litellm_imported``: whether litellm is imported on that path, read from one more run
  under ``python -X importtime`` (not timed); ``slowest_imports`` lists the top-level
  imports that cost the most in that run, cumulative microseconds, for whoever chases the
  figure.

Target (issue 2, lowered by issue 25): ``fermix memory list`` on an empty home answers in
under 0.3 s of wall time, with no litellm import on that path.

``fermix chat``'s first reply (issue 25): the chat runs on a pseudo-terminal, as at a
keyboard, against the loopback model server (``tests/model_server.py``, in this process,
answering at once), with background review off so that every request is the chat's own. The
user reads the banner and types a first message of :data:`FIRST_MESSAGE` at
:data:`TYPING_CPS` characters a second, then presses Enter; the figure is the time from
Enter to the reply on the screen:

- ``chat_first_reply_ms_*``: that time; the chat loads its model edge (litellm) in the
  background from its start, so the user's typing hides it. Target: p50 under 1 s;
- ``chat_first_reply_typed_ahead_ms_p50``: the same message sent the moment the prompt
  shows (no typing time at all), the worst case: what is left of the load;
- ``litellm_import_ms_p50``: ``python -c "import litellm"`` in the same run, for scale:
  what the first reply waited for before the chat loaded it in the background;
- ``chat_prompt_ms_p50``: from the spawn to the prompt on the screen;
- ``chat_rss_mb_after_one_turn``: the chat's resident memory (``VmRSS``) once the first
  reply is shown, the median over the runs (litellm alone is about 200 MB of it).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pty
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

TARGET_MS = 300.0
CHAT_TARGET_MS = 1000.0
QUICK_RUNS = 7
FULL_RUNS = 30
QUICK_CHAT_RUNS = 2
FULL_CHAT_RUNS = 7
SLOWEST_SHOWN = 5
FIRST_MESSAGE = "Hi! I'm Ana, a nurse in Porto, and I start night shifts next week."
TYPING_CPS = 8.0
"""Characters a second of the simulated user: 8 is a fast typist's ~95 words a minute, so
the message takes about 8 s."""
REPLY = "Nice to meet you, Ana. Good luck with the night shifts!"
PROMPT = b"you> "
CHAT_TIMEOUT_S = 120.0
ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}
"""The children's environment: bytecode cached, as a user's is; litellm's price map local."""


def memory_list(home: Path) -> list[str]:
    """The command line of ``fermix memory list`` on ``home``, as a real process."""
    return [sys.executable, "-m", "fermix.cli", "--home", str(home), "memory", "list"]


PYTHON_START = [sys.executable, "-c", "pass"]

BY_HAND = r"""
import os, re, sys
import apsw

home, schema = sys.argv[1], sys.argv[2]
os.makedirs(home, mode=0o700, exist_ok=True)
conn = apsw.Connection(os.path.join(home, "memory.db"))
conn.set_busy_timeout(5000)
version = conn.execute("PRAGMA user_version").fetchall()[0][0]
text = open(schema, encoding="utf-8").read()
heads = list(re.finditer(r"^-- migration (\d+): (.+)$", text, re.MULTILINE))
if version > len(heads):
    sys.exit("the database is newer than this schema")
if version < len(heads):
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    for i, head in enumerate(heads):
        number = int(head.group(1))
        if number <= version:
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        conn.execute("BEGIN IMMEDIATE")
        for _ in conn.execute(text[head.end():end]):
            pass
        conn.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
            (number, head.group(2).strip()),
        )
        conn.execute(f"PRAGMA user_version = {number}")
        conn.execute("COMMIT")
rows = conn.execute(
    "SELECT id, agent_id, owner_id, scope_type, scope_id, category, key, value, updated_at"
    " FROM memories WHERE archived_at IS NULL ORDER BY updated_at DESC, id DESC LIMIT 100"
).fetchall()
if rows:
    for row in rows:
        print(*row, sep="  ")
else:
    print("memory rows: no rows")
"""
"""``memory list`` by hand: apsw, the schema version, the migrations on a new file, the
same ``SELECT``, the same line printed. Arguments: the home and fermix's ``schema.sql``."""


def schema_path() -> Path:
    """fermix's ``schema.sql``, found without importing fermix into this process."""
    spec = importlib.util.find_spec("fermix")
    if spec is None or spec.origin is None:
        raise SystemExit("fermix is not installed in this interpreter")
    return Path(spec.origin).parent / "storage" / "sqlite" / "schema.sql"


def by_hand(script: Path, home: Path) -> list[str]:
    """The command line of the by-hand baseline on ``home``."""
    return [sys.executable, str(script), str(home), str(schema_path())]


def output(command: Sequence[str]) -> str:
    """What ``command`` prints (untimed), to check that the two commands say the same."""
    return subprocess.run(
        command, capture_output=True, text=True, env=ENV, check=True
    ).stdout.strip()


def timed_ms(command: Sequence[str]) -> float:
    """Wall milliseconds of one process, spawn to exit; a failing command stops the run."""
    start = time.perf_counter_ns()
    done = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, check=False
    )
    elapsed = (time.perf_counter_ns() - start) / 1e6
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip()
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {error}")
    return elapsed


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, nearest rank (no interpolation between two runs)."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def top_level_imports(importtime: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level import in ``-X importtime`` output."""
    costs: dict[str, int] = {}
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # nested imports are indented under their parent
            costs[name.strip()] = int(cumulative)
    return costs


def imported_modules(home: Path) -> tuple[list[str], dict[str, int]]:
    """Every module ``memory list`` imports, and the top-level ones' cumulative cost.

    From one untimed run under ``-X importtime``.
    """
    command = [sys.executable, "-X", "importtime", *memory_list(home)[1:]]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, check=False)
    if done.returncode != 0:
        raise SystemExit(f"memory list under -X importtime exited {done.returncode}")
    modules = [
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "cumulative" not in line
    ]
    return modules, top_level_imports(done.stderr)


class Chat:
    """``fermix chat`` on a pseudo-terminal (its controlling terminal, as at a keyboard)."""

    def __init__(self, home: Path, api_base: str) -> None:
        argv = [sys.executable, "-m", "fermix.cli", "--home", str(home), "chat"]
        argv += ["--model", "openai/bench", "--api-base", api_base]
        self.started = time.perf_counter()
        pid, fd = pty.fork()
        if pid == 0:  # the child: the command, nothing else
            try:
                os.execve(argv[0], argv, {**ENV, "TERM": "dumb"})
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.shown = b""

    def wait_for(self, wanted: bytes) -> float:
        """Read until ``wanted`` is on the screen; the ``perf_counter`` time it was read."""
        deadline = time.monotonic() + CHAT_TIMEOUT_S
        while wanted not in self.shown:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise SystemExit(f"fermix chat never showed {wanted!r}: {self.shown[-400:]!r}")
            try:
                self.shown += os.read(self.fd, 65536)
            except OSError as exc:  # EIO: the chat exited
                raise SystemExit(f"fermix chat exited: {self.shown[-400:]!r}") from exc
        return time.perf_counter()

    def rss_mb(self) -> float:
        """The chat's resident memory now, in MB."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        return int(kb) / 1024

    def close(self) -> None:
        """End of input (Ctrl-D), then reap; killed if it will not go."""
        os.write(self.fd, b"\x04")
        deadline = time.monotonic() + 30
        while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            select.select([self.fd], [], [], 0.1)  # drain what it prints as it leaves
            try:
                os.read(self.fd, 65536)
            except OSError:
                pass  # EIO: it closed the terminal
        os.close(self.fd)


def chat_turn(home: Path, api_base: str, typing_s: float) -> dict[str, float]:
    """One ``fermix chat``: the prompt, ``typing_s`` of typing, Enter, the first reply."""
    chat = Chat(home, api_base)
    try:
        prompt = chat.wait_for(PROMPT)
        typed = prompt + typing_s
        while (left := typed - time.perf_counter()) > 0:  # the user typing, not a thread
            time.sleep(left)
        enter = time.perf_counter()
        os.write(chat.fd, FIRST_MESSAGE.encode() + b"\n")
        replied = chat.wait_for(REPLY.encode())
        rss = chat.rss_mb()
    finally:
        chat.close()
    return {
        "prompt_ms": (prompt - chat.started) * 1000,
        "reply_ms": (replied - enter) * 1000,
        "rss_mb": rss,
    }


def chat_runs(tmp: Path, runs: int) -> dict[str, object]:
    """``fermix chat``'s first reply, typed and typed ahead, and litellm's import for scale."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _backends_memory import model_server_module

    typing_s = len(FIRST_MESSAGE) / TYPING_CPS
    import_litellm = [sys.executable, "-c", "import litellm"]
    samples: dict[str, list[float]] = {"typed": [], "ahead": [], "prompt": [], "rss": []}
    imports: list[float] = []
    with model_server_module().ModelServer() as server:
        home = tmp / "chat-home"
        home.mkdir()
        (home / "config.toml").write_text("[fermix_core.memory]\nreview_interval_hours = 0\n")
        server.reply(REPLY)
        chat_turn(home, server.url, 0.0)  # warm-up: the database, the caches, the bytecode
        timed_ms(import_litellm)
        for i in range(runs):
            for kind in ("typed", "ahead") if i % 2 == 0 else ("ahead", "typed"):
                server.reply(REPLY)
                turn = chat_turn(home, server.url, typing_s if kind == "typed" else 0.0)
                samples[kind].append(turn["reply_ms"])
                samples["prompt"].append(turn["prompt_ms"])
                if kind == "typed":
                    samples["rss"].append(turn["rss_mb"])
            imports.append(timed_ms(import_litellm))
    median = statistics.median
    return {
        "chat_runs": runs,
        "chat_typing_s": typing_s,
        "chat_first_reply_ms": median(samples["typed"]),
        "chat_first_reply_ms_max": max(samples["typed"]),
        "chat_first_reply_typed_ahead_ms_p50": median(samples["ahead"]),
        "litellm_import_ms_p50": median(imports),
        "chat_prompt_ms_p50": median(samples["prompt"]),
        "chat_rss_mb_after_one_turn": median(samples["rss"]),
        "chat_target_ms": CHAT_TARGET_MS,
        "chat_met": median(samples["typed"]) < CHAT_TARGET_MS,
    }


def run(runs: int, chats: int) -> dict[str, object]:
    """Time the command and its baselines ``runs`` times each and check the import path;
    then ``chats`` first replies of ``fermix chat`` of each kind."""
    with tempfile.TemporaryDirectory(prefix="fermix-cli-start-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        script = Path(tmp) / "by_hand.py"
        script.write_text(BY_HAND, encoding="utf-8")
        hand_home = Path(tmp) / "hand-home"
        commands = {
            "cli": memory_list(home),
            "hand": by_hand(script, hand_home),
            "python": PYTHON_START,
        }
        for command in commands.values():
            timed_ms(command)  # warm-up: creates both databases, fills the caches
        said, said_by_hand = output(commands["cli"]), output(commands["hand"])
        if said != said_by_hand:
            raise SystemExit(f"by hand printed {said_by_hand!r}, memory list {said!r}")
        samples: dict[str, list[float]] = {name: [] for name in commands}
        fresh: dict[str, list[float]] = {"cli": [], "hand": []}
        names = list(commands)
        for i in range(runs):
            for name in names[i % 3 :] + names[: i % 3]:
                samples[name].append(timed_ms(commands[name]))
            new = {
                "cli": memory_list(Path(tmp) / f"fresh-{i}"),
                "hand": by_hand(script, Path(tmp) / f"fresh-hand-{i}"),
            }
            for name in ("cli", "hand") if i % 2 == 0 else ("hand", "cli"):
                fresh[name].append(timed_ms(new[name]))
        modules, costs = imported_modules(home)
        chat = chat_runs(Path(tmp), chats)
    cli, hand, python = samples["cli"], samples["hand"], samples["python"]
    litellm = [m for m in modules if m == "litellm" or m.startswith("litellm.")]
    slowest = sorted(costs.items(), key=lambda item: item[1], reverse=True)[:SLOWEST_SHOWN]
    median = statistics.median
    return {
        "runs": runs,
        "memory_list_ms_p50": median(cli),
        "memory_list_ms_p95": percentile(cli, 95),
        "memory_list_by_hand_ms_p50": median(hand),
        "memory_list_by_hand_ms_p95": percentile(hand, 95),
        "memory_list_ratio_vs_by_hand": median(cli) / median(hand),
        "memory_list_fresh_ms_p50": median(fresh["cli"]),
        "memory_list_fresh_by_hand_ms_p50": median(fresh["hand"]),
        "memory_list_fresh_ratio_vs_by_hand": median(fresh["cli"]) / median(fresh["hand"]),
        "python_start_ms_p50": median(python),
        "python_start_ms_p95": percentile(python, 95),
        "fermix_own_ms_p50": median(cli) - median(python),
        "modules_imported": len(modules),
        "litellm_imported": bool(litellm),
        "slowest_imports": [{"module": name, "us": us} for name, us in slowest],
        "target_ms": TARGET_MS,
        **chat,
        "met": median(cli) < TARGET_MS and not litellm and bool(chat["chat_met"]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print a summary and, last, one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs of each")
    parser.add_argument("--runs", type=int, help=f"timed runs of each (default {FULL_RUNS})")
    parser.add_argument(
        "--chat-runs",
        type=int,
        help=f"fermix chat runs of each kind (default {FULL_CHAT_RUNS}, quick {QUICK_CHAT_RUNS})",
    )
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    figures = run(
        args.runs or (QUICK_RUNS if args.quick else FULL_RUNS),
        args.chat_runs or (QUICK_CHAT_RUNS if args.quick else FULL_CHAT_RUNS),
    )
    figures["loadavg_start"] = load_start
    figures["loadavg_end"] = os.getloadavg()[0]
    print(
        f"fermix memory list, empty home: p50 {figures['memory_list_ms_p50']:.1f} ms,"
        f" p95 {figures['memory_list_ms_p95']:.1f} ms; by hand: p50"
        f" {figures['memory_list_by_hand_ms_p50']:.1f} ms; python -c pass: p50"
        f" {figures['python_start_ms_p50']:.1f} ms; litellm imported:"
        f" {figures['litellm_imported']}; fermix chat's first reply {FIRST_MESSAGE!r} typed at"
        f" {TYPING_CPS:g} characters/s: p50 {figures['chat_first_reply_ms']:.0f} ms from"
        f" Enter ({figures['chat_first_reply_typed_ahead_ms_p50']:.0f} ms typed ahead;"
        f" import litellm {figures['litellm_import_ms_p50']:.0f} ms), RSS"
        f" {figures['chat_rss_mb_after_one_turn']:.0f} MB; targets p50 < {TARGET_MS:g} ms,"
        f" no litellm, first reply < {CHAT_TARGET_MS:g} ms:"
        f" {'met' if figures['met'] else 'MISSED'} (load average {load_start:.2f} ->"
        f" {figures['loadavg_end']:.2f})",
        file=sys.stderr,
    )
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
