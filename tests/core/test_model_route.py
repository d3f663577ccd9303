"""The model in one argument (M8): a host gives fermix its model route in code; without a
model anywhere, fermix says so once at start and skips reviews and compaction as
``no_model``; a model whose context window nobody knows is one warning naming
``context_window``; ``fermix doctor`` says that reviews and compaction are off."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_server import ModelServer

from fermix.api import Memory
from fermix.cli import main
from fermix.cli.doctor_checks import diagnosis as doctor
from fermix.clock import now_ms
from fermix.config import Config, MemoryConfig, ModelConfig
from fermix.core.review import Skip
from fermix.errors import ConfigError
from fermix.home import Home

AGENT = "assistant"
UNKNOWN_MODEL = "openai/fermix-no-such-model"  # not in litellm's model table


@pytest.fixture
def memories(home: Path) -> Iterator[list[Memory]]:
    """Memories a test starts itself (to pass ``model=``), closed after it."""
    started: list[Memory] = []
    yield started
    for memory in reversed(started):
        memory.close()


def _start(memories: list[Memory], home: Path, **keywords: object) -> Memory:
    memory = Memory(home, **keywords)  # type: ignore[arg-type]
    memories.append(memory)
    return memory.start()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.split(".")[0] == "fermix" and r.levelno >= logging.WARNING
    ]


# -- the route in code -------------------------------------------------------------------


def test_m8_a_memory_given_its_model_in_code_reviews_against_that_model_without_a_config_toml(
    memories: list[Memory], home: Path, model_server: ModelServer
) -> None:
    memory = _start(memories, home, model="openai/tiny", api_base=model_server.url)
    assert not (home / "config.toml").exists()
    conv = memory.conversation(AGENT, "telegram", "42", owner_id="ana")
    conv.append_user("I work as a nurse in Porto.")
    model_server.reply_json(
        {"operations": [{"op": "add", "category": "identity", "key": "job", "value": "nurse"}]}
    )

    result = memory.review(conv)

    assert result.status == "applied" and result.added == 1, result
    assert result.model == "openai/tiny"
    assert model_server.requests[0]["model"] == "tiny"
    assert [row.value for row in memory.list_rows(agent_id=AGENT)] == ["nurse"]


def test_m8_the_route_in_code_overrides_config_toml_key_by_key(
    memories: list[Memory], home: Path
) -> None:
    (home / "config.toml").write_text(
        "[fermix_core.model]\n"
        'primary = "openai/configured"\n'
        'fallbacks = ["openai/configured-fallback"]\n'
        'api_key_env = "CONFIGURED_KEY"\n'
        "timeout_s = 5\n",
        encoding="utf-8",
    )
    model = Memory(home, model="openai/in-code").config.model
    # the chain is the code's, the rest the file's
    assert (model.primary, model.fallbacks) == ("openai/in-code", ())
    assert (model.api_key_env, model.timeout_s) == ("CONFIGURED_KEY", 5.0)

    model = Memory(
        home,
        fallbacks=["openai/in-code-fallback"],
        api_base="http://127.0.0.1:9",
        context_window=8_000,
    ).config.model
    assert (model.primary, model.fallbacks) == ("openai/configured", ("openai/in-code-fallback",))
    assert (model.api_base, model.context_window) == ("http://127.0.0.1:9", 8_000)
    assert model.api_key_env is None  # the configured key is never sent to another server


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"model": "  "}, "Memory(model=...): fermix_core.model.primary"),
        ({"fallbacks": "openai/one"}, "Memory(fallbacks=...): fermix_core.model.fallbacks"),
        ({"api_base": ""}, "Memory(api_base=...): fermix_core.model.api_base"),
        ({"context_window": 0}, "Memory(context_window=...): fermix_core.model.context_window"),
    ],
)
def test_m8_a_bad_route_in_code_is_refused_by_the_rule_of_its_config_key(
    home: Path, keywords: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(named)):
        Memory(home, **keywords)  # type: ignore[arg-type]


# -- no model anywhere ----------------------------------------------------------------------


def test_m8_without_a_model_start_warns_once_and_reviews_and_compactions_skip_as_no_model(
    memories: list[Memory], home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fermix")
    memory = _start(memories, home)
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert "Memory(model=" in warning and "[fermix_core.model]" in warning
    assert "primary" in warning and "reviews and compaction are off" in warning

    conv = memory.conversation(AGENT, "telegram", "42", owner_id="ana")
    for turn in range(3):
        conv.append_user(f"I work as a nurse in Porto ({turn}).")
        conv.commit("Noted.", usage={"prompt_tokens": 900_000})  # dispatches both, each turn
    review = memory.review(conv)  # asked after the dispatched ones: they have run
    compaction = memory.compact(conv, force=True)

    assert review.status == "skipped" and review.skip == Skip.NO_MODEL
    assert compaction.status == "skipped" and compaction.reason == "no_model"
    state = conv.state()
    assert state is not None and state.review_failed_at is None  # no failure, no backoff
    assert state.compaction_failed_at is None
    assert len(_warnings(caplog)) == 1


def test_m8_memory_review_now_without_a_model_skips_as_no_model_instead_of_failing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Memory(home) as memory:
        conv = memory.conversation(AGENT, "telegram", "42", owner_id="ana")
        conv.append_user("I work as a nurse in Porto.")
        conv.commit("Noted.")

    assert main(["memory", "review", "--now", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0
    assert [(r["status"], r["skip"]) for r in report["reviews"]] == [("skipped", "no_model")]
    with Memory(home) as memory:
        state = memory.conversation(AGENT, "telegram", "42", owner_id="ana").state()
    assert state is not None and state.review_failed_at is None  # no failure, no backoff


# -- an unknown context window ----------------------------------------------------------


def test_m8_an_unknown_context_window_is_one_warning_naming_context_window(
    memories: list[Memory], home: Path, model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fermix")
    route = ModelConfig(primary=UNKNOWN_MODEL, api_base=model_server.url)  # no context_window
    config = Config(memory=MemoryConfig(review_interval_hours=0), model=route)
    memory = _start(memories, home, config=config)
    assert _warnings(caplog) == []  # a model is configured
    conv = memory.conversation(AGENT, "telegram", "42", owner_id="ana")
    for turn in range(3):
        conv.append_user(f"turn {turn}")
        conv.commit("ok", usage={"prompt_tokens": 1_000_000})  # each turn asks the compactor
    assert memory.compact(conv).reason == "unknown_context_window"

    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert UNKNOWN_MODEL in warning and "context_window" in warning
    assert "Memory(context_window=" in warning and "[fermix_core.model]" in warning
    assert model_server.requests == []


# -- fermix doctor --------------------------------------------------------------------------


def test_m8_doctor_says_reviews_and_compaction_are_off_without_a_model(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "config.toml").write_text(
        "[fermix_core.memory]\nreview_interval_hours = 6\n", encoding="utf-8"
    )
    check = {c.name: c for c in doctor.diagnose(Home(home), now=now_ms()).checks}["config"]
    assert check.status == "info"
    assert "no model is configured: reviews and compaction are off" in check.summary
    assert "fermix_core.model.primary" in check.hint and "Memory(model=" in check.hint

    main(["doctor"])
    out = capsys.readouterr().out
    assert "reviews and compaction are off" in out and "fermix_core.model.primary" in out

    (home / "config.toml").write_text(
        '[fermix_core.model]\nprimary = "openai/gpt-4o-mini"\n', encoding="utf-8"
    )
    check = {c.name: c for c in doctor.diagnose(Home(home), now=now_ms()).checks}["config"]
    assert check.status == "pass" and "off" not in check.summary
