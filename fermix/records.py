"""What a ``Memory`` holds besides conversations: memory rows, prompt-file revisions,
scheduled jobs and their runs (S7, P2, M9, SC1, T2, N1).

A mixin of :class:`~fermix.api.Memory`, apart so that the facade stays one job per module:
these calls read and write the stored records through the process's runtime, and the
memory server's operator routes and :class:`fermix.Client` offer the same ones.
"""

from __future__ import annotations

from typing import Any

from fermix import validate
from fermix.errors import NotFoundError, WriteFailedError
from fermix.model import JobCaller, JobRun, MemoryRow, Resource, Revision, ScheduledJob
from fermix.runtime import jobs
from fermix.runtime.engine import Runtime

MAX_LISTED = 100_000
"""The most rows or revisions one listing returns."""


class Records:
    """Memory rows, revisions, jobs and runs of the running process (a mixin)."""

    _runtime: Runtime

    # -- memory rows -------------------------------------------------------------------

    def get_row(self, memory_id: int) -> MemoryRow | None:
        """The memory row ``memory_id`` (archived or not), or None."""
        self._runtime.check_running()
        with self._runtime.db.read() as reads:
            return reads.row(memory_id)

    def list_rows(self, **filters: Any) -> list[MemoryRow]:
        """Memory rows matching ``filters`` (the keywords of ``storage.memories.list_rows``)."""
        self._runtime.check_running()
        with self._runtime.db.read() as reads:
            return reads.rows(**filters)

    # -- operator inspection: rows, prompt-file revisions (S7, P2, N1) ---------------------

    def search_rows(
        self,
        query: str,
        *,
        agent_id: str | None = None,
        owner_id: str | None = None,
        category: str | None = None,
        archived: bool | None = False,
        limit: int = 10,
    ) -> list[MemoryRow]:
        """Rows whose key or value matches any word of ``query``, best first (FTS syntax in
        it is plain words). ``archived`` as in :meth:`list_rows`: False live rows only."""
        self._runtime.check_running()
        validate.positive_int("limit", limit, maximum=MAX_LISTED)
        with self._runtime.db.read() as reads:
            return reads.search_rows(
                query,
                agent_id=agent_id,
                owner_id=owner_id,
                category=category,
                archived=archived,
                limit=limit,
            )

    def restore_row(self, memory_id: int) -> MemoryRow:
        """Un-archive row ``memory_id`` and rebuild the prompt files it shows in (S7). A
        failed rebuild (:class:`~fermix.errors.WriteFailedError`) leaves the row restored:
        the files are derived, and the next rebuild repairs them."""
        self._runtime.check_running()
        written = self._runtime.writer.write_rows(
            lambda w: [w.restore_row(memory_id)],
            label=f"restore of row {memory_id}",
            reason=f"restore:{memory_id}",
        )
        if written.error is not None:
            raise WriteFailedError(written.error)
        return written.rows[0]

    def get_run(self, run_id: int) -> JobRun | None:
        """The job run ``run_id``, or None."""
        self._runtime.check_running()
        validate.positive_int("run_id", run_id, maximum=2**63 - 1)
        with self._runtime.db.read() as reads:
            return reads.run(run_id)

    def resources(self, agent_id: str | None = None) -> list[Resource]:
        """The prompt-file resources (every agent's, or ``agent_id``'s) with their current
        revision numbers; a file is recorded on its first rebuild (P2)."""
        self._runtime.check_running()
        with self._runtime.db.read() as reads:
            return reads.resources(agent_id)

    def revisions(
        self, agent_id: str, name: str, *, owner_id: str = "", limit: int = 20
    ) -> list[Revision]:
        """The newest ``limit`` revisions of ``name`` (``user_md`` or ``memory_md``)."""
        self._runtime.check_running()
        validate.positive_int("limit", limit, maximum=MAX_LISTED)
        with self._runtime.db.read() as reads:
            return reads.revisions(agent_id, name, owner_id=owner_id, limit=limit)

    def revision(
        self, agent_id: str, name: str, number: int | None = None, *, owner_id: str = ""
    ) -> Revision:
        """Revision ``number`` of ``name``, or its current one when ``number`` is None;
        :class:`~fermix.errors.NotFoundError` when there is none."""
        self._runtime.check_running()
        with self._runtime.db.read() as reads:
            if number is not None:
                return reads.revision(agent_id, name, number, owner_id=owner_id)
            found = reads.current_revision(agent_id, name, owner_id=owner_id)
        if found is None:
            raise NotFoundError(f"{name} of agent {agent_id!r}, owner {owner_id!r} has no revision")
        return found

    def rollback(self, agent_id: str, name: str, revision: int, *, owner_id: str = "") -> Revision:
        """Write revision ``revision`` of ``name`` back to its file (P2); returns the
        current revision after it (a new one, reason ``rollback:N``, unless it already was).
        The file stays derived: the next rebuild from the rows renders it again."""
        self._runtime.check_running()
        result = self._runtime.writer.files.rollback(agent_id, name, revision, owner_id=owner_id)
        if result.revision is not None:
            return result.revision
        return self.revision(agent_id, name, owner_id=owner_id)

    # -- scheduled jobs and their runs (M9, SC1, T2) ------------------------------------

    def create_job(
        self, agent_id: str, name: str, *, schedule: str, prompt: str, owner_id: str = ""
    ) -> ScheduledJob:
        """Create a scheduled job of ``agent_id`` and, with it, its memory source.

        ``schedule`` is the host's own text (fermix stores it; the host runs the job when
        it is due); ``prompt`` is what a run asks its model. A second job of the same name
        of the agent is an :class:`~fermix.errors.InvalidInputError`.
        """
        self._runtime.check_running()
        return jobs.create_job(
            self._runtime.writer,
            agent_id=agent_id,
            name=name,
            schedule=schedule,
            prompt=prompt,
            owner_id=owner_id,
        )

    def get_job(self, job_id: int) -> ScheduledJob | None:
        """The job ``job_id``, or None."""
        self._runtime.check_running()
        return jobs.get_job(self._runtime.db, job_id)

    def list_jobs(self, *, agent_id: str | None = None) -> list[ScheduledJob]:
        """Every job, or those of ``agent_id``, oldest first."""
        self._runtime.check_running()
        return jobs.list_jobs(self._runtime.db, agent_id=agent_id)

    def start_run(self, job_id: int) -> JobRun:
        """Record that a run of ``job_id`` starts now; returns it ``running``."""
        self._runtime.check_running()
        return jobs.start_run(self._runtime.writer, job_id)

    def job_caller(self, run_id: int) -> JobCaller:
        """The caller to pass to ``memory.tools.run(call, caller)`` during run ``run_id``.

        It is bound to the job's memory source, agent and owner and to the run: the run's
        tools see and write only the job's own memories, and no history (T2).
        """
        self._runtime.check_running()
        return jobs.caller_for_run(self._runtime.db, run_id)

    def finish_run(
        self, run_id: int, *, status: str, output: str = "", error: str | None = None
    ) -> JobRun:
        """Record how run ``run_id`` ended, once: ``status="succeeded"`` with its ``output``,
        or ``status="failed"`` with its ``error``. Its tools are refused from then on."""
        self._runtime.check_running()
        return jobs.finish_run(
            self._runtime.writer, run_id, status=status, output=output, error=error
        )

    def list_runs(self, job_id: int, *, limit: int = 20) -> list[JobRun]:
        """The newest ``limit`` runs of ``job_id``, newest first."""
        self._runtime.check_running()
        return jobs.list_runs(self._runtime.db, job_id, limit=limit)
