"""``fermix setup``: the wizard driven through a pseudo-terminal, and ``--non-interactive``
(E2, E8, K2, V1)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_server import ModelServer

from fermix.cli import EXIT_FAILURE, EXIT_USAGE, main
from fermix.cli.config_file import defaults_toml
from fermix.config import load_config

DEADLINE_S = 60.0
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


class Terminal:
    """``fermix setup`` on a pseudo-terminal: wait for a prompt, answer it, read the rest."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        # a wide window, so rich wraps nothing that a test looks for
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fermix.cli", "--home", str(home), "setup", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "dumb", "NO_COLOR": "1", **(env or {})},
            close_fds=True,
        )
        os.close(slave)
        self.master = master
        self.seen = b""
        self.pos = 0

    def _read(self, deadline: float) -> bool:
        """Read what the program wrote, until ``deadline``; False once it closed the terminal."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            return False
        self.seen += _ANSI.sub(b"", chunk.replace(b"\r\n", b"\n"))
        return bool(chunk)

    def expect(self, text: str) -> str:
        """Wait for ``text`` after the last match; return what came before it."""
        wanted = text.encode()
        deadline = time.monotonic() + DEADLINE_S
        while (found := self.seen.find(wanted, self.pos)) < 0:
            if time.monotonic() > deadline or not self._read(deadline):
                raise AssertionError(f"never saw {text!r}; the terminal showed:\n{self.text}")
        before = self.seen[self.pos : found].decode(errors="replace")
        self.pos = found + len(wanted)
        return before

    def answer(self, prompt: str, line: str) -> str:
        """Wait for ``prompt``, then type ``line`` and Enter; return what came before it."""
        before = self.expect(prompt)
        os.write(self.master, line.encode() + b"\n")
        return before

    def finish(self) -> int:
        """Read to the end and return the exit code."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and self._read(deadline):
            pass
        code = self.proc.wait(timeout=DEADLINE_S)
        os.close(self.master)
        return code

    @property
    def text(self) -> str:
        """Everything the terminal showed so far."""
        return self.seen.decode(errors="replace")


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    """Terminals opened by a test; any program still running at the end is killed."""
    opened: list[Terminal] = []
    yield opened
    for term in opened:
        if term.proc.poll() is None:
            term.proc.kill()
            term.proc.wait()


PRIMARY = "Primary model"
FALLBACKS = "Fallback models"
API_BASE = "API base URL"
KEY_ENV = "Name of the environment variable"
TEST = "Test the model route"
INTERVAL = "Hours between background reviews"
COMPACT = "Compact long conversations"
THRESHOLD = "Compact when the prompt reaches"
VOICE = "Store voice"
WRITE = "config.toml?"


@pytest.mark.slow  # the wizard's process tests the route: it imports litellm
def test_e8_the_wizard_asks_a_bad_answer_again_tests_the_route_and_writes_the_file(
    home: Path, model_server: ModelServer, terminals: list[Terminal]
) -> None:
    model_server.fail(404)  # the first route test: no such model
    model_server.reply("OK")
    term = Terminal(home, env={"FERMIX_SETUP_KEY": "dummy"})
    terminals.append(term)
    term.answer(PRIMARY, "openai/missing")
    term.answer(FALLBACKS, "openai/small, openai/medium")
    term.answer(API_BASE, model_server.url)
    term.answer(KEY_ENV, "sk-proj-0123456789abcdefABCDEF")  # the key itself: refused
    refusal = term.answer(KEY_ENV, "FERMIX_SETUP_KEY")
    assert "fermix_core.model.api_key_env" in refusal and "sk-proj" not in refusal.split("\n", 1)[1]
    term.answer(TEST, "y")
    term.expect("model test failed: openai/missing: NotFoundError")
    term.answer("Change the model route?", "y")  # back to the model questions, answers kept
    term.answer("(openai/missing):", "openai/tiny")
    term.answer("(openai/small, openai/medium):", "")
    term.answer(f"({model_server.url}):", "")
    term.answer("(FERMIX_SETUP_KEY):", "")
    term.answer(TEST, "y")
    term.expect("model test passed: openai/tiny answered 'OK'")
    term.answer(INTERVAL, "-3")  # out of range: explained and asked again
    said = term.answer(INTERVAL, "6")
    assert "fermix_core.memory.review_interval_hours must be a number >= 0, not -3" in said
    term.answer(COMPACT, "y")
    term.answer(THRESHOLD, "")  # Enter keeps 0.85
    term.answer(VOICE, "y")
    shown = term.answer(WRITE, "y")
    term.expect("wrote ")
    assert term.finish() == 0

    written = (home / "config.toml").read_text(encoding="utf-8")
    assert 'primary = "openai/tiny"' in shown and "review_interval_hours = 6" in shown
    assert "-3" not in written and "sk-proj" not in written
    config = load_config(home / "config.toml")
    assert config.model.primary == "openai/tiny"
    assert config.model.fallbacks == ("openai/small", "openai/medium")
    assert config.model.api_base == model_server.url
    assert config.model.api_key_env == "FERMIX_SETUP_KEY"
    assert config.memory.review_interval_hours == 6.0
    assert config.compaction.threshold == 0.85 and config.realtime.persist_transcripts is True
    assert "# review_max_messages = 40" in written  # a fresh file lists every other key
    assert model_server.models == ["missing", "tiny"]  # one tiny call per test
    request = model_server.requests[1]
    assert request["max_tokens"] == 5 and request["messages"][0]["content"] == "Say OK."


def test_e8_running_the_wizard_again_starts_from_the_current_values_and_keeps_comments(
    home: Path, terminals: list[Terminal]
) -> None:
    path = home / "config.toml"
    hand_edited = (
        "# notes for the on-call operator\n"
        "[fermix_core.memory]\n"
        "review_interval_hours = 12  # twice a day\n"
        "\n"
        "[fermix_core.model]\n"
        'primary = "ollama/llama3"  # local\n'
    )
    path.write_text(hand_edited, encoding="utf-8")
    term = Terminal(home)
    terminals.append(term)
    term.expect(PRIMARY)
    term.answer("(ollama/llama3):", "")  # the current value is offered
    for prompt in (FALLBACKS, API_BASE, KEY_ENV):
        term.answer(prompt, "")
    term.answer(TEST, "n")
    term.expect(INTERVAL)
    term.answer("(12):", "0")  # 0 turns background review off (E2)
    term.answer(COMPACT, "n")  # the threshold is then not asked (K2)
    term.answer(VOICE, "")
    term.answer(WRITE, "y")
    assert term.finish() == 0
    assert path.read_text(encoding="utf-8") == (
        "# notes for the on-call operator\n"
        "[fermix_core.memory]\n"
        "review_interval_hours = 0  # twice a day\n"
        "\n"
        "[fermix_core.model]\n"
        'primary = "ollama/llama3"  # local\n'
        "\n"
        "[fermix_core.compaction]\n"
        "enabled = false\n"
    )
    assert THRESHOLD not in term.text


def test_e8_keeping_every_value_writes_nothing(home: Path, terminals: list[Terminal]) -> None:
    path = home / "config.toml"
    path.write_text("[fermix_core.realtime]\npersist_transcripts = true\n", encoding="utf-8")
    term = Terminal(home)
    terminals.append(term)
    for prompt in (PRIMARY, FALLBACKS, API_BASE, KEY_ENV, INTERVAL, COMPACT, THRESHOLD, VOICE):
        term.answer(prompt, "")
    term.expect("already holds these values; nothing to write")
    assert term.finish() == 0


def test_e8_declining_the_shown_file_writes_nothing(home: Path, terminals: list[Terminal]) -> None:
    term = Terminal(home)
    terminals.append(term)
    for prompt in (PRIMARY, FALLBACKS, API_BASE, KEY_ENV, INTERVAL, COMPACT, THRESHOLD, VOICE):
        term.answer(prompt, "")
    term.answer(WRITE, "n")
    term.expect("nothing was written")
    assert term.finish() == 0
    assert not (home / "config.toml").exists()


def test_e8_non_interactive_setup_writes_the_flags_into_a_commented_file(home: Path) -> None:
    argv = ["setup", "--non-interactive", "--model", "openai/gpt-4o-mini"]
    argv += ["--fallback", "openai/a", "--fallback", "openai/b", "--api-key-env", "OPENAI_API_KEY"]
    argv += ["--review-interval-hours", "12", "--no-compaction", "--voice"]
    assert main(argv) == 0
    written = (home / "config.toml").read_text(encoding="utf-8")
    config = load_config(home / "config.toml")
    assert config.model.primary == "openai/gpt-4o-mini"
    assert config.model.fallbacks == ("openai/a", "openai/b")
    assert config.model.api_key_env == "OPENAI_API_KEY"
    assert config.memory.review_interval_hours == 12.0
    assert config.compaction.enabled is False and config.realtime.persist_transcripts is True
    assert written.count("\n# ") == defaults_toml().count("\n# ") - 6  # six keys uncommented


def test_e8_non_interactive_setup_changes_only_the_flags_given_and_keeps_comments(
    home: Path,
) -> None:
    path = home / "config.toml"
    path.write_text(
        '# mine\n[fermix_core.model]\nprimary = "x/y"  # keep\nfallbacks = ["x/z"]\n',
        encoding="utf-8",
    )
    assert main(["setup", "--non-interactive", "--compaction-threshold", "0.7"]) == 0
    assert main(["setup", "--non-interactive", "--fallback", "-"]) == 0
    assert path.read_text(encoding="utf-8") == (
        '# mine\n[fermix_core.model]\nprimary = "x/y"  # keep\n'
        "\n[fermix_core.compaction]\nthreshold = 0.7\n"
    )


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--review-interval-hours", "-1"], "fermix_core.memory.review_interval_hours"),
        (["--compaction-threshold", "2"], "fermix_core.compaction.threshold"),
        (["--api-key-env", "sk-live-secret"], "fermix_core.model.api_key_env"),
        (["--api-key-env", "f3a9c1d2e4b5a6978877665544332211"], "fermix_core.model.api_key_env"),
    ],
)
def test_e8_k2_a_bad_flag_exits_2_naming_the_key_and_writes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], flags: list[str], key: str
) -> None:
    assert main(["setup", "--non-interactive", *flags]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert key in err and "secret" not in err and "f3a9c1" not in err
    assert not (home / "config.toml").exists()


def test_e8_a_failed_model_test_writes_nothing(
    home: Path, model_server: ModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    model_server.fail(404)
    argv = ["setup", "--non-interactive", "--model", "openai/nope", "--api-base", model_server.url]
    assert main([*argv, "--test-model"]) == EXIT_FAILURE
    captured = capsys.readouterr()
    assert "model test failed" in captured.out and "was not written" in captured.err
    assert not (home / "config.toml").exists()
    model_server.reply("OK")
    assert main([*argv, "--test-model"]) == 0
    assert load_config(home / "config.toml").model.primary == "openai/nope"


def test_e8_the_wizard_without_a_terminal_points_at_non_interactive(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        assert main(["setup"]) == EXIT_USAGE
    assert "--non-interactive" in capsys.readouterr().err
    assert not (home / "config.toml").exists()
