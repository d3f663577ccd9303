"""``Writer``: the one write path of a process (A1, E6, C5, M6).

Every write of fermix goes through here, whoever asks (the host's turn, the reviewer, the
compactor, a tool call, the CLI, the doctor):

- :meth:`Writer.append` stores a message: appends of one conversation are ordered by its
  lock, committed through the group commit (acknowledged only once committed, retried on
  faults that can pass), and only then delivered to the conversation's actor, so a cache
  never holds an unwritten message;
- :meth:`Writer.write_rows` commits a unit that writes memory rows, then rebuilds the
  prompt files those rows show in (outside the database's write lock; with
  ``defer_shared``, a shared row's other owners are queued for the prompt files'
  background thread instead, M6); a failed rebuild leaves the rows committed and the files
  to :meth:`Writer.repair_files`;
- :meth:`Writer.write` commits any other unit (conversation state, claims, jobs).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from fermix.errors import FermixError, WriteFailedError
from fermix.model import (
    AppendResult,
    ConversationKey,
    MemoryRow,
    Message,
    NewMessage,
    PendingAppend,
)
from fermix.runtime.prompt_files import PromptFiles, RebuildResult
from fermix.storage import Storage, Writes
from fermix.storage.appending import AppendUnit

if TYPE_CHECKING:
    from fermix.runtime.telemetry import Telemetry

log = logging.getLogger(__name__)

T = TypeVar("T")
ORDER_STRIPES = 64
"""Locks that order appends per conversation; a few conversations share each one."""
_STORED, _REPLAYED, _FAILED = ("stored",), ("replayed",), ("failed",)
"""The outcome labels of an append's latency (O1), made once."""


@dataclass
class RowsWritten:
    """What :meth:`Writer.write_rows` did: the rows the unit returned, the files rebuilt."""

    rows: list[MemoryRow]
    files: list[RebuildResult] = field(default_factory=list)
    error: str | None = None
    """Why the prompt files were not rebuilt (the rows are committed regardless)."""

    @property
    def files_changed(self) -> bool:
        """Whether a prompt file or revision changed."""
        return any(r.changed for r in self.files)


class Writer:
    """Orders, commits and announces every write of one process."""

    def __init__(
        self,
        db: Storage,
        files: PromptFiles,
        *,
        deliver: Callable[[Message], None] = lambda message: None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._db = db
        self.files = files
        self._deliver = deliver
        self._telemetry = telemetry
        """Counts and traces the appends (O1, O2); None: not instrumented at all (the
        baseline of bench/append.py's overhead figure)."""
        self._stripes = [threading.Lock() for _ in range(ORDER_STRIPES)]
        self._stale_lock = threading.Lock()
        self._stale_agents: set[str] = set()

    def append(
        self,
        new: NewMessage,
        *,
        trust: str,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
    ) -> Message:
        """Store ``new``: :meth:`append_keyed` without saying whether it replayed."""
        return self.append_keyed(
            new, trust=trust, peak_prompt_tokens=peak_prompt_tokens, owner_id=owner_id
        ).message

    def append_keyed(
        self,
        new: NewMessage,
        *,
        trust: str,
        peak_prompt_tokens: int | None = None,
        owner_id: str | None = None,
    ) -> AppendResult:
        """Store ``new`` (and its conversation's owner, trust and recorded peak) (A1).

        ``owner_id`` and ``trust`` are the conversation's (the handle's), which may differ
        from the message's author in a group chat (M1); ``owner_id`` defaults to the
        author's.

        Returns the stored row once committed, after it was handed to the conversation's
        actor, and whether its client key replayed an earlier append (N3); raises
        :class:`~fermix.errors.WriteFailedError` after the retries, and then nothing of it
        was kept.
        """
        telemetry = self._telemetry
        if telemetry is None:
            return self._append(new, trust, peak_prompt_tokens, owner_id)
        started = time.perf_counter()
        try:
            if telemetry.tracer is None:  # tracing off: no span, no attributes built
                result = self._append(new, trust, peak_prompt_tokens, owner_id)
            else:
                with telemetry.span("fermix.append", _span_attributes(new)) as span:
                    result = self._append(new, trust, peak_prompt_tokens, owner_id)
                    span.set_attribute("fermix.replayed", result.replayed)
        except BaseException:
            seconds = time.perf_counter() - started
            telemetry.append_seconds.observe(seconds, _FAILED)
            telemetry.recent_appends.add(seconds)
            raise
        seconds = time.perf_counter() - started
        telemetry.append_seconds.observe(seconds, _REPLAYED if result.replayed else _STORED)
        telemetry.recent_appends.add(seconds)  # the status document's last minute (W1)
        return result

    def _append(
        self, new: NewMessage, trust: str, peak_prompt_tokens: int | None, owner_id: str | None
    ) -> AppendResult:
        key = new.key
        unit = _unit_of(
            new, new.owner_id if owner_id is None else owner_id, trust, peak_prompt_tokens
        )
        with self._stripes[hash(key) % ORDER_STRIPES]:
            try:
                result = self._db.append(unit, label=_append_label(key))
            except WriteFailedError:
                log.error("%s was not written", _append_label(key))
                raise
            if not result.replayed:
                self._deliver(result.message)
        return result

    def append_many(self, pending: Sequence[PendingAppend]) -> list[AppendResult | BaseException]:
        """Store each append of ``pending``, in order, sharing commits; return each one's
        result or error (one failing leaves the others stored).

        For a caller holding many appends at once, as the memory server batching its
        concurrent requests: one thread commits them all, instead of a thread each. Each
        conversation's appends stay ordered: the batch holds their order locks.
        """
        telemetry = self._telemetry
        if telemetry is None:
            return self._append_many(pending)
        started = time.perf_counter()
        with telemetry.span("fermix.append_many", {"fermix.appends": len(pending)}):
            results = self._append_many(pending)
        seconds = time.perf_counter() - started
        for result in results:
            if isinstance(result, BaseException):
                telemetry.appended("failed", seconds)
            else:
                telemetry.appended("replayed" if result.replayed else "stored", seconds)
        return results

    def _append_many(self, pending: Sequence[PendingAppend]) -> list[AppendResult | BaseException]:
        stripes = sorted({hash(p.new.key) % ORDER_STRIPES for p in pending})
        with contextlib.ExitStack() as held:
            for stripe in stripes:  # in one order everywhere: no deadlock
                held.enter_context(self._stripes[stripe])
            outcomes = self._db.append_each(
                [(append_unit(p), _append_label(p.new.key)) for p in pending]
            )
            results: list[AppendResult | BaseException] = []
            for p, (ok, value) in zip(pending, outcomes, strict=True):
                if not ok:
                    assert isinstance(value, BaseException)
                    log.error("%s was not written: %s", _append_label(p.new.key), value)
                    results.append(value)
                    continue
                assert isinstance(value, AppendResult)
                if not value.replayed:
                    self._deliver(value.message)
                results.append(value)
        return results

    def write(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """Commit ``unit``; return its result once committed."""
        return self._db.write(unit, label=label)

    def write_aside(self, unit: Callable[[Writes], T], *, label: str) -> T:
        """Commit a rare, slow ``unit`` where it holds up no append (the store's
        :meth:`~fermix.storage.port.Storage.write_aside`)."""
        return self._db.write_aside(unit, label=label)

    def write_rows(
        self,
        unit: Callable[[Writes], Sequence[MemoryRow]],
        *,
        label: str,
        reason: str = "rebuild",
        also: Iterable[tuple[str, str]] = (),
        defer_shared: bool = False,
    ) -> RowsWritten:
        """Commit ``unit``, which returns the rows it wrote (as before and after), then
        rebuild every prompt file those rows show in (E6, C5).

        ``also`` names (agent, owner) pairs rebuilt too when any row was written. With
        ``defer_shared`` (M6), a shared row's agent has only its owner ``""`` and the pairs
        of ``also`` rebuilt now; its other owners are queued for the background thread of
        :attr:`files` (and rebuilt first if one composes meanwhile). A rebuild that fails
        is logged and left to :meth:`repair_files`: the files are derived (S1).
        """
        rows = list(self._db.write(unit, label=label))
        written = RowsWritten(rows)
        if not rows:
            return written
        try:
            written.files = self.files.rebuild_for_rows(
                rows, reason=reason, also=also, defer_shared=defer_shared
            )
        except (FermixError, OSError) as exc:
            log.error("%s: prompt files not rebuilt: %s", label, exc)
            with self._stale_lock:
                self._stale_agents.update(row.agent_id for row in rows)
            written.error = f"prompt files not rebuilt: {exc}"
        return written

    @property
    def has_stale_files(self) -> bool:
        """Whether a rebuild of this process failed and awaits :meth:`repair_files`."""
        failed = self.files.take_failed_agents()
        with self._stale_lock:
            self._stale_agents |= failed
            return bool(self._stale_agents)

    def repair_files(self, *, every_agent: bool = False) -> int:
        """Render again the prompt files that lag their rows; returns how many pairs.

        ``every_agent`` checks every agent and removes the temporary files of killed
        writes (at start); otherwise only the agents whose rebuild failed in this process.
        Errors are logged: the files are derived, and the next repair tries again.
        """
        with self._stale_lock:
            agents: list[str | None] = [None] if every_agent else [*sorted(self._stale_agents)]
        repaired = 0
        for agent_id in agents:
            try:
                repaired += len(self.files.repair(agent_id=agent_id))
                if agent_id is None:
                    self.files.remove_orphan_temp_files()
            except (FermixError, OSError) as exc:
                log.warning("prompt files of %s not rebuilt: %s", agent_id or "every agent", exc)
                continue
            with self._stale_lock:
                if agent_id is None:
                    self._stale_agents.clear()
                else:
                    self._stale_agents.discard(agent_id)
        if repaired:
            log.info("rendered %d stale prompt-file pair(s) again", repaired)
        return repaired


def append_unit(pending: PendingAppend) -> AppendUnit:
    """The write unit of one append: the conversation touched, the message inserted (or
    found under its client key, N3), the recorded peak updated."""
    new = pending.new
    owner = new.owner_id if pending.owner_id is None else pending.owner_id
    return _unit_of(new, owner, pending.trust, pending.peak_prompt_tokens)


def _unit_of(new: NewMessage, owner: str, trust: str, peak: int | None) -> AppendUnit:
    """:func:`append_unit` of its parts (:class:`~fermix.storage.appending.AppendUnit`). Run
    with :meth:`Database.append`: it changes a conversation's owner and trust only through
    :meth:`Writes.touch_known`."""
    return AppendUnit(new, owner, trust, peak)


def _span_attributes(new: NewMessage) -> dict[str, str]:
    """An append's span attributes: its agent, channel, role and kind; never an owner or a
    chat id (the span leaves the process for a tracing backend)."""
    return {
        "fermix.agent_id": new.key.agent_id,
        "fermix.channel": new.key.channel,
        "fermix.message.role": new.role,
        "fermix.message.kind": new.kind,
    }


def _name(key: ConversationKey) -> str:
    return f"{key.agent_id}/{key.scope_id}"


@functools.lru_cache(maxsize=1024)
def _append_label(key: ConversationKey) -> str:
    """The label of an append to ``key`` in logs and errors, formatted once per key."""
    return f"append to {_name(key)}"
