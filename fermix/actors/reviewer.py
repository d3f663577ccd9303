"""``Reviewer``: an actor that runs memory reviews one at a time, off the host's path (A4, E1).

The review itself (gate, claim, model call, admission, write) is the runner it is given,
:class:`fermix.runtime.reviewing.Reviewing` in a process; this actor only orders the
requests and keeps a failure from reaching its mailbox. A process runs a small pool of
them under its supervisor (``[fermix_core.memory] review_workers``), a conversation's
requests in order on one (the claim in SQLite keeps two reviews of one conversation apart
across processes), so a review whose model hangs never holds up another conversation's
while a Reviewer is free (M3).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from fermix.actors.base import SupervisedActor
from fermix.core.review import ReviewResult
from fermix.errors import FermixError
from fermix.model import ConversationKey

log = logging.getLogger(__name__)


class ReviewRunner(Protocol):
    """What the Reviewer runs: repairs at start, and one review at a time."""

    def start(self) -> None:
        """Repair what a stopped process left behind, before the first review."""
        ...

    def review(self, key: ConversationKey, *, force: bool = False) -> ReviewResult:
        """Review ``key`` if its gates allow; raise FermixError only for storage trouble."""
        ...


class Review(NamedTuple):
    """Review ``key`` now if its gates allow (``force``: as ``--now``)."""

    key: ConversationKey
    force: bool = False


class Reviewer(SupervisedActor):
    """Runs the reviews it is sent one at a time, off the host's path (A4, E1); one of a
    pool (M3)."""

    # Its work can always be dropped (a claim expires, a backoff passes): a model call
    # still running at shutdown must not keep the process alive.
    use_daemon_thread = True

    def __init__(self, runner: ReviewRunner) -> None:
        super().__init__()
        self._runner = runner

    def on_start(self) -> None:
        """Let the runner repair the prompt files a stopped process left behind.

        It renders every owner's files, so it runs here, on the actor's thread, rather
        than on the host's path at start.
        """
        self._runner.start()

    def on_receive(self, message: Any) -> Any:
        """Run one review; a failure is logged and returned, never raised into the actor."""
        match message:
            case Review(key, force):
                try:
                    return self._runner.review(key, force=force)
                except FermixError as exc:
                    # Storage trouble: the review is retried at its next dispatch.
                    log.error("review of %s/%s failed: %s", key.agent_id, key.scope_id, exc)
                    return ReviewResult(key, "failed", error=str(exc))
        raise TypeError(f"Reviewer got an unknown message: {message!r}")
