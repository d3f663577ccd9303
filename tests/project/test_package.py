"""The package as it ships: the wheel carries the schema, the entry point runs (Shape, S2)."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        project: dict[str, object] = tomllib.load(fh)["project"]
    return project


def _requirements(group: str | None = None) -> dict[str, Requirement]:
    """pyproject.toml's runtime dependencies, or the extra ``group``, by distribution name."""
    project = _project()
    listed = project["dependencies"] if group is None else project["optional-dependencies"]
    texts = listed if group is None else listed[group]  # type: ignore[index]
    return {r.name: r for r in map(Requirement, texts)}  # type: ignore[arg-type]


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.slow  # builds the wheel with pip
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
    assert "fermix/storage/sqlite/schema.sql" in names and "fermix/py.typed" in names
    assert "fermix/storage/postgres/schema.sql" in names  # the PostgreSQL migrations (B1)
    assets = ROOT / "fermix" / "server" / "http" / "console_assets"
    shipped = {n.rsplit("/", 1)[-1] for n in names if "/console_assets/" in n}
    assert shipped == {p.name for p in assets.iterdir() if p.is_file()}  # the console (W1)
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]


def test_importing_the_host_api_and_the_config_does_not_import_tomlkit() -> None:
    # Only the CLI edits config.toml (fermix/cli/config_file.py); hosts load it with tomllib.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fermix.api, fermix.config, sys; assert 'tomlkit' not in sys.modules",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_only_the_cli_config_file_module_imports_tomlkit() -> None:
    importers = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "fermix").rglob("*.py")
        if "tomlkit" in _imported_top_levels(path)
    )
    assert "fermix/cli/config_file.py" in importers
    assert all(name.startswith("fermix/cli/") for name in importers), importers


@pytest.mark.parametrize("dev_only", ["hypothesis", "pytest"])
def test_a_test_tool_is_a_dev_extra_that_nothing_in_the_package_imports(dev_only: str) -> None:
    assert dev_only not in _requirements()
    assert dev_only in _requirements("dev")
    importers = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "fermix").rglob("*.py")
        if dev_only in _imported_top_levels(path)
    ]
    assert importers == []


def test_every_runtime_dependency_installed_satisfies_its_pin() -> None:
    for name, requirement in _requirements().items():
        installed = importlib.metadata.version(name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{name} {installed} does not satisfy {requirement}"
        )


@pytest.mark.parametrize(
    ("name", "below", "within"),
    [
        ("pykka", "4.4", "4.5.0"),  # fermix/actors/base.py overrides pykka 4.5's internals
        ("jsonschema", "4.17.3", "4.18.0"),  # Draft 2020-12 with referencing-based $ref
    ],
)
def test_a_runtime_pin_refuses_versions_older_than_fermix_relies_on(
    name: str, below: str, within: str
) -> None:
    specifier = _requirements()[name].specifier
    assert not specifier.contains(below) and specifier.contains(within)
