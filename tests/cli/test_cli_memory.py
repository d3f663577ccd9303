"""``fermix memory list | show | search | restore`` (S7, E10) through the real entry point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from factories import memory_row

from fermix.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from fermix.model import Scope
from fermix.storage.sqlite.connection import transaction
from fermix.storage.sqlite.migrations import open_database
from fermix.storage.sqlite.session import SqliteWrites


def _seed(home: Path) -> dict[str, int]:
    conn = open_database(home / "memory.db")
    ids = {}
    with transaction(conn):
        for owner, key, value, category in [
            ("alice", "drink", "Alice drinks green tea", "preference"),
            ("bob", "drink", "Bob drinks espresso", "preference"),
            ("alice", "job", "Alice is a nurse", "identity"),
        ]:
            row = SqliteWrites(conn).upsert_row(
                agent_id="agent",
                owner_id=owner,
                scope=Scope("owner", owner),
                category=category,
                key=key,
                value=value,
                promote_target="user_md",
            )
            ids[f"{owner}.{key}"] = row.id
        SqliteWrites(conn).archive_row(ids["alice.job"], by="operator", reason="changed job")
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
    """Nor numpy (issue 25: 60 ms of its 300 ms target), which only a search needs."""
    code = (
        "import sys; from fermix.cli import main; code = main(['memory', 'list']);"
        "assert 'litellm' not in sys.modules, 'litellm imported';"
        "assert 'numpy' not in sys.modules, 'numpy imported'; sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "no rows" in proc.stdout


def test_every_cli_command_is_documented_in_the_readme() -> None:
    from fermix.cli import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
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


def test_h3_a_database_error_in_a_command_is_one_line_and_exit_1(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "memory.db").write_bytes(b"this is not a database, just bytes " * 200)
    assert main(["--home", str(home), "memory", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fermix: ") and err.count("\n") == 1
    assert "Traceback" not in err


# -- at 80 columns (issue 11) --------------------------------------------------------------

HEADERS = ["id", "owner", "scope", "category", "key", "value", "renders", "updated"]
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d")


def _table(lines: list[str], width: int) -> tuple[str, str, list[str]]:
    """The title, header line and row lines of a rendered table no wider than ``width``."""
    assert all(len(line.rstrip()) <= width for line in lines), lines
    title, header, rule, *rows = lines
    assert set(rule.strip()) == {"─"}
    return title.strip(), header, rows


def _table_at(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str
) -> tuple[str, str, list[str]]:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["memory", "list", *argv]) == 0
    return _table(capsys.readouterr().out.splitlines(), width)


def test_s7_at_80_columns_the_list_keeps_headers_and_short_cells_whole_and_wraps_only_the_value(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(home)
    title, header, rows = _table_at(80, capsys, monkeypatch)
    assert title == "memory rows · agent agent"  # one agent: said once, in the title
    assert header.split() == HEADERS
    first = [row for row in rows if row[:1].isdigit()]
    assert [row.split()[:4] for row in first] == [
        ["2", "bob", "owner", "preference"],
        ["1", "alice", "owner", "preference"],
    ]
    assert all(TIMESTAMP.search(row) and "USER.md" in row for row in first)
    assert " ".join(" ".join(rows).split()).count("drinks") == 2


def test_s7_at_80_columns_long_ids_and_values_are_cut_or_wrapped_never_the_short_columns(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = open_database(home / "memory.db")
    with transaction(conn):
        for owner, scope in [
            ("a-rather-long-owner-id-from-a-chat-platform", Scope("conversation", "tg:1234567890")),
            ("alice", Scope("owner", "alice")),
        ]:
            SqliteWrites(conn).upsert_row(
                agent_id="assistant",
                owner_id=owner,
                scope=scope,
                category="preference",
                key="a_key_of_some_length",
                value="A value long enough to need several lines at eighty columns, " * 3,
                promote_target="user_md",
            )
    conn.close()
    _, header, rows = _table_at(80, capsys, monkeypatch)
    assert header.split() == HEADERS
    first = [row for row in rows if row[:1].isdigit()]
    assert len(first) == 2
    for row in first:
        cells = row.split()
        assert cells[3] == "preference"
        assert TIMESTAMP.search(row)
    owners = sorted(row.split()[1] for row in first)
    assert owners[0].startswith("a-r") and owners[0].endswith("…")  # cut, not wrapped
    assert owners[1] == "alice"


def test_s7_the_archived_list_says_so_in_its_title_not_in_each_category(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(home)
    title, header, rows = _table_at(80, capsys, monkeypatch, "--archived")
    assert title == "archived memory rows · agent agent · owner alice"
    assert header.split() == [h for h in HEADERS if h != "owner"]
    assert rows[0].split()[:3] == ["3", "owner", "identity"]


def test_s7_the_rows_table_has_every_column_when_agents_and_owners_differ() -> None:
    from rich.console import Console

    from fermix.cli.memory import rows_table

    rows = [
        memory_row(id=7, agent_id="bot", owner_id="alice", category="preference"),
        memory_row(
            id=8,
            agent_id="helper",
            owner_id="",
            scope_type="agent",
            scope_id="helper",
            category="context",
            promote_target="memory_md",
        ),
    ]
    out = Console(record=True, width=80)
    out.print(rows_table("memory rows", rows))
    title, header, lines = _table(out.export_text().splitlines(), 80)
    assert title == "memory rows"
    assert header.split() == ["id", "agent", "owner", "scope", *HEADERS[3:]]
    assert lines[0].split()[:5] == ["7", "bot", "alice", "owner", "preference"]
    assert lines[1].split()[:4] == ["8", "helper", "agent", "context"]
    assert "MEMORY.md" in lines[1]
