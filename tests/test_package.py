"""The package as it ships: the wheel carries the schema, the entry point runs (Shape, S2)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_built_wheel_ships_schema_sql_and_the_console_script(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("fermix-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "fermix = fermix.cli:run" in archive.read(entry_points).decode()
    assert "fermix/schema.sql" in names and "fermix/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]
