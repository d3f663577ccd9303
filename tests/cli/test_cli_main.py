"""The ``fermix`` entry point itself: no arguments, ``--version``, ``--home`` anywhere, and the
installed console script as a real process (H3, issue 11)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

import fermix.cli
from fermix.cli import EXIT_OK, build_parser, main
from fermix.model import Scope
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.session import SqliteWrites


def _seed_one_row(home: Path, value: str) -> None:
    conn = open_database(home / "memory.db")
    with transaction(conn):
        SqliteWrites(conn).upsert_row(
            agent_id="agent",
            owner_id="alice",
            scope=Scope("owner", "alice"),
            category="preference",
            key="drink",
            value=value,
            promote_target="user_md",
        )
    conn.close()


def _values(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    assert main(argv) == 0
    return [row["value"] for row in json.loads(capsys.readouterr().out)]


def test_fermix_with_no_arguments_prints_the_help_on_stdout_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == EXIT_OK
    shown = capsys.readouterr()
    assert shown.out.startswith("usage: fermix")
    assert "memory" in shown.out and "--home DIR" in shown.out and "--version" in shown.out
    assert shown.err == ""


def test_fermix_version_prints_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"fermix {metadata.version('fermix')}\n"


def test_fermix_version_says_unknown_when_fermix_is_not_installed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == "fermix unknown\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--home", "{home}", "memory", "list", "--json"],
        ["memory", "--home", "{home}", "list", "--json"],
        ["memory", "list", "--home", "{home}", "--json"],
        ["memory", "list", "--json", "--home", "{home}"],
    ],
    ids=["before the command", "after the group", "after the command", "last"],
)
def test_h3_home_is_taken_before_or_after_the_command(
    argv: list[str],
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    _seed_one_row(chosen, "in the chosen home")
    _seed_one_row(home, "in $FERMIX_HOME")  # what a --home that is ignored would show
    argv = [a.replace("{home}", str(chosen)) for a in argv]
    assert _values(capsys, argv) == ["in the chosen home"]


def test_h3_home_after_the_command_wins_over_home_before_it_and_absent_keeps_it(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for path in (first, second):
        path.mkdir()
        _seed_one_row(path, path.name)
    both = ["--home", str(first), "memory", "list", "--home", str(second), "--json"]
    assert _values(capsys, both) == ["second"]
    # not given after the command: the subcommand's --home must not reset it to a default
    assert _values(capsys, ["--home", str(first), "memory", "list", "--json"]) == ["first"]


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_h3_every_command_and_command_group_takes_home() -> None:
    without = [
        " ".join(path) or "fermix"
        for path, parser in _parsers(build_parser())
        if "--home" not in parser._option_string_actions
    ]
    assert without == []
    assert len(list(_parsers(build_parser()))) > 10


def test_the_installed_console_script_runs_as_a_real_process(home: Path) -> None:
    script = Path(sys.executable).with_name("fermix")
    assert script.exists(), f"no console script at {script}: install the package (bin/venv)"
    version = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (version.returncode, version.stdout, version.stderr) == (
        0,
        f"fermix {fermix.cli.version()}\n",
        "",
    )
    listed = subprocess.run(
        [str(script), "memory", "list", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == "memory rows: no rows\n"
