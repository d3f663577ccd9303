"""``ReviewsOff``: the Reviewer's runner when no model is configured (M8)."""

from __future__ import annotations

from collections.abc import Callable

from fermix import llm
from fermix.config import Config
from fermix.core.review import ReviewResult
from fermix.core.review import gate as review_gate
from fermix.model import ConversationKey
from fermix.runtime.reviewing import Reviewing
from fermix.storage import Database


class ReviewsOff:
    """The Reviewer's runner when no model is configured (M8): the repairs at start still
    run, the review gates still answer first (nothing new, disabled...), and a review that
    would run is skipped as ``no_model`` instead of failing into its backoff every time."""

    def __init__(
        self, reviewing: Reviewing, db: Database, config: Config, clock: Callable[[], int]
    ) -> None:
        self._reviewing = reviewing
        self._db = db
        self._config = config.memory
        self._clock = clock

    def start(self) -> None:
        self._reviewing.start()

    def review(self, key: ConversationKey, *, force: bool = False) -> ReviewResult:
        with self._db.read() as reads:
            state = reads.conversation(key)
            newest = reads.newest_user_message_id(key)
        skip = review_gate(
            state,
            now_ms=self._clock(),
            interval_hours=self._config.review_interval_hours,
            backoff_ms=self._config.review_failure_backoff_ms,
            newest_user_message_id=newest,
            force=force,
        )
        if skip is not None:
            return ReviewResult(key, "skipped", skip=skip)
        return ReviewResult(key, "skipped", error=f"{llm.NO_MODEL}: {llm.NO_MODEL_OFF}")
