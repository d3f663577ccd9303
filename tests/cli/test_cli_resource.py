"""``fermix resource ...`` and ``fermix memory restore`` through :func:`fermix.cli.main` in
this process, on a home another process wrote (P2, C5, E10)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories import fact, other_process

from fermix.cli import EXIT_NOT_FOUND, EXIT_USAGE, main


@dataclass
class Cli:
    """``fermix --home HOME ...`` run in this process; each call returns what it printed."""

    home: Path
    capsys: pytest.CaptureFixture[str]

    def run(self, *args: str) -> tuple[int, str, str]:
        """The exit code, stdout and stderr of one command."""
        self.capsys.readouterr()
        code = main(["--home", str(self.home), *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *args: str) -> str:
        code, out, err = self.run(*args)
        assert code == 0, err
        return out

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))


def remember(home: Path, category: str, key: str, value: str, owner_id: str = "") -> int:
    """Store a fact of agent ``bot`` where the reviewer would, then rebuild that owner's files,
    as another process would."""
    with other_process(home) as writer:
        unit = fact(category, key, value, agent_id="bot", owner_id=owner_id)
        written = writer.write_rows(unit, label="seed", also=[("bot", owner_id)])
        assert written.error is None
        return written.rows[0].id


@pytest.fixture
def seeded_home(home: Path) -> Path:
    """The temporary home as another process left it: agent ``bot``'s USER.md at revision 2
    (green tea, then black coffee) and its MEMORY.md at revision 1 (a thesis on tides)."""
    remember(home, "preference", "drink", "Drinks green tea")
    remember(home, "context", "proj", "Writes a thesis on tides")
    remember(home, "preference", "drink", "Drinks black coffee")
    return home


@pytest.fixture
def cli(
    seeded_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    """``fermix`` on the seeded home, in this process, in a terminal 160 columns wide."""
    monkeypatch.setenv("COLUMNS", "160")
    return Cli(seeded_home, capsys)


def test_p2_list_history_show_diff_rollback_round_trip_through_the_cli(cli: Cli) -> None:
    listed = cli.json("resource", "list")
    assert [(r["name"], r["current_revision"]) for r in listed] == [
        ("memory_md", 1),
        ("user_md", 2),
    ]
    assert "USER.md" in cli.ok("resource", "list")

    history = cli.json("resource", "history", "user_md", "--agent", "bot")
    assert [(r["revision"], r["reason"]) for r in history] == [(2, "rebuild"), (1, "rebuild")]
    assert len(cli.json("resource", "history", "user_md", "--agent", "bot", "--limit", "1")) == 1
    assert "rebuild" in cli.ok("resource", "history", "user_md", "--agent", "bot")

    first = cli.ok("resource", "show", "user_md", "1", "--agent", "bot")
    assert "- Drinks green tea" in first and first.startswith("# USER.md")
    assert cli.json("resource", "show", "user_md", "1", "--agent", "bot")["content"] == first

    diff = cli.ok("resource", "diff", "user_md", "1", "2", "--agent", "bot")
    assert "--- USER.md@1" in diff and "+++ USER.md@2" in diff
    assert "-- Drinks green tea" in diff and "+- Drinks black coffee" in diff

    done = cli.json("resource", "rollback", "user_md", "1", "--agent", "bot")
    assert done["recorded_revision"] == 3 and done["written"] is True
    user_md = cli.home / "memory" / "bot" / "USER.md"
    assert user_md.read_text("utf-8") == first
    history = cli.json("resource", "history", "user_md", "--agent", "bot")
    assert history[0]["reason"] == "rollback:1"

    # The file is derived: the next rebuild from unchanged rows writes the rendered text again.
    with other_process(cli.home) as writer:
        writer.files.rebuild("bot")
    assert "- Drinks black coffee" in user_md.read_text("utf-8")
    assert cli.json("resource", "list")[1]["current_revision"] == 4


def test_p2_rollback_prints_what_it_did_and_that_a_rebuild_will_replace_it(cli: Cli) -> None:
    out = cli.ok("resource", "rollback", "user_md", "1", "--agent", "bot")
    assert "rolled back to revision 1" in out and "recorded as revision 3" in out


def test_p2_resources_of_other_owners_are_kept_apart(cli: Cli) -> None:
    remember(cli.home, "identity", "name", "Alice is a nurse", owner_id="alice")
    mine = cli.json("resource", "list", "--owner", "alice")
    assert [(r["owner_id"], r["name"]) for r in mine] == [
        ("alice", "memory_md"),
        ("alice", "user_md"),
    ]
    shown = cli.ok("resource", "show", "user_md", "1", "--agent", "bot", "--owner", "alice")
    assert "Alice is a nurse" in shown and "coffee" not in shown
    assert (cli.home / "memory/bot/owners/alice/USER.md").read_text("utf-8") == shown
    shared = cli.ok("resource", "show", "memory_md", "1", "--agent", "bot", "--owner", "alice")
    assert "tides" in shared  # operator context is shared with every owner of the agent


def test_h3_unknown_revisions_and_unsafe_ids_are_one_line_errors(cli: Cli) -> None:
    code, _, err = cli.run("resource", "show", "user_md", "9", "--agent", "bot")
    assert code == EXIT_NOT_FOUND and err.count("\n") == 1
    code, _, unsafe = cli.run("resource", "rollback", "user_md", "1", "--agent", "../etc")
    assert code == EXIT_USAGE
    code, _, missing = cli.run("resource", "diff", "memory_md", "1", "7", "--agent", "bot")
    assert code == EXIT_NOT_FOUND
    err = unsafe + missing
    assert "safe path segment" in err and err.count("\n") == 2 and "Traceback" not in err
    for argv in (["history", "user_md"], ["history", "passwords", "--agent", "bot"]):
        with pytest.raises(SystemExit) as exited:
            cli.run("resource", *argv)
        assert exited.value.code == EXIT_USAGE


def test_c5_memory_restore_rebuilds_the_prompt_files_of_its_agent_and_owner(cli: Cli) -> None:
    row_id = remember(cli.home, "goal", "race", "Runs a marathon in May", owner_id="alice")
    with other_process(cli.home) as writer:
        writer.write_rows(
            lambda w: [w.archive_row(row_id, by="reviewer", reason="race cancelled")],
            label="archive",
        )
    user_md = cli.home / "memory/bot/owners/alice/USER.md"
    assert "marathon" not in user_md.read_text("utf-8")
    out = cli.json("memory", "restore", str(row_id))
    assert out["was_archived"] is True
    assert [(r["owner_id"], r["name"]) for r in out["rebuilt"]] == [("alice", "user_md")]
    assert "- Runs a marathon in May" in user_md.read_text("utf-8")
    history = cli.json("resource", "history", "user_md", "--agent", "bot", "--owner", "alice")
    assert history[0]["reason"] == f"restore:{row_id}"


def test_c3_memory_list_shows_where_each_row_renders(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    rows = cli.json("memory", "list")
    assert sorted(r["renders_in"] for r in rows) == ["memory_md", "user_md"]
    table = cli.ok("memory", "list")
    assert "USER.md" in table and "MEMORY.md" in table
