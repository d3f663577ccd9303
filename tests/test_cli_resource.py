"""``fermix resource ...`` and ``fermix memory restore`` as a real process (P2, C5, E10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fermix import model
from fermix.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from fermix.core import categories
from fermix.home import Home
from fermix.model import MemoryRow
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Database, Writes


def fermix(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m fermix.cli --home HOME ARGS`` and return what it did."""
    return subprocess.run(
        [sys.executable, "-m", "fermix.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "160"},
    )


def ok(home: Path, *args: str) -> str:
    proc = fermix(home, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def as_json(home: Path, *args: str) -> Any:
    return json.loads(ok(home, *args, "--json"))


class OtherProcess:
    """The home's database and write path opened as another process (a host) would."""

    def __init__(self, home: Path) -> None:
        self.db = Database(home / "memory.db")
        self.files = PromptFiles(Home(home), self.db)
        self.writer = Writer(self.db, self.files)

    def __enter__(self) -> OtherProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()


def remember(home: Path, category: str, key: str, value: str, owner_id: str = "") -> int:
    """Store a fact where the reviewer would, then rebuild that owner's files."""
    scope, row_owner = categories.reviewer_scope(
        category, agent_id="bot", owner_id=owner_id, trust="guest" if owner_id else "operator"
    )

    def unit(writes: Writes) -> list[MemoryRow]:
        return [
            writes.upsert_row(
                agent_id="bot",
                owner_id=row_owner,
                scope=scope,
                category=category,
                key=key,
                value=value,
                promote_target=model.TARGET_OF[category],
            )
        ]

    with OtherProcess(home) as other:
        written = other.writer.write_rows(unit, label="seed", also=[("bot", owner_id)])
        assert written.error is None
        return written.rows[0].id


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    remember(root, "preference", "drink", "Drinks green tea")
    remember(root, "context", "proj", "Writes a thesis on tides")
    remember(root, "preference", "drink", "Drinks black coffee")
    return root


def test_p2_list_history_show_diff_rollback_round_trip_through_the_cli(home: Path) -> None:
    listed = as_json(home, "resource", "list")
    assert [(r["name"], r["current_revision"]) for r in listed] == [
        ("memory_md", 1),
        ("user_md", 2),
    ]
    assert "USER.md" in ok(home, "resource", "list")

    history = as_json(home, "resource", "history", "user_md", "--agent", "bot")
    assert [(r["revision"], r["reason"]) for r in history] == [(2, "rebuild"), (1, "rebuild")]
    assert (
        len(as_json(home, "resource", "history", "user_md", "--agent", "bot", "--limit", "1")) == 1
    )
    assert "rebuild" in ok(home, "resource", "history", "user_md", "--agent", "bot")

    first = ok(home, "resource", "show", "user_md", "1", "--agent", "bot")
    assert "- Drinks green tea" in first and first.startswith("# USER.md")
    assert as_json(home, "resource", "show", "user_md", "1", "--agent", "bot")["content"] == first

    diff = ok(home, "resource", "diff", "user_md", "1", "2", "--agent", "bot")
    assert "--- USER.md@1" in diff and "+++ USER.md@2" in diff
    assert "-- Drinks green tea" in diff and "+- Drinks black coffee" in diff

    done = as_json(home, "resource", "rollback", "user_md", "1", "--agent", "bot")
    assert done["recorded_revision"] == 3 and done["written"] is True
    user_md = home / "memory" / "bot" / "USER.md"
    assert user_md.read_text("utf-8") == first
    history = as_json(home, "resource", "history", "user_md", "--agent", "bot")
    assert history[0]["reason"] == "rollback:1"

    # The file is derived: the next rebuild from unchanged rows writes the rendered text again.
    with OtherProcess(home) as other:
        other.files.rebuild("bot")
    assert "- Drinks black coffee" in user_md.read_text("utf-8")
    assert as_json(home, "resource", "list")[1]["current_revision"] == 4


def test_p2_rollback_prints_what_it_did_and_that_a_rebuild_will_replace_it(home: Path) -> None:
    out = ok(home, "resource", "rollback", "user_md", "1", "--agent", "bot")
    assert "rolled back to revision 1" in out and "recorded as revision 3" in out


def test_p2_resources_of_other_owners_are_kept_apart(home: Path) -> None:
    remember(home, "identity", "name", "Alice is a nurse", owner_id="alice")
    mine = as_json(home, "resource", "list", "--owner", "alice")
    assert [(r["owner_id"], r["name"]) for r in mine] == [
        ("alice", "memory_md"),
        ("alice", "user_md"),
    ]
    shown = ok(home, "resource", "show", "user_md", "1", "--agent", "bot", "--owner", "alice")
    assert "Alice is a nurse" in shown and "coffee" not in shown
    assert (home / "memory/bot/owners/alice/USER.md").read_text("utf-8") == shown
    shared = ok(home, "resource", "show", "memory_md", "1", "--agent", "bot", "--owner", "alice")
    assert "tides" in shared  # operator context is shared with every owner of the agent


def test_h3_unknown_revisions_and_unsafe_ids_are_one_line_errors(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = fermix(home, "resource", "show", "user_md", "9", "--agent", "bot")
    assert missing.returncode == EXIT_NOT_FOUND and missing.stderr.count("\n") == 1
    assert main(
        ["--home", str(home), "resource", "rollback", "user_md", "1", "--agent", "../etc"]
    ) == (EXIT_USAGE)
    assert main(
        ["--home", str(home), "resource", "diff", "memory_md", "1", "7", "--agent", "bot"]
    ) == (EXIT_NOT_FOUND)
    err = capsys.readouterr().err
    assert "safe path segment" in err and err.count("\n") == 2 and "Traceback" not in err
    for argv in (["history", "user_md"], ["history", "passwords", "--agent", "bot"]):
        with pytest.raises(SystemExit) as exited:
            main(["--home", str(home), "resource", *argv])
        assert exited.value.code == EXIT_USAGE


def test_c5_memory_restore_rebuilds_the_prompt_files_of_its_agent_and_owner(home: Path) -> None:
    row_id = remember(home, "goal", "race", "Runs a marathon in May", owner_id="alice")
    with OtherProcess(home) as other:
        other.writer.write_rows(
            lambda w: [w.archive_row(row_id, by="reviewer", reason="race cancelled")],
            label="archive",
        )
    user_md = home / "memory/bot/owners/alice/USER.md"
    assert "marathon" not in user_md.read_text("utf-8")
    out = as_json(home, "memory", "restore", str(row_id))
    assert out["was_archived"] is True
    assert [(r["owner_id"], r["name"]) for r in out["rebuilt"]] == [("alice", "user_md")]
    assert "- Runs a marathon in May" in user_md.read_text("utf-8")
    history = as_json(home, "resource", "history", "user_md", "--agent", "bot", "--owner", "alice")
    assert history[0]["reason"] == f"restore:{row_id}"


def test_c3_memory_list_shows_where_each_row_renders(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--home", str(home), "memory", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["renders_in"] for r in rows) == ["memory_md", "user_md"]
    assert main(["--home", str(home), "memory", "list"]) == 0
    table = capsys.readouterr().out
    assert "USER.md" in table and "MEMORY.md" in table
