"""``fermix memory list | show | search | restore`` (S7, E10) through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fermix.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from fermix.model import Scope
from fermix.storage import memories, open_database, transaction


def _seed(home: Path) -> dict[str, int]:
    conn = open_database(home / "memory.db")
    ids = {}
    with transaction(conn):
        for owner, key, value, category in [
            ("alice", "drink", "Alice drinks green tea", "preference"),
            ("bob", "drink", "Bob drinks espresso", "preference"),
            ("alice", "job", "Alice is a nurse", "identity"),
        ]:
            row = memories.upsert(
                conn,
                agent_id="agent",
                owner_id=owner,
                scope=Scope("owner", owner),
                category=category,
                key=key,
                value=value,
                promote_target="user_md",
            )
            ids[f"{owner}.{key}"] = row.id
        memories.archive(conn, ids["alice.job"], by="operator", reason="changed job")
    conn.close()
    return ids


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_s7_list_filters_by_owner_and_hides_archived_rows(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _seed(home)
    rows = _json(capsys, ["memory", "list", "--owner", "alice", "--json"])
    assert [r["id"] for r in rows] == [ids["alice.drink"]]  # type: ignore[index]
    archived = _json(capsys, ["memory", "list", "--archived", "--json"])
    assert [r["id"] for r in archived] == [ids["alice.job"]]  # type: ignore[index]


def test_s7_list_as_a_table_shows_keys_and_values(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    _seed(home)
    assert main(["memory", "list", "--scope", "owner:bob"]) == 0
    out = capsys.readouterr().out
    assert "Bob drinks espresso" in out and "green tea" not in out


def test_t2_search_treats_fts_syntax_as_words(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _seed(home)
    rows = _json(capsys, ["memory", "search", 'espresso AND "(', "--json"])
    assert [r["id"] for r in rows] == [ids["bob.drink"]]  # type: ignore[index]


def test_s7_restore_clears_the_archive_fields(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _seed(home)
    out = _json(capsys, ["memory", "restore", str(ids["alice.job"]), "--json"])
    assert out["was_archived"] is True  # type: ignore[index]
    shown = _json(capsys, ["memory", "show", str(ids["alice.job"]), "--json"])
    assert shown["archived_at"] is None and shown["archive_reason"] is None  # type: ignore[index]


def test_h3_unknown_ids_and_bad_filters_are_one_line_errors(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["memory", "show", "999"]) == EXIT_NOT_FOUND
    assert main(["memory", "list", "--scope", "planet"]) == EXIT_USAGE
    assert main(["memory", "list", "--limit", "-5"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err


def test_memory_list_on_an_empty_home_never_imports_litellm(home: Path) -> None:
    code = (
        "import sys; from fermix.cli import main; code = main(['memory', 'list']);"
        "assert 'litellm' not in sys.modules, 'litellm imported'; sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "no rows" in proc.stdout


def test_every_cli_command_is_documented_in_the_readme() -> None:
    from fermix.cli import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    parser = build_parser()
    missing = []
    for group_name, group in _subparsers(parser).items():
        for command in _subparsers(group) or {"": None}:
            phrase = f"fermix {group_name} {command}".strip()
            if phrase not in readme:
                missing.append(phrase)
    assert missing == []


def _subparsers(parser: object) -> dict[str, object]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_h3_a_raw_database_error_in_a_command_is_one_line_and_exit_1(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import apsw

    import fermix.cli.memory

    def busy(ctx: object, args: object) -> int:
        raise apsw.BusyError("database is locked")

    monkeypatch.setattr(fermix.cli.memory, "cmd_list", busy)
    assert main(["memory", "list"]) == 1
    err = capsys.readouterr().err
    assert err == "fermix: database error: database is locked\n"
