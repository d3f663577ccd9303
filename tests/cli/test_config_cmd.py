"""``fermix config show | get | set | unset | path`` through the real entry point (E8, K2)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix.cli import EXIT_FAILURE, EXIT_USAGE, main
from fermix.cli.config_cmd import looks_like_secret
from fermix.config import KEYS, load_config, parse_value, validate_key

HAND_EDITED = """\
# Tuned by hand for the support bot -- keep these notes.

[fermix_core.memory]
review_interval_hours = 12   # twice a day
# fewer messages: the bot's chats are short
review_max_messages = 20

[fermix_core.model]
primary = "openai/gpt-4o-mini"  # cheap and good enough
"""


def _config(home: Path, text: str = HAND_EDITED) -> Path:
    path = home / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_e8_config_set_keeps_every_comment_and_line_of_a_hand_edited_file(home: Path) -> None:
    path = _config(home)
    assert main(["config", "set", "fermix_core.memory.review_interval_hours", "6"]) == 0
    assert main(["config", "set", "fermix_core.compaction.threshold", "0.7"]) == 0
    text = path.read_text(encoding="utf-8")
    assert text.startswith(HAND_EDITED.replace("= 12   # twice", "= 6   # twice"))
    assert "[fermix_core.compaction]\nthreshold = 0.7\n" in text
    config = load_config(path)
    assert config.memory.review_interval_hours == 6.0
    assert config.memory.review_max_messages == 20
    assert config.compaction.threshold == 0.7


def test_e8_config_set_then_unset_gives_back_the_original_file(home: Path) -> None:
    path = _config(home)
    assert main(["config", "set", "fermix_core.model.fallbacks", '["openai/gpt-4o"]']) == 0
    assert load_config(path).model.fallbacks == ("openai/gpt-4o",)
    assert main(["config", "unset", "fermix_core.model.fallbacks"]) == 0
    assert path.read_text(encoding="utf-8") == HAND_EDITED


valid_values = st.sampled_from(
    [
        ("fermix_core.memory.review_interval_hours", "0"),
        ("fermix_core.memory.review_interval_hours", "1.5"),
        ("fermix_core.memory.review_max_messages", "7"),
        ("fermix_core.memory.max_conversation_history", "infinity"),
        ("fermix_core.memory.max_conversation_history", "300"),
        ("fermix_core.compaction.enabled", "false"),
        ("fermix_core.compaction.reasoning_effort", "high"),
        ("fermix_core.model.primary", "ollama/llama3"),
        ("fermix_core.model.fallbacks", '["a/b", "c/d"]'),
        ("fermix_core.model.api_base", "http://127.0.0.1:8080/v1"),
        ("fermix_core.model.api_key_env", "OPENAI_API_KEY"),
        ("fermix_core.realtime.persist_transcripts", "true"),
    ]
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(changes=st.lists(valid_values, min_size=1, max_size=4))
def test_e8_config_set_round_trips_through_get_and_keeps_the_comments(
    home: Path, capsys: pytest.CaptureFixture[str], changes: list[tuple[str, str]]
) -> None:
    _config(home)
    for key, text in changes:
        assert main(["config", "set", key, text]) == 0
    final = dict(changes)
    for key, text in final.items():
        got = _json(capsys, ["config", "get", key, "--json"])
        assert isinstance(got, dict) and got["set_in_file"] is True
        held = validate_key(key, parse_value(text))
        assert got["value"] == (list(held) if isinstance(held, tuple) else held)
    kept = (home / "config.toml").read_text(encoding="utf-8")
    for note in ("# Tuned by hand", "# fewer messages", "# cheap and good enough"):
        assert note in kept


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("fermix_core.memory.review_interval_hours", "-1", "must be a number >= 0, not -1"),
        ("fermix_core.memory.review_max_messages", "0", "must be an integer >= 1"),
        ("fermix_core.compaction.threshold", "1.5", "must be a number in (0, 1]"),
        ("fermix_core.compaction.enabled", "yes", "must be true or false"),
        ("fermix_core.compaction.reasoning_effort", "max", "must be one of"),
    ],
)
def test_e8_k2_a_bad_value_exits_2_naming_the_key_and_the_file_is_untouched(
    home: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, says: str
) -> None:
    path = _config(home)
    assert main(["config", "set", key, value]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert key in err and says in err and err.count("\n") == 1
    assert path.read_text(encoding="utf-8") == HAND_EDITED


def test_e8_an_unknown_key_exits_2_with_the_nearest_known_key(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _config(home)
    for argv in (
        ["config", "set", "fermix_core.memory.review_interval_hour", "3"],
        ["config", "get", "fermix_core.memory.review_interval_hour"],
        ["config", "unset", "fermix_core.memory.review_interval_hour"],
    ):
        assert main(argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert "fermix_core.memory.review_interval_hour: unknown key" in err
        assert "did you mean fermix_core.memory.review_interval_hours?" in err
    assert (home / "config.toml").read_text(encoding="utf-8") == HAND_EDITED


@pytest.mark.parametrize("secret", ["sk-proj-abc123", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"])
def test_e8_an_api_key_given_as_api_key_env_is_refused_and_never_echoed(
    home: Path, capsys: pytest.CaptureFixture[str], secret: str
) -> None:
    assert looks_like_secret(secret)
    assert main(["config", "set", "fermix_core.model.api_key_env", secret]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "fermix_core.model.api_key_env" in err and secret not in err
    assert not (home / "config.toml").exists()


def test_e8_config_show_gives_every_effective_value_and_marks_those_set_in_the_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _config(home)
    shown = _json(capsys, ["config", "show", "--json"])
    assert isinstance(shown, dict) and shown["exists"] is True
    entries = {e["key"]: e for e in shown["keys"]}
    assert set(entries) == set(KEYS)
    assert entries["fermix_core.memory.review_interval_hours"] | {"doc": ""} == {
        "key": "fermix_core.memory.review_interval_hours",
        "value": 12.0,
        "default": 24.0,
        "set_in_file": True,
        "accepts": "a number >= 0",
        "doc": "",
    }
    assert entries["fermix_core.compaction.threshold"]["set_in_file"] is False
    assert entries["fermix_core.compaction.threshold"]["value"] == 0.85
    assert main(["config", "show"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if "review_max_messages" in line)
    assert "20" in row and "config.toml" in row
    row = next(line for line in lines if "reasoning_effort" in line)
    assert '"medium"' in row and "default" in row


def test_e8_config_show_on_a_fresh_home_says_every_value_is_the_default(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "show"]) == 0
    assert "no file: every value is the default" in capsys.readouterr().out
    assert not (home / "config.toml").exists()


def test_e8_config_get_prints_text_as_is_values_as_toml_and_unset_as_nothing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _config(home)
    capsys.readouterr()
    for key, printed in (
        ("fermix_core.model.primary", "openai/gpt-4o-mini\n"),
        ("fermix_core.memory.review_max_messages", "20\n"),
        ("fermix_core.compaction.enabled", "true\n"),
        ("fermix_core.model.fallbacks", "[]\n"),
        ("fermix_core.model.api_base", ""),
    ):
        assert main(["config", "get", key]) == 0
        assert capsys.readouterr().out == printed


def test_e8_config_path_prints_the_file_of_the_chosen_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--home", str(tmp_path / "elsewhere"), "config", "path"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'elsewhere' / 'config.toml'}\n"


def test_e8_a_file_that_does_not_load_is_reported_naming_its_key(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(
        home, "[fermix_core.memory]\nreview_max_messages = 0\nreview_interval_hours = 1\n"
    )
    assert main(["config", "show"]) == EXIT_FAILURE
    assert "fermix_core.memory.review_max_messages" in capsys.readouterr().err
    # set still works, to repair the file one key at a time
    assert main(["config", "set", "fermix_core.memory.review_interval_hours", "2"]) == EXIT_FAILURE
    assert "still does not load" in capsys.readouterr().err
    assert main(["config", "set", "fermix_core.memory.review_max_messages", "5"]) == 0
    assert load_config(path).memory.review_interval_hours == 2.0


def test_e8_config_set_replaces_the_file_atomically_and_keeps_its_mode(home: Path) -> None:
    path = _config(home)
    os.chmod(path, 0o644)
    inode = path.stat().st_ino
    assert main(["config", "set", "fermix_core.memory.review_max_messages", "9"]) == 0
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in home.iterdir()] == ["config.toml"]  # no temporary file left


def test_e8_config_set_on_a_fresh_home_writes_every_key_commented_and_this_one_in_place(
    home: Path,
) -> None:
    assert main(["config", "set", "fermix_core.compaction.enabled", "false"]) == 0
    path = home / "config.toml"
    text = path.read_text(encoding="utf-8")
    assert "\nenabled = false\n# Fraction of the context window" in text
    assert "# review_interval_hours = 24.0" in text
    assert load_config(path).compaction.enabled is False
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # owner-only whatever the umask (M10)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("fermix_core = 5\n", "fermix_core must be a table, not 5"),
        ('[fermix_core]\nmemory = "daily"\n', 'fermix_core.memory must be a table, not "daily"'),
    ],
)
def test_e8_config_set_into_a_value_that_is_not_a_table_names_it_and_leaves_the_file(
    home: Path, capsys: pytest.CaptureFixture[str], text: str, named: str
) -> None:
    path = _config(home, text)
    for argv in (
        ["config", "set", "fermix_core.memory.review_max_messages", "9"],
        ["config", "unset", "fermix_core.memory.review_max_messages"],
    ):
        capsys.readouterr()
        assert main(argv) == EXIT_FAILURE
        assert named in capsys.readouterr().err
        assert path.read_text(encoding="utf-8") == text
