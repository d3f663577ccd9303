"""The home directory and config.toml: defaults, overrides and every kind of bad value."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path

import pytest
import tomlkit
from hypothesis import given
from hypothesis import strategies as st

from fermix.cli.config_file import defaults_toml
from fermix.config import (
    KEYS,
    CompactionConfig,
    Config,
    MemoryConfig,
    ModelConfig,
    RealtimeConfig,
    load_config,
    parse_value,
    validate_key,
)
from fermix.errors import ConfigError, InvalidInputError, UnsafePathSegmentError
from fermix.home import Home, resolve_home


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- home directory ---


def test_home_given_explicitly_wins_over_fermix_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FERMIX_HOME", str(tmp_path / "env"))
    assert resolve_home(tmp_path / "flag") == tmp_path / "flag"


def test_home_comes_from_fermix_home_when_not_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FERMIX_HOME", str(tmp_path / "env"))
    assert resolve_home() == tmp_path / "env"


def test_home_defaults_to_dot_fermix_in_the_user_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FERMIX_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_home() == tmp_path / ".fermix"


def test_an_empty_fermix_home_counts_as_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FERMIX_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_home() == tmp_path / ".fermix"


def test_home_expands_tilde_and_is_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert resolve_home("~/h") == tmp_path / "h"
    assert resolve_home("relative") == tmp_path / "relative"


def test_an_empty_explicit_home_is_refused() -> None:
    with pytest.raises(InvalidInputError):
        resolve_home("")


def test_home_names_the_database_config_and_agent_folders(tmp_path: Path) -> None:
    home = Home(tmp_path)
    assert home.db_path == tmp_path / "memory.db"
    assert home.config_path == tmp_path / "config.toml"
    assert home.agent_dir("bot-1") == tmp_path / "memory" / "bot-1"
    assert Home.resolve(tmp_path) == home


@pytest.mark.parametrize("agent_id", ["", "..", "../etc", "a/b", "a\\b", ".hidden", "x\x00"])
def test_c5_agent_dir_refuses_an_unsafe_agent_id(tmp_path: Path, agent_id: str) -> None:
    with pytest.raises(UnsafePathSegmentError):
        Home(tmp_path).agent_dir(agent_id)


# --- defaults ---


def test_a_missing_config_file_means_every_default(tmp_path: Path) -> None:
    assert load_config(tmp_path / "absent.toml") == Config()


def test_an_empty_config_file_means_every_default(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == Config()


def test_e8_review_knobs_default_as_spec() -> None:
    memory = Config().memory
    assert memory.review_interval_hours == 24
    assert memory.review_max_messages == 40
    assert memory.review_input_token_budget == 4000
    assert memory.review_failure_backoff_ms == 300_000


def test_a2_conversation_history_is_unbounded_by_default() -> None:
    assert Config().memory.max_conversation_history is None


def test_k2_compaction_defaults_as_spec() -> None:
    assert Config().compaction == CompactionConfig(
        enabled=True, threshold=0.85, reasoning_effort="medium"
    )


def test_v1_voice_transcripts_are_not_persisted_by_default() -> None:
    assert Config().realtime.persist_transcripts is False


def test_model_route_defaults_to_unset_with_a_sixty_second_timeout() -> None:
    assert Config().model == ModelConfig(
        primary=None,
        fallbacks=(),
        context_window=None,
        api_base=None,
        api_key_env=None,
        timeout_s=60.0,
    )


def test_keys_table_holds_exactly_the_defaults_of_config() -> None:
    config = Config()
    for dotted, key in KEYS.items():
        _, section, name = dotted.split(".")
        assert getattr(getattr(config, section), name) == key.default, dotted
        assert key.doc and key.kind


def test_config_sections_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().memory.review_max_messages = 1  # type: ignore[misc]


# --- overrides ---


def test_every_section_can_be_overridden(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [fermix_core.memory]
        review_interval_hours = 0
        review_max_messages = 10
        review_input_token_budget = 1000
        review_failure_backoff_ms = 0
        max_conversation_history = 200

        [fermix_core.compaction]
        enabled = false
        threshold = 1
        reasoning_effort = "high"

        [fermix_core.model]
        primary = "openai/gpt-4o"
        fallbacks = ["anthropic/claude-3-5-haiku", "ollama/llama3"]
        context_window = 32000
        api_base = "http://localhost:4000"
        api_key_env = "MY_KEY"
        timeout_s = 12.5

        [fermix_core.realtime]
        persist_transcripts = true
        """,
    )
    assert load_config(path) == Config(
        memory=MemoryConfig(0.0, 10, 1000, 0, 200),
        compaction=CompactionConfig(False, 1.0, "high"),
        model=ModelConfig(
            "openai/gpt-4o",
            ("anthropic/claude-3-5-haiku", "ollama/llama3"),
            32000,
            "http://localhost:4000",
            "MY_KEY",
            12.5,
        ),
        realtime=RealtimeConfig(True),
    )


def test_keys_left_out_of_a_section_keep_their_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[fermix_core.memory]\nreview_max_messages = 5\n"))
    assert config.memory == MemoryConfig(review_max_messages=5)
    assert config.compaction == CompactionConfig()


def test_an_integer_is_accepted_for_a_number_key_and_widened_to_float(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[fermix_core.memory]\nreview_interval_hours = 6\n"))
    assert config.memory.review_interval_hours == 6.0
    assert isinstance(config.memory.review_interval_hours, float)


def test_a2_history_limit_infinity_means_unbounded(tmp_path: Path) -> None:
    text = '[fermix_core.memory]\nmax_conversation_history = "infinity"\n'
    assert load_config(write(tmp_path, text)).memory.max_conversation_history is None


def test_e2_review_interval_zero_is_allowed_to_disable_background_review(tmp_path: Path) -> None:
    text = "[fermix_core.memory]\nreview_interval_hours = 0\n"
    assert load_config(write(tmp_path, text)).memory.review_interval_hours == 0


# --- bad values: each names the dotted key and the file ---

BAD_VALUES = [
    # (section, key, TOML value, what is wrong)
    ("memory", "review_max_messages", "true", "bool as int"),
    ("memory", "review_max_messages", "0", "below minimum"),
    ("memory", "review_max_messages", "4.0", "float for int"),
    ("memory", "review_max_messages", '"40"', "string for int"),
    ("memory", "review_input_token_budget", "-1", "negative"),
    ("memory", "review_failure_backoff_ms", "-5", "negative"),
    ("memory", "review_failure_backoff_ms", "false", "bool as int"),
    ("memory", "review_interval_hours", "-0.5", "negative"),
    ("memory", "review_interval_hours", "true", "bool as number"),
    ("memory", "review_interval_hours", "inf", "not finite"),
    ("memory", "review_interval_hours", "nan", "not finite"),
    ("memory", "max_conversation_history", "0", "not positive"),
    ("memory", "max_conversation_history", '"unbounded"', "wrong word"),
    ("memory", "max_conversation_history", "true", "bool as int"),
    ("compaction", "enabled", '"yes"', "string for bool"),
    ("compaction", "enabled", "1", "int for bool"),
    ("compaction", "threshold", "0", "excluded lower bound"),
    ("compaction", "threshold", "1.01", "above one"),
    ("compaction", "reasoning_effort", '"max"', "not a choice"),
    ("compaction", "reasoning_effort", '"Medium"', "case matters"),
    ("model", "primary", '""', "empty string"),
    ("model", "primary", "4", "int for string"),
    ("model", "fallbacks", '"gpt-4o"', "string for list"),
    ("model", "fallbacks", '["gpt-4o", 3]', "non-string item"),
    ("model", "context_window", "0", "not positive"),
    ("model", "api_base", "[]", "list for string"),
    ("model", "api_key_env", '"has space"', "not a variable name"),
    ("model", "timeout_s", "0", "not positive"),
    ("model", "timeout_s", "1979-05-27", "date for number"),
    ("realtime", "persist_transcripts", '"true"', "string for bool"),
]


@pytest.mark.parametrize(("section", "key", "value", "why"), BAD_VALUES)
def test_a_bad_value_is_refused_naming_the_dotted_key_and_the_file(
    tmp_path: Path,
    section: str,
    key: str,
    value: object,
    why: str,
) -> None:
    path = write(tmp_path, f"[fermix_core.{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f"fermix_core.{section}.{key}" in message, why
    assert str(path) in message, why


def test_a_bool_refused_for_an_int_key_is_shown_as_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[fermix_core.memory]\nreview_max_messages = true\n")
    with pytest.raises(ConfigError, match=r"must be an integer >= 1, not true"):
        load_config(path)


def test_an_unknown_key_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "[fermix_core.memory]\nreview_max_message = 5\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert "fermix_core.memory.review_max_message: unknown key" in message
    assert "did you mean fermix_core.memory.review_max_messages" in message


def test_an_unknown_section_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "[fermix_core.memroy]\nreview_max_messages = 5\n")
    with pytest.raises(ConfigError, match=r"fermix_core\.memroy: unknown key") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_a_top_level_table_other_than_fermix_core_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "[fermix_core.memory]\n[other]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"other: unknown key") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_a_top_level_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"review_max_messages: unknown key"):
        load_config(write(tmp_path, "review_max_messages = 5\n"))


@pytest.mark.parametrize(
    ("text", "dotted"),
    [("fermix_core = 3\n", "fermix_core"), ("[fermix_core]\nmemory = 3\n", "fermix_core.memory")],
)
def test_a_section_that_is_not_a_table_is_refused(tmp_path: Path, text: str, dotted: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"{re.escape(dotted)} must be a table") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_bad_toml_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[fermix_core.memory]\nreview_max_messages = = 3\n")
    with pytest.raises(ConfigError, match=r"invalid TOML.*line 2") as caught:
        load_config(path)
    assert str(path) in str(caught.value)


def test_a_config_path_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path))):
        load_config(tmp_path)  # a directory


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b'[fermix_core.model]\nprimary = "\xff"\n')
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


def test_an_api_key_pasted_in_place_of_its_variable_name_is_not_echoed(tmp_path: Path) -> None:
    path = write(tmp_path, '[fermix_core.model]\napi_key_env = "sk-secret-123"\n')
    with pytest.raises(ConfigError, match=r"fermix_core\.model\.api_key_env") as caught:
        load_config(path)
    assert "sk-secret-123" not in str(caught.value)


# --- validate_key, parse_value and defaults_toml (for `fermix config`) ---


def test_validate_key_returns_the_value_as_the_config_holds_it() -> None:
    assert validate_key("fermix_core.memory.review_interval_hours", 3) == 3.0
    assert validate_key("fermix_core.model.fallbacks", ["a", "b"]) == ("a", "b")
    assert validate_key("fermix_core.memory.max_conversation_history", "infinity") is None
    assert validate_key("fermix_core.compaction.reasoning_effort", "low") == "low"


def test_validate_key_refuses_an_unknown_key() -> None:
    with pytest.raises(ConfigError, match=r"fermix_core\.memory\.nope: unknown key"):
        validate_key("fermix_core.memory.nope", 1)


def test_validate_key_names_the_key_and_not_a_file_when_none_is_given() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_key("fermix_core.memory.review_max_messages", True)
    assert str(caught.value).startswith("fermix_core.memory.review_max_messages must be")


toml_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["infinity", "medium", "minimal", "OPENAI_API_KEY", "", " "]),
    st.lists(st.text(max_size=5), max_size=3),
)


@given(key=st.sampled_from(sorted(KEYS)), value=toml_values)
def test_validate_key_agrees_with_load_config_on_any_value(key: str, value: object) -> None:
    _, section, name = key.split(".")
    document = tomlkit.dumps({"fermix_core": {section: {name: value}}})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.toml"
        path.write_text(document, encoding="utf-8")
        try:
            expected = validate_key(key, value)
        except ConfigError:
            with pytest.raises(ConfigError, match=re.escape(key)):
                load_config(path)
        else:
            assert getattr(getattr(load_config(path), section), name) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40", 40),
        ("0.5", 0.5),
        ("true", True),
        ('"quoted"', "quoted"),
        ('["a", "b"]', ["a", "b"]),
        ("openai/gpt-4o", "openai/gpt-4o"),
        ("infinity", "infinity"),
    ],
)
def test_parse_value_reads_toml_literals_and_falls_back_to_text(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_defaults_toml_loads_as_every_default(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, defaults_toml())) == Config()


def test_defaults_toml_shows_every_key_and_uncommented_it_is_valid(tmp_path: Path) -> None:
    rendered = defaults_toml()
    for dotted in KEYS:
        assert f"# {dotted.rsplit('.', 1)[1]} = " in rendered, dotted
    uncommented = re.sub(r"^# (\w+ = )", r"\1", rendered, flags=re.MULTILINE)
    config = load_config(write(tmp_path, uncommented))
    assert config.memory == MemoryConfig()
    assert config.model.primary is not None  # the example value, not the default


def test_load_config_accepts_a_path_like_or_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, "[fermix_core.realtime]\npersist_transcripts = true\n")
    assert load_config(os.fspath(path)) == load_config(path)
