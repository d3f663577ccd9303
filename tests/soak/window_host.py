"""A host that serves one conversation's window from its stdin, for the freshness tests (M4).

Run in a child forked by :mod:`soak.zygote` as ``main([HOME, MODEL_URL, MAX_HISTORY])``
(``MAX_HISTORY``: ``none`` or a number, the host's ``max_conversation_history``). It starts a
``Memory`` (the real tree: its ConversationStore caches the window), prints
``{"ready": true}``, then reads one JSON command per line and prints one JSON answer per
line: ``{"ok": RESULT}``, or ``{"error": TYPE, "message": TEXT}`` when a fermix call
raised. ``{"op": "quit"}`` closes the tree and ends it.

Every command is about the conversation ``CHAT`` of agent ``AGENT`` (operator trust):

- ``append`` ``role text``: the stored message's id;
- ``history``: the window, as ``[id, content]`` pairs, oldest first;
- ``command`` ``text``: the reply of a chat command (``/clear``, ``/new``);
- ``compact``: a forced compaction's status.
"""

from __future__ import annotations

from typing import Any

from factories import config_for

from fermix.api import Conversation, Memory
from fermix.config import CompactionConfig, Config, MemoryConfig
from soak.commands import serve

AGENT = "fresh"
CHAT = "shared"
CONTEXT_WINDOW = 400
"""Small, so that a forced compaction of a few short messages summarizes some of them."""


def config(model_url: str, max_history: int | None) -> Config:
    """Background review off; a small context window; the given window cap."""
    return config_for(
        model_url,
        primary="openai/fresh",
        context_window=CONTEXT_WINDOW,
        timeout_s=20,
        memory=MemoryConfig(review_interval_hours=0, max_conversation_history=max_history),
        compaction=CompactionConfig(threshold=0.85),
    )


def conversation(memory: Memory) -> Conversation:
    """The shared conversation, as an operator: its owner may /clear it."""
    return memory.conversation(AGENT, "chat", CHAT, owner_id="ana", trust="operator")


class WindowHost:
    """The commands, over one running Memory."""

    def __init__(self, memory: Memory) -> None:
        self.conv = conversation(memory)
        self.memory = memory

    def append(self, role: str, text: str) -> int:
        return self.conv.append(role, text).id

    def history(self) -> list[list[Any]]:
        return [[m.id, m.content] for m in self.conv.history()]

    def command(self, text: str) -> str | None:
        return self.conv.handle_command(text)

    def compact(self) -> str:
        return self.memory.compact(self.conv, force=True).status


def main(argv: list[str]) -> int:
    home, model_url, cap = argv[0], argv[1], argv[2]
    max_history = None if cap == "none" else int(cap)
    memory = Memory(home, config=config(model_url, max_history))
    return serve(memory, WindowHost)
