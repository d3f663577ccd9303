"""Chat commands a host passes through fermix: one parser, one table of rules (K4).

``/compact`` summarizes the window now; ``/new`` and ``/clear`` start a fresh window (the
stored messages, long-term memory, resource revisions and scheduled jobs all stay). Every
state-changing command is operator-only: a guest gets a refusal and nothing changes.
Telegram-style ``/compact@my_bot`` is accepted; anything else is not a command of fermix's
and is left to the host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from fermix.core.compaction import CompactionResult

COMMANDS = {
    "compact": "summarize older messages of this conversation now",
    "new": "start a fresh conversation window (long-term memory is kept)",
    "clear": "the same as /new",
}
STATE_CHANGING = frozenset(COMMANDS)
_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]*)(?:@[A-Za-z0-9_]+)?(?:\s+(.*))?$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Command:
    """A parsed chat command of fermix's."""

    name: str
    argument: str = ""


def parse(text: str) -> Command | None:
    """The fermix command ``text`` holds, or None when it is not one (the host handles it)."""
    if not isinstance(text, str):
        return None
    match = _COMMAND.match(text.strip())
    if match is None:
        return None
    name = match.group(1).lower()
    if name not in COMMANDS:
        return None
    return Command(name, (match.group(2) or "").strip())


def allowed(command: Command, trust: str) -> bool:
    """Whether a conversation at ``trust`` may run ``command`` (state changes: operator only)."""
    return trust == "operator" or command.name not in STATE_CHANGING


def refusal(command: Command) -> str:
    """The reply to a guest who tried a state-changing command."""
    return f"Only the operator can use /{command.name}. Nothing was changed."


def help_text(host_commands: Mapping[str, str] | None = None) -> str:
    """One line per command, names and descriptions in two aligned columns.

    fermix's own commands come first, then ``host_commands`` (name without the slash to
    description): the commands the host handles itself, such as ``fermix chat``'s
    ``/memory``, ``/review``, ``/help`` and ``/quit``. A host passes its commands here, so
    one text lists everything a user can type.
    """
    listed = {**COMMANDS, **(host_commands or {})}
    width = max(len(name) for name in listed) + 1
    return "\n".join(f"/{name:<{width}} {doc}" for name, doc in listed.items())


CLEARED = "Started a fresh conversation window. Long-term memory is kept."
"""The reply to ``/new`` and ``/clear``."""


NO_MODEL_REPLY = "Compaction is off: no model is configured."
"""The reply to ``/compact`` when no model is configured (M8): not "nothing to compact"."""


def compaction_reply(result: CompactionResult) -> str:
    """The reply to ``/compact``: what the compaction did."""
    if result.status == "compacted":
        return (
            f"Compacted {result.summarized} older messages into a summary "
            f"({result.before_tokens} -> {result.after_tokens} tokens)."
        )
    if result.status == "failed":
        return f"Compaction failed: {result.error}"
    if result.reason == "no_model":
        return NO_MODEL_REPLY
    return "Nothing to compact yet."
