"""``Forgetting``: erasing an owner, a conversation, a message or a memory row (F1-F5).

An erasure goes through the writer like any write (DESIGN.md, "Forgetting, as data"):

1. its record first (:meth:`Writes.begin_erasure`), so that a kill is finished later;
2. then its rows, one bounded step per write unit (:meth:`Writes.erase_step`): appends of
   other owners commit between two steps, never behind a long one;
3. then the prompt files: the owner's folders deleted; every other file that showed an
   erased row rendered again, and its revisions since that row dropped
   (:meth:`Writes.drop_revisions`), the new current revision kept;
4. then the hot copies of this process (its conversation actors of the agent) dropped; other
   processes find their windows and files changed by the rows' versions;
5. then the store's own copies (:meth:`Storage.purge`): ``done`` when the files hold none,
   ``pending`` while a reader holds an old copy (finished by a later purge: :meth:`settle`,
   which the timer and ``fermix doctor --fix`` call).

A step, a rebuild or the purge killed halfway leaves the record as it was; :meth:`resume`
(at start, by the doctor, or the same call again) goes on from there (F5). A review or
compaction that began before an erasure writes nothing after it (:meth:`Reads.erasures_since`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from fermix import validate
from fermix.errors import FermixError, InvalidInputError, NotFoundError
from fermix.model import ConversationKey, Erasure, ForgetReport
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.storage import Storage, Writes
from fermix.storage.erasure import BATCH, conversation_subject

log = logging.getLogger(__name__)

OPERATOR = "operator"
"""Who asked, when the caller names nobody (the CLI, an embedded host)."""

REQUESTER: ContextVar[str] = ContextVar("fermix_erasure_requester", default=OPERATOR)
"""Who asks for the erasures run in this context: the memory server sets its request's
token (:func:`requested_by`); the audit record keeps it (F1)."""


@contextlib.contextmanager
def requested_by(name: str) -> Iterator[None]:
    """The erasures run in the block are recorded as asked for by ``name``."""
    token = REQUESTER.set(validate.text("requested_by", name, max_chars=200) or OPERATOR)
    try:
        yield
    finally:
        REQUESTER.reset(token)


STEP_S = 0.010
"""About how long one erasure step may hold the write lock."""

FIRST_STEP = 20
"""The rows of an erasure's first step; the next ones follow :class:`Steps`."""

_PATTERN = re.compile(r"[*%?\[\]]")
"""What a pattern would use; an id with these that names nobody is refused as one (F8)."""


@dataclass(frozen=True)
class _Plan:
    target: str
    subject: str
    agent_id: str | None
    owner_files: str | None = None
    """The owner whose prompt-file folders go (an owner's erasure)."""


class Steps:
    """The size of an erasure's next step, kept to about :data:`STEP_S` of write lock.

    A row's cost varies a hundredfold: SQLite's FTS5 secure delete rewrites the index pages
    of every term of a message (milliseconds each in an index of a million messages), while
    on PostgreSQL a step's time is mostly its round trips and commit, whatever its size. So
    each step's time is read as a fixed part (the quickest step seen) and a part per row,
    and the next step gets as many rows as fit in :data:`STEP_S` beside the fixed part: few
    on a big SQLite index, the most (``limit``) where rows cost next to nothing.
    """

    def __init__(self, size: int = FIRST_STEP, *, limit: int = BATCH) -> None:
        self.size = size
        self._limit = limit
        self._fixed: float | None = None

    @classmethod
    def apart(cls) -> Steps:
        """Steps that hold up no other writer (the store writes them aside): each as big as
        a batch may be, since its time is no one else's wait."""
        return _Apart(BATCH, limit=BATCH)

    def took(self, seconds: float) -> None:
        """The last step of :attr:`size` rows took ``seconds``: size the next one."""
        fixed = seconds if self._fixed is None else min(self._fixed, seconds)
        self._fixed = fixed
        per_row = max(seconds - fixed, 0.0) / self.size
        if per_row <= 0:
            # no cost beyond the fixed part seen yet: grow, and learn what a row costs
            self.size = min(self._limit, self.size * 2)
            return
        fits = int(STEP_S / per_row)
        self.size = max(1, min(self._limit, fits, self.size * 2))


class _Apart(Steps):
    def took(self, seconds: float) -> None:
        """The size stays: a step written aside keeps no one waiting."""


class Forgetting:
    """The erasures of one process, through its writer."""

    def __init__(
        self,
        storage: Storage,
        writer: Writer,
        files: PromptFiles,
        *,
        drop_hot: Callable[[str | None], None] = lambda agent_id: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = storage
        self._writer = writer
        self._files = files
        self._drop_hot = drop_hot
        self._monotonic = monotonic
        self._lock = threading.Lock()
        """One erasure at a time in this process (a second waits: erasures are rare)."""

    # -- what a host asks ----------------------------------------------------------------

    def forget_owner(self, owner_id: str, *, agent_id: str | None = None) -> ForgetReport:
        """Erase everything of ``owner_id`` (of ``agent_id``, or of every agent: None) (F1)."""
        owner_id = validate.identifier("owner_id", owner_id)
        if agent_id is not None:
            agent_id = validate.identifier("agent_id", agent_id)
        plan = _Plan("owner", owner_id, agent_id, owner_files=owner_id)
        with self._db.read() as reads:
            known = reads.owner_known(owner_id, agent_id)
        if not known and self._resumable(plan) is None:
            if _PATTERN.search(owner_id) or not owner_id.strip():
                raise InvalidInputError(
                    f"owner_id {owner_id!r} names no owner; an owner id is matched exactly,"
                    " never as a pattern"
                )
            where = "" if agent_id is None else f" of agent {agent_id!r}"
            raise NotFoundError(f"no owner {owner_id!r}{where}")
        return self._run(plan)

    def forget_conversation(self, key: ConversationKey) -> ForgetReport:
        """Erase one conversation: its messages, its rows, its state (F2)."""
        with self._db.read() as reads:
            state = reads.conversation(key)
            has_messages = reads.count_messages(key) > 0
        if state is None and not has_messages:
            raise NotFoundError(f"no conversation {key.agent_id}/{key.scope_id}")
        plan = _Plan("conversation", conversation_subject(key), key.agent_id)
        return self._run(plan)

    def forget_message(self, message_id: int) -> ForgetReport:
        """Erase one message, and the rows and checkpoint drawn from it (F2)."""
        validate.positive_int("message_id", message_id, maximum=2**63 - 1)
        with self._db.read() as reads:
            message = reads.message(message_id)
        if message is None:
            raise NotFoundError(f"no message {message_id}")
        return self._run(_Plan("message", str(message_id), message.key.agent_id))

    def forget_memory(self, memory_id: int) -> ForgetReport:
        """Erase one memory row, archived or not: a real delete (F2)."""
        validate.positive_int("memory_id", memory_id, maximum=2**63 - 1)
        with self._db.read() as reads:
            row = reads.row(memory_id)
        if row is None:
            raise NotFoundError(f"no memory row {memory_id}")
        return self._run(_Plan("memory", str(memory_id), row.agent_id))

    # -- finishing what was left ---------------------------------------------------------

    def unfinished(self) -> list[Erasure]:
        """The erasures not ``done`` (a killed one; one a reader held back)."""
        with self._db.read() as reads:
            return reads.unfinished_erasures()

    def resume(self) -> list[ForgetReport]:
        """Finish every unfinished erasure (F5): its rows, files and purge."""
        reports = []
        for erasure in self.unfinished():
            if erasure.state == "running" and erasure.subject is not None:
                owner = erasure.subject if erasure.target == "owner" else None
                plan = _Plan(erasure.target, erasure.subject, erasure.agent_id, owner)
                reports.append(self._finish(erasure.id, plan))
            else:
                reports.append(self._settle_one(erasure))
        return reports

    def settle(self) -> int:
        """Purge again for the ``pending`` erasures, ``done`` once clean; how many settled.
        Cheap when none is pending (one read)."""
        pending = [e for e in self.unfinished() if e.state == "pending"]
        if not pending:
            return 0
        # One at a time with this process's erasures: two purges at once each wait for the
        # other's vacuum, and one of them says pending for nothing.
        with self._lock:
            pending = [e for e in self.unfinished() if e.state == "pending"]
            return sum(1 for e in pending if self._settle_one(e).done)

    # -- one erasure ---------------------------------------------------------------------

    def _run(self, plan: _Plan) -> ForgetReport:
        requester = REQUESTER.get()
        left = self._resumable(plan)
        if left is not None:
            # The same erasure, killed halfway: the same call again finishes it (F5).
            log.info("erasure %d of a %s resumed", left.id, plan.target)
            return self._finish(left.id, plan)
        erasure = self._writer.write(
            lambda writes: writes.begin_erasure(
                target=plan.target,
                subject=plan.subject,
                agent_id=plan.agent_id,
                requested_by=requester,
            ),
            label=f"erasure of a {plan.target}",
        )
        log.info("erasure %d of a %s started", erasure.id, plan.target)
        return self._finish(erasure.id, plan)

    def _resumable(self, plan: _Plan) -> Erasure | None:
        """The unfinished erasure of the same subject, if a kill or a reader left one (its
        subject may be gone already: it is known by its keyed hash)."""
        with self._db.read() as reads:
            left = reads.unfinished_erasures()
            key = reads.erasure_key(plan.target, plan.subject) if left else None
        for erasure in left:
            if (erasure.target, erasure.subject_key, erasure.agent_id) == (
                plan.target,
                key,
                plan.agent_id,
            ):
                return erasure
        return None

    def _finish(self, erasure_id: int, plan: _Plan) -> ForgetReport:
        with self._lock:
            label = f"erasure {erasure_id}"
            # On PostgreSQL a step commits beside the appends (write_aside), so it may be
            # as big as a batch; on SQLite the appends wait for it, so it is kept short.
            steps = Steps.apart() if self._db.writes_aside else Steps()
            while True:
                size = steps.size
                started = self._monotonic()
                erased = self._writer.write_aside(_stepping(erasure_id, size), label=label)
                if not erased:
                    break
                steps.took(self._monotonic() - started)
            self._files_after(erasure_id, plan)
            self._writer.write(lambda w: w.erasure_rows_gone(erasure_id), label=label)
            self._drop_hot(plan.agent_id)
            with self._db.read() as reads:
                erasure = reads.erasure(erasure_id)
            return self._settle_one(erasure)

    def _files_after(self, erasure_id: int, plan: _Plan) -> None:
        """The prompt files once the rows are gone: the owner's deleted; the others that
        showed an erased row rendered again, and their revisions since that row dropped."""
        if plan.owner_files is not None:
            self._files.remove_owner(plan.owner_files, agent_id=plan.agent_id)
        with self._db.read() as reads:
            pairs, since = reads.erasure_rerender(erasure_id)
        if since is None:
            return
        for agent_id, owner_id in pairs:
            if owner_id == plan.owner_files:
                continue  # its files are gone, and its resources with its rows
            try:
                if owner_id == "*":
                    self._files.rebuild_agent(agent_id, reason="erasure")
                else:
                    self._files.rebuild(agent_id, owner_id, reason="erasure")
            except (FermixError, OSError) as exc:
                # The rows are gone; a file left behind is rendered again by the next repair,
                # and its revisions are dropped by the same call again (resume).
                log.error(
                    "erasure %d: prompt files of %s not rendered: %s", erasure_id, agent_id, exc
                )
                raise
            self._writer.write(_dropping(agent_id, owner_id, since), label=f"erasure {erasure_id}")

    def _settle_one(self, erasure: Erasure) -> ForgetReport:
        purged = self._db.purge(since_ms=erasure.finished_at)
        state = erasure.state
        if erasure.finished_at is None and purged.log_clean_at is not None and state == "pending":
            # The copies older than this moment (a replica's local files) are what is left.
            at = purged.log_clean_at
            self._writer.write(
                lambda w: w.erasure_log_clean(erasure.id, at), label=f"erasure {erasure.id}"
            )
        if purged.clean and state == "pending":
            self._writer.write(
                lambda w: w.settle_erasures([erasure.id]), label=f"erasure {erasure.id}"
            )
            state = "done"
        if state == "done":
            log.info("erasure %d done", erasure.id)
        else:
            log.warning("erasure %d pending: %s", erasure.id, purged.left)
        return ForgetReport(
            erasure.id,
            erasure.target,
            state,
            erasure.counts,
            "" if state == "done" else purged.left,
        )


def _dropping(agent_id: str, owner_id: str, since: int) -> Callable[[Writes], int]:
    """The unit that drops the revisions of a pair's files since ``since`` (F2)."""
    return lambda writes: writes.drop_revisions(agent_id, owner_id, since=since)


def _stepping(erasure_id: int, size: int) -> Callable[[Writes], dict[str, int]]:
    """The unit of one step of ``size`` rows of erasure ``erasure_id``."""
    return lambda writes: writes.erase_step(erasure_id, batch=size)
