"""Wall time of ``fermix memory list`` on an empty home, against the interpreter's own start.

Usage: ``python bench/cli_start.py [--quick] [--runs N]``

Each run starts a real process, as an operator's shell does: ``python -m fermix.cli --home
HOME memory list`` with this interpreter, timed from before the spawn to after the exit
with ``time.perf_counter_ns``, output discarded. The baseline, in the same run, is
``python -c pass``: the interpreter's start and ``site`` with nothing of fermix. The two are
timed in alternating pairs, in a rotating order, so that a change in machine load hits both
alike. One warm-up pair is not counted (it creates the database and fills the OS's caches).

- ``memory_list_ms_*``: on a home whose database exists and holds no rows (the warm-up made
  it), the usual case;
- ``memory_list_fresh_ms_p50``: on a brand-new directory each run, so the command also
  creates the database and applies the migrations;
- ``litellm_imported``: whether litellm is imported on that path, read from one more run
  under ``python -X importtime`` (not timed); ``slowest_imports`` lists the top-level
  imports that cost the most in that run, cumulative microseconds, for whoever chases the
  figure.

Target (issue 2): ``fermix memory list`` on an empty home answers in under 0.5 s of wall
time, with no litellm import on that path. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
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
    """Time both commands ``runs`` times each and check the import path."""
    with tempfile.TemporaryDirectory(prefix="fermix-cli-start-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        timed_ms(memory_list(home))
        timed_ms(PYTHON_START)
        cli: list[float] = []
        python: list[float] = []
        fresh: list[float] = []
        for i in range(runs):
            pair = [(cli, memory_list(home)), (python, PYTHON_START)]
            for samples, command in pair if i % 2 == 0 else reversed(pair):
                samples.append(timed_ms(command))
            new_home = Path(tmp) / f"fresh-{i}"
            fresh.append(timed_ms(memory_list(new_home)))
        modules, costs = imported_modules(home)
    litellm = [m for m in modules if m == "litellm" or m.startswith("litellm.")]
    slowest = sorted(costs.items(), key=lambda item: item[1], reverse=True)[:SLOWEST_SHOWN]
    return {
        "runs": runs,
        "memory_list_ms_p50": statistics.median(cli),
        "memory_list_ms_p95": percentile(cli, 95),
        "memory_list_fresh_ms_p50": statistics.median(fresh),
        "python_start_ms_p50": statistics.median(python),
        "python_start_ms_p95": percentile(python, 95),
        "fermix_own_ms_p50": statistics.median(cli) - statistics.median(python),
        "modules_imported": len(modules),
        "litellm_imported": bool(litellm),
        "slowest_imports": [{"module": name, "us": us} for name, us in slowest],
        "target_ms": TARGET_MS,
        "met": statistics.median(cli) < TARGET_MS and not litellm,
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
        f" p95 {figures['memory_list_ms_p95']:.1f} ms; python -c pass: p50"
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
