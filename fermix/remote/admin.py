"""``AdminCalls``: the client's rows, prompt-file revisions, jobs and voice (N4).

:class:`fermix.Client` inherits these methods so that a host talking to the memory
server calls the same methods, with the same arguments and return types, as one holding
an embedded :class:`fermix.Memory`. Each is one request to the operator's routes of the
server (``fermix/server/http/admin.py``); the answer comes back as the model type through
:mod:`fermix.wire`, and an error JSON as the fermix error the embedded call would raise.

Over HTTP every listing names its agent (a token acts only for its agents, N2):
``list_rows``, ``search_rows`` and ``resources`` need ``agent_id``, which the embedded
methods let the operator leave out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO, Any, Protocol
from urllib.parse import quote

from fermix import wire
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import (
    Erasure,
    ForgetReport,
    JobCaller,
    JobRun,
    MemoryRow,
    Message,
    Resource,
    Revision,
    ScheduledJob,
    Scope,
)

__all__ = ["AdminCalls"]

MAX_LISTED = 100_000
"""The server's largest ``limit``; an unlimited embedded listing asks for this many."""


class _Requests(Protocol):
    """The transport (``fermix/remote/transport.py``): decoded JSON or a fermix error."""

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> Any: ...

    def download(
        self, path: str, into: IO[bytes], *, params: Mapping[str, Any] | None = None
    ) -> int: ...


def _seg(value: str) -> str:
    """One path segment: an id may hold characters a URL path gives meaning to."""
    return quote(value, safe="")


def _params(**values: Any) -> dict[str, str]:
    """Query parameters as text, leaving out the ones not given."""
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _archived(archived: bool | None) -> dict[str, bool]:
    """The embedded ``archived`` filter as the routes' two flags."""
    if archived is None:
        return {"include_archived": True}
    return {"archived_only": True} if archived else {}


def _agent(agent_id: str | None, method: str) -> str:
    if agent_id is None:
        raise InvalidInputError(f"{method} over HTTP needs agent_id: a token acts for its agents")
    return agent_id


def _host_row(
    owner_id: str, scope: Scope, key: str, trust: str | None, source: str
) -> dict[str, Any]:
    """The body naming a host's row: its owner, scope and key, the trust asked, the host."""
    if not isinstance(scope, Scope):
        raise InvalidInputError(f"scope must be a Scope, not {type(scope).__name__}")
    return {
        "owner_id": owner_id,
        "scope_type": scope.type,
        "scope_id": scope.id,
        "key": key,
        "trust": trust,
        "source": source,
    }


class AdminCalls:
    """Rows, resources, jobs and voice over HTTP, with the embedded ``Memory``'s signatures."""

    _http: _Requests

    # -- memory rows (S7) -------------------------------------------------------------

    def get_row(self, memory_id: int) -> MemoryRow | None:
        """The memory row ``memory_id`` (archived or not), or None (also for a row of an
        agent the token does not act for: the server does not say it exists)."""
        try:
            return wire.row_from_json(self._http.request("GET", f"/v1/memories/{memory_id}"))
        except NotFoundError:
            return None

    def list_rows(self, **filters: Any) -> list[MemoryRow]:
        """Memory rows matching ``filters``, most recently updated first.

        The keywords of the embedded method: ``agent_id`` (needed here), ``owner_id``,
        ``scope_type`` or ``scopes`` (at most one scope), ``category``, ``key``,
        ``archived`` (False: live only, True: archived only, None: both) and ``limit``.
        """
        known = {"agent_id", "owner_id", "scope_type", "scopes", "category", "key"}
        unknown = set(filters) - known - {"archived", "limit"}
        if unknown:
            raise InvalidInputError(f"unknown row filters: {', '.join(sorted(unknown))}")
        agent_id = _agent(filters.get("agent_id"), "list_rows")
        scope = filters.get("scope_type")
        scopes = filters.get("scopes")
        if scopes is not None:
            scopes = list(scopes)
            if not scopes:
                return []  # as the embedded filter: an empty list matches nothing
            if len(scopes) > 1 or scope is not None:
                raise InvalidInputError("list_rows over HTTP takes one scope or one scope_type")
            scope = f"{scopes[0].type}:{scopes[0].id}"
        limit = filters.get("limit")
        params = _params(
            owner_id=filters.get("owner_id"),
            scope=scope,
            category=filters.get("category"),
            key=filters.get("key"),
            limit=MAX_LISTED if limit is None else limit,
            **_archived(filters.get("archived", False)),
        )
        data = self._http.request("GET", f"/v1/agents/{_seg(agent_id)}/memories", params=params)
        return [wire.row_from_json(row) for row in data["memories"]]

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
        """Rows of ``agent_id`` (needed here) matching any word of ``query``, best first."""
        if not query.strip():
            return []  # the embedded search finds nothing in no words
        params = _params(
            q=query, owner_id=owner_id, category=category, limit=limit, **_archived(archived)
        )
        path = f"/v1/agents/{_seg(_agent(agent_id, 'search_rows'))}/memories/search"
        data = self._http.request("GET", path, params=params)
        return [wire.row_from_json(row) for row in data["memories"]]

    def restore_row(self, memory_id: int) -> MemoryRow:
        """Un-archive row ``memory_id`` and rebuild its prompt files (operator token)."""
        data = self._http.request("POST", f"/v1/memories/{memory_id}/restore")
        return wire.row_from_json(data)

    # -- a host's own rows at a scope it names (SC1-SC3) --------------------------------

    def put_row(
        self,
        agent_id: str,
        key: str,
        value: str,
        *,
        scope: Scope,
        owner_id: str = "",
        trust: str | None = None,
        source: str = "host",
    ) -> MemoryRow:
        """Store a host's row at ``scope`` (as the embedded one; a host token writes as a
        guest, so the agent's shared rows need an operator token asking ``operator``).
        Sending it again stores the same row: a retry is harmless."""
        body = _host_row(owner_id, scope, key, trust, source) | {"value": value}
        path = f"/v1/agents/{_seg(agent_id)}/memories/put"
        return wire.row_from_json(self._http.request("POST", path, json=body, idempotent=True))

    def archive_row(
        self,
        agent_id: str,
        key: str,
        *,
        scope: Scope,
        owner_id: str = "",
        trust: str | None = None,
        source: str = "host",
    ) -> MemoryRow | None:
        """Archive a host's row by its key at ``scope``; the archived row, or None when
        no live row had the key (a retry after a lost answer then finds None)."""
        body = _host_row(owner_id, scope, key, trust, source)
        path = f"/v1/agents/{_seg(agent_id)}/memories/archive"
        data = self._http.request("POST", path, json=body, idempotent=True)
        row = data["memory"]
        return None if row is None else wire.row_from_json(row)

    def recall_rows(
        self,
        query: str,
        *,
        agent_id: str,
        owner_id: str | None = None,
        scope: Scope | None = None,
        scope_type: str | None = None,
        limit: int = 10,
    ) -> list[MemoryRow]:
        """Rows of ``agent_id`` matching ``query``, best first, as ``memory_recall`` finds
        them (full-text and vectors fused, Q3)."""
        if scope is not None and scope_type is not None:
            raise InvalidInputError("give a scope or a scope_type, not both")
        if not query.strip():
            return []  # as the embedded recall: no words find nothing
        where = scope_type if scope is None else f"{scope.type}:{scope.id}"
        params = _params(q=query, owner_id=owner_id, scope=where, limit=limit)
        path = f"/v1/agents/{_seg(agent_id)}/memories/recall"
        data = self._http.request("GET", path, params=params)
        return [wire.row_from_json(row) for row in data["memories"]]

    # -- forgetting and export (F1, F2, F6): operator token ----------------------------

    def forget_owner(self, owner_id: str, *, agent_id: str | None = None) -> ForgetReport:
        """Erase everything of ``owner_id`` for ``agent_id`` (needed here; operator token)."""
        path = f"/v1/owners/{_seg(owner_id)}"
        data = self._http.request(
            "DELETE", path, params={"agent_id": _agent(agent_id, "forget_owner")}
        )
        return wire.from_json(ForgetReport, data)

    def forget_message(self, message_id: int) -> ForgetReport:
        """Erase message ``message_id`` and what was drawn from it (operator token)."""
        return wire.from_json(
            ForgetReport, self._http.request("DELETE", f"/v1/messages/{message_id}")
        )

    def forget_memory(self, memory_id: int) -> ForgetReport:
        """Erase memory row ``memory_id``, archived or not (operator token)."""
        return wire.from_json(
            ForgetReport, self._http.request("DELETE", f"/v1/memories/{memory_id}")
        )

    def export_owner(
        self,
        owner_id: str,
        file: str | os.PathLike[str] | IO[bytes],
        *,
        agent_id: str | None = None,
    ) -> int:
        """Write the export of ``owner_id`` for ``agent_id`` (needed here; operator token)
        to ``file``, as the server streams it; returns the bytes written."""
        path = f"/v1/owners/{_seg(owner_id)}/export"
        params = {"agent_id": _agent(agent_id, "export_owner")}
        if isinstance(file, str | os.PathLike):
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                return self._http.download(path, out, params=params)
        return self._http.download(path, file, params=params)

    def erasures(self, *, limit: int = 100) -> list[Erasure]:
        """The erasure records of the token's agents, newest first (operator token)."""
        data = self._http.request("GET", "/v1/erasures", params={"limit": limit})
        return [wire.from_json(Erasure, e) for e in data["erasures"]]

    # -- prompt-file resources and revisions (P2) --------------------------------------

    def resources(self, agent_id: str | None = None) -> list[Resource]:
        """The prompt files of ``agent_id`` (needed here) and their current revisions."""
        path = f"/v1/agents/{_seg(_agent(agent_id, 'resources'))}/resources"
        data = self._http.request("GET", path)
        return [wire.from_json(Resource, item) for item in data["resources"]]

    def revisions(
        self, agent_id: str, name: str, *, owner_id: str = "", limit: int = 20
    ) -> list[Revision]:
        """The newest ``limit`` revisions of ``name`` (``user_md`` or ``memory_md``)."""
        path = f"/v1/agents/{_seg(agent_id)}/resources/{_seg(name)}/history"
        data = self._http.request("GET", path, params=_params(owner_id=owner_id, limit=limit))
        return [wire.revision_from_json(item) for item in data["revisions"]]

    def revision(
        self, agent_id: str, name: str, number: int | None = None, *, owner_id: str = ""
    ) -> Revision:
        """Revision ``number`` of ``name``, or its current one; NotFoundError for none."""
        path = f"/v1/agents/{_seg(agent_id)}/resources/{_seg(name)}"
        data = self._http.request("GET", path, params=_params(owner_id=owner_id, revision=number))
        return wire.revision_from_json(data)

    def rollback(self, agent_id: str, name: str, revision: int, *, owner_id: str = "") -> Revision:
        """Write revision ``revision`` back to the file (operator token); the current
        revision after it."""
        path = f"/v1/agents/{_seg(agent_id)}/resources/{_seg(name)}/rollback"
        data = self._http.request("POST", path, json={"revision": revision, "owner_id": owner_id})
        return wire.revision_from_json(data)

    # -- scheduled jobs and their runs (M9, SC1, T2) ------------------------------------

    def create_job(
        self, agent_id: str, name: str, *, schedule: str, prompt: str, owner_id: str = ""
    ) -> ScheduledJob:
        """Create a scheduled job of ``agent_id`` and its memory source."""
        body = {"name": name, "schedule": schedule, "prompt": prompt, "owner_id": owner_id}
        data = self._http.request("POST", f"/v1/agents/{_seg(agent_id)}/jobs", json=body)
        return wire.job_from_json(data)

    def get_job(self, job_id: int) -> ScheduledJob | None:
        """The job ``job_id``, or None."""
        try:
            return wire.job_from_json(self._http.request("GET", f"/v1/jobs/{job_id}"))
        except NotFoundError:
            return None

    def list_jobs(self, *, agent_id: str | None = None) -> list[ScheduledJob]:
        """The jobs of ``agent_id``, or of every agent the token acts for, oldest first."""
        path = "/v1/jobs" if agent_id is None else f"/v1/agents/{_seg(agent_id)}/jobs"
        return [wire.job_from_json(job) for job in self._http.request("GET", path)["jobs"]]

    def get_run(self, run_id: int) -> JobRun | None:
        """The job run ``run_id``, or None."""
        try:
            return wire.run_from_json(self._http.request("GET", f"/v1/runs/{run_id}"))
        except NotFoundError:
            return None

    def start_run(self, job_id: int) -> JobRun:
        """Record that a run of ``job_id`` starts now; returns it ``running``."""
        return wire.run_from_json(self._http.request("POST", f"/v1/jobs/{job_id}/runs"))

    def job_caller(self, run_id: int) -> JobCaller:
        """The caller to pass to ``client.tools.run(call, caller)`` during run ``run_id``."""
        data = self._http.request("GET", f"/v1/runs/{run_id}/caller")
        return wire.from_json(JobCaller, data)

    def finish_run(
        self, run_id: int, *, status: str, output: str = "", error: str | None = None
    ) -> JobRun:
        """Record how run ``run_id`` ended, once."""
        body = {"status": status, "output": output, "error": error}
        return wire.run_from_json(
            self._http.request("POST", f"/v1/runs/{run_id}/finish", json=body)
        )

    def list_runs(self, job_id: int, *, limit: int = 20) -> list[JobRun]:
        """The newest ``limit`` runs of ``job_id``, newest first."""
        data = self._http.request("GET", f"/v1/jobs/{job_id}/runs", params=_params(limit=limit))
        return [wire.run_from_json(run) for run in data["runs"]]

    # -- realtime voice transcripts (V1) ------------------------------------------------

    def voice_transcript(
        self,
        agent_id: str,
        device_id: str,
        role: str,
        text: str,
        *,
        owner_id: str = "",
        trust: str | None = None,
    ) -> Message | None:
        """Store a final voice transcript when ``persist_transcripts`` is on; else None."""
        body = {
            "device_id": device_id,
            "role": role,
            "text": text,
            "owner_id": owner_id,
            "trust": trust,
        }
        data = self._http.request("POST", f"/v1/agents/{_seg(agent_id)}/voice", json=body)
        message = data["message"]
        return None if message is None else wire.message_from_json(message)
