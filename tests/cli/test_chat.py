"""``fermix chat`` against the loopback model server running in this test process (H2, K4, T2).

Sessions run in this process through :func:`fermix.cli.main`, with the lines typed at the
prompt scripted and the output captured. What only a terminal shows runs as a real process
on a pseudo-terminal (marked slow: the child imports litellm): it is started with
:func:`pty.fork`, so the pty is its controlling terminal: Ctrl-D at the start of a line is
end of input and Ctrl-C is a real SIGINT, as at a keyboard. Reads wait on ``select`` with a
deadline; nothing sleeps.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import reading
from model_server import ModelServer

import fermix.cli.chat_host
from fermix import model
from fermix.cli import main
from fermix.cli.chat_host import (
    CHAT_COMMANDS,
    DEFAULT_SYSTEM,
    NOTHING_TO_REVIEW,
    UP_TO_DATE,
    UP_TO_DATE_BACKGROUND,
)
from fermix.core import commands
from fermix.core.compaction import SUMMARY_PROMPT
from fermix.model import ConversationKey, Message

KEY = ConversationKey("default", "cli", "terminal")
PROMPT = "you> "
STARTUP_S = 60.0  # the child imports litellm on its first model call
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


class Terminal:
    """A child process on a pseudo-terminal, read with ``select`` and deadlines."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: a wide terminal, then the command; nothing else runs here
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
                # Ctrl-C interrupts it as in a user's shell, even where the suite itself runs
                # with SIGINT ignored (a job started with `&` by a non-interactive shell).
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self._raw = bytearray()
        self._seen = 0
        self._eof = False
        self.status: int | None = None

    @property
    def text(self) -> str:
        """Everything shown so far, without colour codes and with plain newlines."""
        shown = self._raw.decode("utf-8", "replace").replace("\r\n", "\n")
        return _ANSI.sub("", shown)

    def _read(self, deadline: float) -> bool:
        """Read what is available before ``deadline``; False once the child closed the pty."""
        if self._eof:
            return False
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: every process holding the terminal has exited
            data = b""
        if not data:
            self._eof = True
            return False
        self._raw.extend(data)
        return True

    def expect(self, wanted: str, timeout: float = 30.0) -> str:
        """Wait until ``wanted`` appears after what earlier calls matched; return the text
        shown up to and including it."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text
            at = text.find(wanted, self._seen)
            if at >= 0:
                start, self._seen = self._seen, at + len(wanted)
                return text[start : self._seen]
            if time.monotonic() >= deadline or not self._read(deadline):
                raise AssertionError(f"{wanted!r} never appeared; the terminal showed:\n{text}")

    def send(self, data: str | bytes) -> None:
        """Type ``data`` (bytes as they are: ``b"\\x04"`` is Ctrl-D, ``b"\\x03"`` Ctrl-C)."""
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def line(self, text: str) -> None:
        """Type a line and Enter, once the prompt is showing."""
        self.expect(PROMPT)
        self.send(text + "\n")

    def wait(self, timeout: float = 30.0) -> int:
        """Read to the end of output, reap the child and return its exit code.

        The child is reaped as soon as it exits, whether or not the terminal has closed: a
        process it started may hold the terminal open after it (what is left of the output
        is read after a short grace, and the check that the child exited stays exact)."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = os.waitstatus_to_exitcode(status)
                grace = time.monotonic() + 1.0
                while self._read(min(grace, time.monotonic() + 0.1)) and time.monotonic() < grace:
                    pass
                return self.status
            if time.monotonic() >= deadline:
                shown = self.text
                os.kill(self.pid, signal.SIGABRT)  # faulthandler prints every thread's stack
                stop = time.monotonic() + 5.0
                while self._read(min(stop, time.monotonic() + 0.1)) and time.monotonic() < stop:
                    pass
                raise AssertionError(
                    f"the chat did not exit; the terminal showed:\n{shown}\n"
                    f"its threads, aborted:\n{self.text[len(shown) :]}"
                )
            self._read(min(deadline, time.monotonic() + 0.1))

    def close(self) -> None:
        """Kill the child if it still runs (a failed test), and close the terminal."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        os.close(self.fd)


Start = Callable[..., Terminal]
"""Starts ``fermix chat`` in a terminal: on the test's home and server, or with ``argv``."""


def chat_argv(home: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fermix.cli", "--home", str(home), "chat", *extra]


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    """Terminals started by a test; each is closed (its child killed if alive) after it."""
    started: list[Terminal] = []
    yield started
    for terminal in started:
        terminal.close()


@pytest.fixture
def start(terminals: list[Terminal], home: Path, model_server: ModelServer) -> Start:
    """Start ``fermix chat`` on ``home`` against the loopback server (or with ``argv``)."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TERM": "xterm"}
    env["PYTHONFAULTHANDLER"] = "1"  # a chat that hangs shows its threads (Terminal.wait)
    env.pop("FERMIX_HOME", None)

    def run(argv: list[str] | None = None) -> Terminal:
        terminal = Terminal(
            argv or chat_argv(home, "--model", "openai/test", "--api-base", model_server.url),
            env,
        )
        terminals.append(terminal)
        return terminal

    return run


@pytest.fixture
def chat_home(home: Path) -> Path:
    """A home whose config has no background review (so every model request the test sees
    is the chat's own, in order) and a small context window (so /compact has work)."""
    (home / "config.toml").write_text(
        "[fermix_core.memory]\nreview_interval_hours = 0\n\n"
        "[fermix_core.model]\ncontext_window = 400\n"
    )
    return home


class Script:
    """The lines typed at the prompt of an in-process chat, then end of input (Ctrl-D).

    Each line is echoed after its prompt into the captured output, as a terminal shows it.
    """

    def __init__(self, lines: tuple[str, ...]) -> None:
        self.lines = list(lines)

    def __call__(self, prompt: str) -> str:
        if not self.lines:
            raise EOFError
        line = self.lines.pop(0)
        sys.stdout.write(f"{prompt}{line}\n")
        return line


Chat = Callable[..., tuple[int, str]]
"""Runs ``fermix chat`` in this process on a home with the typed lines; returns the exit
code and everything it printed."""


@pytest.fixture
def chat(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Chat:
    """``fermix chat --model openai/test`` on the loopback server, in this process."""
    monkeypatch.setenv("COLUMNS", "200")  # notes on one line each

    def run(home: Path, *lines: str, argv: list[str] | None = None) -> tuple[int, str]:
        monkeypatch.setattr(fermix.cli.chat_host, "read_line", Script(lines))
        capsys.readouterr()
        model = ["--model", "openai/test", "--api-base", model_server.url]
        code = main(["--home", str(home), "chat", *(model if argv is None else argv)])
        return code, capsys.readouterr().out

    return run


def in_order(text: str, *parts: str) -> None:
    """Each of ``parts`` appears in ``text``, after the one before it."""
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} does not follow {text[:at][-80:]!r} in:\n{text}"
        at = found + len(part)


def stored(home: Path) -> tuple[list[Message], list[Message], model.ConversationState]:
    """Every stored message of the terminal conversation, its window, and its state."""
    with reading(home) as reads:
        state = reads.conversation(KEY)
        assert state is not None
        return reads.messages(KEY), reads.window(KEY), state


def test_h2_a_session_runs_turns_tools_and_commands_and_stores_everything(
    chat: Chat, chat_home: Path, model_server: ModelServer
) -> None:
    model_server.reply("Hello! Porto is lovely.", prompt_tokens=50)
    model_server.reply_tool_call(
        "memory_recall", {"query": "Porto", "source": "history"}, prompt_tokens=60
    )
    model_server.reply("You told me you live in Porto.", prompt_tokens=70)
    model_server.reply_json(
        {
            "operations": [
                {"op": "add", "category": "identity", "key": "home_city", "value": "Lives in Porto"}
            ]
        }
    )
    model_server.reply("Summary: the user lives in Porto and asked where they live.")
    model_server.reply("Nothing much since then.", prompt_tokens=40)

    code, shown = chat(
        chat_home,
        "Hello, I live in Porto.",
        "Where did I say I live?",
        "/review",
        "/compact",
        "/new",
        "What is new?",
    )

    assert code == 0
    in_order(
        shown,
        "fermix chat",
        "you> Hello, I live in Porto.",
        "default> Hello! Porto is lovely.",
        "· answered by openai/test",
        "you> Where did I say I live?",
        '· memory_recall({"query": "Porto", "source": "history"})',
        "default> You told me you live in Porto.",
        "you> /review",
        "· review: applied (1 added)",
        "· memory updated (USER.md)",
        "you> /compact",
        "· Compacted ",
        "you> /new",
        "· Started a fresh conversation window. Long-term memory is kept.",
        "you> What is new?",
        "default> Nothing much since then.",
    )
    assert shown.count("memory updated") == 1

    # the model saw the tools, the tool result, the review and the summary requests in order
    turn, call, answer, review, summary, last = model_server.requests
    assert "memory_recall" in {t["function"]["name"] for t in turn["tools"]}
    assert call["messages"][-1] == {"role": "user", "content": "Where did I say I live?"}
    tool_message = next(m for m in answer["messages"] if m["role"] == "tool")
    (call_id,) = [c["id"] for m in answer["messages"] for c in m.get("tool_calls") or []]
    assert tool_message["tool_call_id"] == call_id
    assert "Hello, I live in Porto." in tool_message["content"]
    assert review["messages"][0]["content"] != SUMMARY_PROMPT
    assert summary["messages"][0]["content"] == SUMMARY_PROMPT
    assert summary["reasoning_effort"] == "medium"
    # after /new: the system prompt, the memory context (USER.md kept), and only this turn
    system, context, *history = last["messages"]
    assert system == {"role": "system", "content": DEFAULT_SYSTEM}
    assert context["role"] == "system" and "Lives in Porto" in context["content"]
    assert history == [{"role": "user", "content": "What is new?"}]

    everything, window, state = stored(chat_home)
    assert [(m.role, m.kind, m.content) for m in everything if m.role != "tool"] == [
        ("user", "chat", "Hello, I live in Porto."),
        ("assistant", "chat", "Hello! Porto is lovely."),
        ("user", "chat", "Where did I say I live?"),
        ("assistant", "chat", ""),
        ("assistant", "chat", "You told me you live in Porto."),
        ("assistant", "checkpoint", "Summary: the user lives in Porto and asked where they live."),
        ("user", "chat", "What is new?"),
        ("assistant", "chat", "Nothing much since then."),
    ]
    (tool,) = [m for m in everything if m.role == "tool"]
    assert tool.metadata == {"tool_call_id": call_id, "name": "memory_recall"}
    recalled = json.loads(tool.content)
    assert "Hello, I live in Porto." in [hit["content"] for hit in recalled["history"]]
    assert everything[3].metadata["tool_calls"][0]["function"]["name"] == "memory_recall"
    # /new started the window after the checkpoint: only the last turn is in it
    checkpoint = everything[6]
    assert checkpoint.kind == "checkpoint"
    assert (state.window_after_id, state.checkpoint_message_id) == (checkpoint.id, None)
    assert [m.content for m in window] == ["What is new?", "Nothing much since then."]

    user_md = (chat_home / "memory" / "default" / "USER.md").read_text()
    assert "Lives in Porto" in user_md
    assert not (chat_home / "memory" / "default" / "MEMORY.md").exists()


@pytest.mark.slow  # a real process on a pty, importing litellm
def test_h2_ctrl_c_at_the_prompt_leaves_cleanly_with_every_message_written(
    start: Start, chat_home: Path, model_server: ModelServer
) -> None:
    model_server.reply("Hi there.", prompt_tokens=20)
    chat = start()
    chat.line("Hello")
    chat.expect("default> Hi there.", STARTUP_S)
    chat.expect(PROMPT)
    chat.send(b"\x03")
    assert chat.wait(STARTUP_S) == 0  # its close finishes queued work: as long as a start
    assert "Traceback" not in chat.text
    everything, _, _ = stored(chat_home)
    assert [(m.role, m.content) for m in everything] == [
        ("user", "Hello"),
        ("assistant", "Hi there."),
    ]


@pytest.mark.slow  # a real process on a pty, importing litellm
def test_h2_ctrl_c_while_the_model_thinks_leaves_cleanly_with_the_question_written(
    start: Start, chat_home: Path, model_server: ModelServer
) -> None:
    model_server.hang()
    chat = start()
    chat.line("Are you there?")
    assert model_server.wait_for_requests(1, timeout=STARTUP_S)
    chat.send(b"\x03")
    assert chat.wait(STARTUP_S) == 0  # its close finishes queued work: as long as a start
    assert "Traceback" not in chat.text
    everything, _, _ = stored(chat_home)
    assert [(m.role, m.content) for m in everything] == [("user", "Are you there?")]


def test_h2_without_a_model_it_says_what_to_set_in_one_paragraph_and_exits_2(
    chat: Chat, home: Path
) -> None:
    code, shown = chat(home, "hello", argv=[])
    assert code == 2
    shown = shown.strip()
    assert "primary" in shown and "--model" in shown
    assert "\n" not in shown  # one paragraph, left to the terminal to wrap


def test_h2_review_right_after_the_background_review_says_memory_is_up_to_date(
    chat: Chat, home: Path, model_server: ModelServer
) -> None:
    # The default config reviews in the background after a turn (a first review has no
    # interval to wait for), so that review reads "I live in Porto" before /review can.
    model_server.reply("Hello! Porto is lovely.", prompt_tokens=50)
    model_server.reply_json(
        {
            "operations": [
                {"op": "add", "category": "identity", "key": "home_city", "value": "Lives in Porto"}
            ]
        }
    )

    code, shown = chat(home, "Hello, I live in Porto.", "/review", "/review")

    assert code == 0
    in_order(
        shown,
        "default> Hello! Porto is lovely.",
        "· memory updated (USER.md)",  # the background review's update, said once...
        f"· {UP_TO_DATE_BACKGROUND}",  # ...and what the first /review found
        "you> /review",
        f"· {UP_TO_DATE}",  # nothing new since
    )
    in_order(shown, "you> /review", f"· {UP_TO_DATE_BACKGROUND}")
    assert shown.count("memory updated") == 1
    assert "skipped" not in shown and "no_new_messages" not in shown
    assert len(model_server.requests) == 2  # the turn and the background review
    assert "Lives in Porto" in (home / "memory" / "default" / "USER.md").read_text()


def test_h2_review_before_anything_was_said_says_there_is_nothing_to_review(
    chat: Chat, home: Path, model_server: ModelServer
) -> None:
    code, shown = chat(home, "/review")
    assert code == 0
    assert f"· {NOTHING_TO_REVIEW}" in shown
    assert model_server.requests == []


def test_h2_k4_help_lists_fermix_and_chat_commands_in_aligned_columns(
    chat: Chat, home: Path
) -> None:
    code, shown = chat(home, "/help")
    assert code == 0
    listed = [line for line in shown.splitlines() if line.startswith("/")]
    assert listed == commands.help_text(CHAT_COMMANDS).splitlines()
    names = [line.split()[0] for line in listed]
    assert names == ["/compact", "/new", "/clear", "/memory", "/review", "/help", "/quit"]
    starts = {
        len(line) - len(line[len(n) :].lstrip()) for line, n in zip(listed, names, strict=True)
    }
    assert len(starts) == 1
