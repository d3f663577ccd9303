"""Wall time of ``fermix memory list`` on an empty home, against the same work done by hand.

Usage: ``python bench/cli_start.py [--quick] [--runs N]``

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

Target (issue 2): ``fermix memory list`` on an empty home answers in under 0.5 s of wall
time, with no litellm import on that path. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

TARGET_MS = 500.0
QUICK_RUNS = 7
FULL_RUNS = 30
SLOWEST_SHOWN = 5


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
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def timed_ms(command: Sequence[str]) -> float:
    """Wall milliseconds of one process, spawn to exit; a failing command stops the run."""
    start = time.perf_counter_ns()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
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
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"memory list under -X importtime exited {done.returncode}")
    modules = [
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "cumulative" not in line
    ]
    return modules, top_level_imports(done.stderr)


def run(runs: int) -> dict[str, object]:
    """Time the command and its baselines ``runs`` times each and check the import path."""
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
        "met": median(cli) < TARGET_MS and not litellm,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print a summary and, last, one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs of each")
    parser.add_argument("--runs", type=int, help=f"timed runs of each (default {FULL_RUNS})")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    figures = run(args.runs or (QUICK_RUNS if args.quick else FULL_RUNS))
    figures["loadavg_start"] = load_start
    figures["loadavg_end"] = os.getloadavg()[0]
    print(
        f"fermix memory list, empty home: p50 {figures['memory_list_ms_p50']:.1f} ms,"
        f" p95 {figures['memory_list_ms_p95']:.1f} ms; by hand: p50"
        f" {figures['memory_list_by_hand_ms_p50']:.1f} ms; python -c pass: p50"
        f" {figures['python_start_ms_p50']:.1f} ms; litellm imported:"
        f" {figures['litellm_imported']}; target p50 < {TARGET_MS:g} ms, no litellm:"
        f" {'met' if figures['met'] else 'MISSED'} (load average {load_start:.2f} ->"
        f" {figures['loadavg_end']:.2f})",
        file=sys.stderr,
    )
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
