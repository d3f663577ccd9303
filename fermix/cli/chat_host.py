"""``fermix chat``: an interactive terminal chat host built only on the public API (H2).

It is the host a real bot would be: append the user's message, preflight compaction,
compose the prompt, call the model with the memory tools, run the tool calls through
fermix, commit the reply (the reviewer and the compactor follow in the background). It
shows, quietly, which model answered, when a tool ran, when memory was updated and when
history was trimmed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape

from fermix import llm
from fermix.api import Memory
from fermix.config import Config
from fermix.conversation import Conversation
from fermix.core import commands
from fermix.core.review import Skip
from fermix.errors import FermixError, ModelError
from fermix.home import Home

DEFAULT_SYSTEM = (
    "You are a helpful assistant with long-term memory. Use the memory tools when the user "
    "refers to something from earlier conversations or asks you to remember a detail."
)
MAX_TOOL_ROUNDS = 4
CHAT_COMMANDS = {
    "memory": "show USER.md and MEMORY.md",
    "review": "distil facts from this conversation now",
    "help": "show the commands",
    "quit": "leave (also /exit, Ctrl-D or Ctrl-C)",
}
"""The commands this host handles itself; fermix's own (/compact, /new, /clear) go through
``Conversation.handle_command``. ``/help`` lists both, from :func:`commands.help_text`."""
UP_TO_DATE_BACKGROUND = "memory is up to date (the background review already saw these messages)"
UP_TO_DATE = "memory is up to date (no new messages since the last review)"
NOTHING_TO_REVIEW = "nothing to review yet (no messages from you in this conversation)"


@dataclass(frozen=True)
class ChatOptions:
    """What ``fermix chat`` was asked for."""

    agent_id: str = "default"
    chat_id: str = "terminal"
    owner_id: str = ""
    trust: str = "operator"
    """``fermix chat`` is the operator's own terminal: operator unless ``--trust guest``."""
    model: str | None = None
    fallbacks: tuple[str, ...] | None = None
    api_base: str | None = None
    system: str = DEFAULT_SYSTEM


def chat_config(config: Config, options: ChatOptions) -> Config:
    """``config`` with the command line's model route, so reviews and compaction use it too."""
    route = llm.Route.from_config(
        config.model, model=options.model, fallbacks=options.fallbacks, api_base=options.api_base
    )
    model = dataclasses.replace(
        config.model,
        primary=route.primary,
        fallbacks=route.models[1:],
        api_base=route.api_base,
        api_key_env=route.api_key_env,
    )
    return dataclasses.replace(config, model=model)


class ChatSession:
    """One terminal chat: reads lines, runs turns, prints replies and quiet notes."""

    def __init__(self, memory: Memory, conv: Conversation, options: ChatOptions, out: Console):
        self.memory = memory
        self.conv = conv
        self.options = options
        self.out = out
        self.route = llm.Route.from_config(memory.config.model)
        self._files = self._current_files()
        self._checkpoint = self._checkpoint_id()
        self._reviewed_up_to = self._last_reviewed_message_id()
        """How far the reviews this session knows of had read; a newer mark is another's."""

    def note(self, text: str) -> None:
        """Print a quiet status line."""
        self.out.print(f"[dim]· {escape(text)}[/dim]")

    def run(self, read: Callable[[str], str]) -> None:
        """Read and answer lines until EOF, Ctrl-C or /quit."""
        self.out.print(
            f"[bold]fermix chat[/bold] [dim]agent {self.options.agent_id}, chat "
            f"{self.options.chat_id}, model {self.route.primary} · /help for commands[/dim]"
        )
        while True:
            try:
                self._report_background_changes()
                line = read("you> ")
            except (EOFError, KeyboardInterrupt):
                self.out.print()
                return
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                return
            try:
                self.handle(text)
            except KeyboardInterrupt:
                self.out.print()
                return

    def handle(self, text: str) -> None:
        """One line: a command, or a turn."""
        if text == "/help":
            self.out.print(commands.help_text(CHAT_COMMANDS), markup=False, highlight=False)
            return
        if text == "/memory":
            user_md, memory_md = self.conv.memory_files()
            self.out.print(escape(user_md or "(USER.md is empty)"))
            self.out.print(escape(memory_md or "(MEMORY.md is empty)"))
            return
        if text == "/review":
            self.review_now()
            return
        reply = self.conv.handle_command(text)
        if reply is not None:
            self.note(reply)
            self._checkpoint = self._checkpoint_id()
            return
        if text.startswith("/"):
            self.note(f"unknown command {text.split()[0]}; /help lists them")
            return
        self.turn(text)

    def turn(self, text: str) -> None:
        """One turn through the public API, with tool calls run by fermix."""
        notice = self.conv.preflight()
        if notice:
            self.note(notice)
            self._checkpoint = self._checkpoint_id()
        self.conv.append_user(text)
        peak = 0
        try:
            for _ in range(MAX_TOOL_ROUNDS + 1):
                answer = llm.complete(
                    self.route,
                    self.conv.compose(self.options.system),
                    agent="chat",
                    tools=self.memory.tools.schemas(),
                )
                peak = max(peak, answer.usage.prompt_tokens)
                if not answer.tool_calls:
                    break
                self._run_tools(answer)
            else:
                answer = dataclasses.replace(answer, content=answer.content or "(no answer)")
        except ModelError as exc:
            self.out.print(f"[red]The model could not answer:[/red] {escape(str(exc))}")
            return
        self.out.print(
            f"[bold cyan]{escape(self.options.agent_id)}>[/bold cyan] {escape(answer.content)}"
        )
        via = f"answered by {answer.model}"
        if answer.tried:
            via += " after " + ", ".join(f"{m} ({e})" for m, e in answer.tried)
        self.note(via)
        self.conv.commit(answer.content, usage={"prompt_tokens": peak})

    def review_now(self) -> None:
        """``/review``: a forced review of this conversation, reported as what happened.

        The background review is dispatched after every turn and runs on the same reviewer
        actor, so a ``/review`` typed right after a turn usually finds that review has just
        read the new messages. That is said as such, with the files it changed reported
        once, rather than as a skipped review followed by an unexplained update.
        """
        result = self.memory.review(self.conv)
        reviewed = self._last_reviewed_message_id()
        if result.status == "applied":
            done = [
                f"{count} {what}"
                for count, what in (
                    (result.added, "added"),
                    (result.replaced, "replaced"),
                    (result.archived, "archived"),
                    (len(result.refused), "refused"),
                )
                if count
            ]
            self.note("review: applied" + (f" ({', '.join(done)})" if done else ""))
        elif result.status == "nothing":
            self.note(f"review: nothing new to remember in {_plural(result.messages, 'message')}")
        elif result.status == "failed":
            self.note(f"review failed: {result.error or 'unknown error'}")
        elif result.skip is Skip.NO_NEW_MESSAGES:
            self._report_memory_changes()  # what the background review wrote, said once
            if reviewed == 0:
                self.note(NOTHING_TO_REVIEW)
            elif reviewed > self._reviewed_up_to:
                self.note(UP_TO_DATE_BACKGROUND)
            else:
                self.note(UP_TO_DATE)
        elif result.skip is Skip.CLAIMED:
            self.note(
                "a background review of this conversation is running; "
                "its changes will show here when it finishes"
            )
        else:
            self.note(f"review skipped ({result.skip or result.status})")
        self._reviewed_up_to = max(self._reviewed_up_to, reviewed)
        self._report_memory_changes()

    def _run_tools(self, answer: llm.Completion) -> None:
        self.conv.append(
            "assistant",
            answer.content,
            sender="assistant",
            metadata={"tool_calls": answer.tool_calls},
        )
        for call in answer.tool_calls:
            function = call.get("function") or {}
            result = self.memory.tools.run(call, self.conv)
            self.note(f"{function.get('name')}({_short(function.get('arguments'))})")
            self.conv.append(
                "tool",
                result,
                sender="fermix",
                metadata={"tool_call_id": call.get("id", ""), "name": function.get("name", "")},
            )

    def _current_files(self) -> dict[str, str]:
        user_md, memory_md = self.conv.memory_files()
        return {"USER.md": user_md, "MEMORY.md": memory_md}

    def _checkpoint_id(self) -> int | None:
        state = self.conv.state()
        return None if state is None else state.checkpoint_message_id

    def _last_reviewed_message_id(self) -> int:
        state = self.conv.state()
        return 0 if state is None else state.last_reviewed_message_id

    def _report_memory_changes(self) -> None:
        """Say which prompt files changed since last said, once per change."""
        files = self._current_files()
        changed = [name for name, text in files.items() if text != self._files.get(name)]
        if changed:
            self.note(f"memory updated ({', '.join(changed)})")
        self._files = files

    def _report_background_changes(self) -> None:
        self._report_memory_changes()
        checkpoint = self._checkpoint_id()
        if checkpoint != self._checkpoint and checkpoint is not None:
            self.note("trimmed older conversation history to stay within the context window")
        self._checkpoint = checkpoint


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _short(arguments: Any, width: int = 60) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return text if len(text) <= width else text[: width - 1] + "…"


def read_line(prompt: str) -> str:
    """``input(prompt)`` that Ctrl-C always interrupts.

    ``input`` misses a SIGINT that arrives after its prompt is written and before it starts
    reading (the handler only sets a flag, and nothing interrupts the read that follows),
    then waits for a whole line. Here the signal also writes to a wake-up pipe that is
    watched with the terminal, so the wait ends and the handler raises KeyboardInterrupt.
    """
    if not sys.stdin.isatty() or threading.current_thread() is not threading.main_thread():
        return input(prompt)
    sys.stdout.write(prompt)
    sys.stdout.flush()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    previous = signal.set_wakeup_fd(wake_w)
    try:
        while sys.stdin.fileno() not in select.select([sys.stdin.fileno(), wake_r], [], [])[0]:
            os.read(wake_r, 64)  # a signal whose handler returned: keep waiting
    finally:
        signal.set_wakeup_fd(previous)
        os.close(wake_r)
        os.close(wake_w)
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.removesuffix("\n")


def run_chat(home: Home, config: Config, options: ChatOptions, out: Console) -> int:
    """Run ``fermix chat``; returns the exit code. No model: one paragraph, exit 2."""
    config = chat_config(config, options)
    if config.model.primary is None:
        out.print(llm.NO_MODEL_HINT, soft_wrap=True, markup=False)
        return 2
    llm.preload()  # the model edge loads while the store opens and the user types
    try:
        with Memory(home, config=config) as memory:
            conv = memory.conversation(
                options.agent_id,
                "cli",
                options.chat_id,
                owner_id=options.owner_id,
                trust=options.trust,
            )
            ChatSession(memory, conv, options, out).run(read_line)
    except FermixError as exc:
        out.print(f"[red]fermix:[/red] {escape(str(exc))}")
        return 1
    return 0
