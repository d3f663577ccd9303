"""``fermix owner forget | export | erasures`` through the real entry point (F1, F5, F6, F8),
and what ``fermix doctor`` says of erasures and retention (F5, F7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import other_process

from fermix.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from fermix.model import ConversationKey, NewMessage


def _seed(home: Path) -> None:
    with other_process(home) as writer:
        for owner, text in [("alice", "alice says zucchinifloatzq"), ("bob", "bob says hello")]:
            key = ConversationKey("bot", "tg", f"{owner}-dm")
            writer.append(NewMessage(key, "user", text, owner_id=owner), trust="guest")


def test_f8_forget_asks_for_yes_and_refuses_an_unknown_owner_or_a_pattern(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(home)
    assert main(["--home", str(home), "owner", "forget", "alice"]) == EXIT_USAGE
    assert "--yes" in capsys.readouterr().err
    assert main(["--home", str(home), "owner", "forget", "nobody", "--yes"]) == EXIT_NOT_FOUND
    assert main(["--home", str(home), "owner", "forget", "%", "--yes"]) == EXIT_USAGE
    assert main(["--home", str(home), "owner", "erasures", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["erasures"] == []
    assert b"zucchinifloatzq" in (home / "memory.db").read_bytes() + _wal(home)


def _wal(home: Path) -> bytes:
    wal = home / "memory.db-wal"
    return wal.read_bytes() if wal.exists() else b""


def test_f1_f6_export_then_forget_from_the_command_line(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(home)
    out = tmp_path / "alice.json"
    assert main(["--home", str(home), "owner", "export", "alice", "-o", str(out)]) == 0
    document = json.loads(out.read_text(encoding="utf-8"))
    assert [m["content"] for m in document["messages"]] == ["alice says zucchinifloatzq"]
    assert main(["--home", str(home), "owner", "export", "alice"]) == 0
    assert json.loads(capsys.readouterr().out)["owner_id"] == "alice"

    assert main(["--home", str(home), "owner", "forget", "alice", "--yes", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "done" and report["counts"]["messages"] == 1
    assert b"zucchinifloatzq" not in (home / "memory.db").read_bytes() + _wal(home)
    assert main(["--home", str(home), "owner", "erasures", "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["erasures"]
    assert record["requested_by"] == "operator" and "alice" not in json.dumps(record)
    assert main(["--home", str(home), "doctor", "--json"]) in (0, 1)
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["erasures"]["status"] == "pass"
    assert checks["retention"]["summary"] == "retention is off: everything is kept"


def test_f7_doctor_says_what_retention_drops_next(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(home)
    (home / "config.toml").write_text(
        "[fermix_core.retention]\nmessages_days = 30\ndrop_unreviewed = true\n", encoding="utf-8"
    )
    assert main(["--home", str(home), "doctor", "--json"]) in (0, 1)
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["retention"]["details"] == [{"messages": 0}]
