"""The operator's routes: memory rows, prompt-file revisions, jobs and runs, voice, status.

The API covers the operator's inspection as well as a host's turn (N1): what ``fermix
memory``, ``fermix resource`` and the embedded ``Memory``'s jobs and voice methods do,
over HTTP, so that ``fermix.Client`` has the same surface as the embedded host (N4).

Authorization (N2): every agent-scoped route needs a token that may act for the agent.
A row, job, run or resource of an agent the token does not act for answers 404, the same
as one that does not exist, so a token cannot learn what other agents hold. Changing
what the reviewer decided (restoring a row, rolling a prompt file back) needs an operator
token; a host token is refused with 403 before anything is looked up or changed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request

from fermix import model, validate, wire
from fermix.api import Memory
from fermix.core.categories import check_host_row
from fermix.errors import AccessDeniedError, InvalidInputError, NotFoundError
from fermix.model import ApiToken, JobCaller, JobRun, ScheduledJob, Scope
from fermix.server.http.admin_models import (
    ArchivedRow,
    ArchiveRowIn,
    FinishIn,
    JobCallerOut,
    JobIn,
    JobOut,
    Jobs,
    MemoryRowOut,
    MemoryRows,
    PutRowIn,
    ResourceOut,
    Resources,
    RevisionOut,
    Revisions,
    RollbackIn,
    RunOut,
    Runs,
    Status,
    ToolResult,
    ToolRunIn,
    VoiceIn,
    VoiceOut,
)
from fermix.server.http.auth import Caller, MemoryDep, require_agent, require_operator, trust_for
from fermix.server.http.errors import ApiError

router = APIRouter()

MAX_ID = 2**63 - 1
AgentId = Annotated[str, Path(description="The agent's id; the token must act for it.")]
MemoryId = Annotated[int, Path(ge=1, le=MAX_ID, description="The memory row's id.")]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The scheduled job's id.")]
RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job run's id.")]
ResourceName = Annotated[
    Literal["user_md", "memory_md"], Path(description="user_md (USER.md) or memory_md.")
]
OwnerQuery = Annotated[str, Query(description="The owner id; '' for the agent's shared files.")]
Limit = Annotated[int, Query(ge=1, le=100_000, description="At most this many.")]


# -- memory rows (S7) -------------------------------------------------------------------


def _scope(text: str | None) -> tuple[str | None, list[Scope] | None]:
    """``TYPE`` or ``TYPE:ID`` as the storage's (scope_type, scopes) filters."""
    if text is None:
        return None, None
    kind, _, scope_id = text.partition(":")
    if kind not in model.SCOPE_TYPES:
        raise ApiError(
            422, f"scope must start with one of {', '.join(model.SCOPE_TYPES)}", field="query.scope"
        )
    try:
        return (kind, None) if not scope_id else (None, [Scope(kind, scope_id)])
    except InvalidInputError as exc:
        raise ApiError(422, str(exc), field="query.scope") from None


def _category(category: str | None) -> str | None:
    if category is None:
        return None
    try:
        return model.check_category(category)
    except InvalidInputError as exc:
        raise ApiError(422, str(exc), field="query.category") from None


def _archived(include_archived: bool, archived_only: bool) -> bool | None:
    """The storage's ``archived`` filter: live only (False), archived only (True), both."""
    return True if archived_only else (None if include_archived else False)


def _rows(rows: list[model.MemoryRow]) -> MemoryRows:
    return MemoryRows(memories=[MemoryRowOut(**wire.to_json(r)) for r in rows])


@router.get("/agents/{agent_id}/memories", response_model=MemoryRows, tags=["memory rows"])
def list_memories(
    agent_id: AgentId,
    token: Caller,
    memory: MemoryDep,
    owner_id: Annotated[str | None, Query(description="Only this owner's rows.")] = None,
    scope: Annotated[
        str | None, Query(description="TYPE or TYPE:ID (owner, agent, conversation, job).")
    ] = None,
    category: Annotated[str | None, Query(description="Only this category (C1).")] = None,
    key: Annotated[str | None, Query(description="Only rows with this key.")] = None,
    include_archived: Annotated[bool, Query(description="Archived rows too.")] = False,
    archived_only: Annotated[bool, Query(description="Only archived rows.")] = False,
    limit: Limit = 100,
) -> MemoryRows:
    """The agent's memory rows, most recently updated first (N1; ``fermix memory list``)."""
    require_agent(token, agent_id, field="path.agent_id")
    scope_type, scopes = _scope(scope)
    return _rows(
        memory.list_rows(
            agent_id=agent_id,
            owner_id=owner_id,
            scope_type=scope_type,
            scopes=scopes,
            category=_category(category),
            key=key,
            archived=_archived(include_archived, archived_only),
            limit=limit,
        )
    )


@router.get("/agents/{agent_id}/memories/search", response_model=MemoryRows, tags=["memory rows"])
def search_memories(
    agent_id: AgentId,
    token: Caller,
    memory: MemoryDep,
    q: Annotated[str, Query(min_length=1, description="Words to find in keys and values.")],
    owner_id: Annotated[str | None, Query(description="Only this owner's rows.")] = None,
    category: Annotated[str | None, Query(description="Only this category (C1).")] = None,
    include_archived: Annotated[bool, Query(description="Archived rows too.")] = False,
    archived_only: Annotated[bool, Query(description="Only archived rows.")] = False,
    limit: Limit = 10,
) -> MemoryRows:
    """The agent's rows matching any word of ``q``, best first (N1; ``fermix memory search``)."""
    require_agent(token, agent_id, field="path.agent_id")
    rows = memory.search_rows(
        q,
        agent_id=agent_id,
        owner_id=owner_id,
        category=_category(category),
        archived=_archived(include_archived, archived_only),
        limit=limit,
    )
    return _rows(rows)


@router.get("/agents/{agent_id}/memories/recall", response_model=MemoryRows, tags=["memory rows"])
def recall_memories(
    agent_id: AgentId,
    token: Caller,
    memory: MemoryDep,
    q: Annotated[str, Query(min_length=1, max_length=20_000, description="What to look for.")],
    owner_id: Annotated[str | None, Query(description="Only this owner's rows.")] = None,
    scope: Annotated[
        str | None, Query(description="TYPE or TYPE:ID (owner, agent, conversation, job).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many.")] = 10,
) -> MemoryRows:
    """The agent's live rows matching ``q``, best first, as ``memory_recall`` finds them:
    full-text and vector search fused (Q3; ``Memory.recall_rows``)."""
    require_agent(token, agent_id, field="path.agent_id")
    scope_type, scopes = _scope(scope)
    rows = memory.recall_rows(
        q,
        agent_id=agent_id,
        owner_id=owner_id,
        scope=scopes[0] if scopes else None,
        scope_type=scope_type,
        limit=limit,
    )
    return _rows(rows)


def _host_row(
    agent_id: str, body: PutRowIn | ArchiveRowIn, token: ApiToken, memory: Memory
) -> tuple[Scope, str]:
    """The scope and trust of a host's row, checked before anything is written, each
    refusal naming its field (SC1-SC3, N2): a host token writes as a guest, and the
    agent's shared rows need an operator token asking for ``operator``."""
    require_agent(token, agent_id, field="path.agent_id")
    trust = trust_for(token, memory, body.owner_id, body.trust, field="body.trust")
    for name in ("owner_id", "source"):
        try:
            validate.identifier(name, getattr(body, name), allow_empty=name == "owner_id")
        except InvalidInputError as exc:
            raise ApiError(422, str(exc), field=f"body.{name}") from None
    try:
        scope = Scope(body.scope_type, body.scope_id)
        check_host_row(scope, agent_id=agent_id, owner_id=body.owner_id, trust=trust)
    except AccessDeniedError as exc:
        raise ApiError(403, str(exc), field="body.owner_id") from None
    except InvalidInputError as exc:
        raise ApiError(422, str(exc), field="body.scope_id") from None
    return scope, trust


@router.post("/agents/{agent_id}/memories/put", response_model=MemoryRowOut, tags=["memory rows"])
def put_memory(agent_id: AgentId, body: PutRowIn, token: Caller, memory: MemoryDep) -> MemoryRowOut:
    """Store a host's row at the scope it names, replacing that key's value there
    (``Memory.put_row``): ``context`` with no promote target, so it renders into no
    prompt file; its provenance is ``source_type = host`` and ``source``."""
    scope, trust = _host_row(agent_id, body, token, memory)
    try:
        row = memory.put_row(
            agent_id,
            body.key,
            body.value,
            scope=scope,
            owner_id=body.owner_id,
            trust=trust,
            source=body.source,
        )
    except NotFoundError as exc:
        raise ApiError(404, str(exc), field="body.scope_id") from None
    return MemoryRowOut(**wire.to_json(row))


@router.post(
    "/agents/{agent_id}/memories/archive", response_model=ArchivedRow, tags=["memory rows"]
)
def archive_memory(
    agent_id: AgentId, body: ArchiveRowIn, token: Caller, memory: MemoryDep
) -> ArchivedRow:
    """Archive a host's row by its key at the scope it names (``Memory.archive_row``,
    S7); ``memory`` is null when no live row had the key."""
    scope, trust = _host_row(agent_id, body, token, memory)
    try:
        row = memory.archive_row(
            agent_id, body.key, scope=scope, owner_id=body.owner_id, trust=trust, source=body.source
        )
    except NotFoundError as exc:
        raise ApiError(404, str(exc), field="body.scope_id") from None
    return ArchivedRow.model_validate({"memory": None if row is None else wire.to_json(row)})


def _own_row(memory: Memory, token: ApiToken, memory_id: int) -> model.MemoryRow:
    """The row, or a 404 when there is none or it is another agent's (N2)."""
    row = memory.get_row(memory_id)
    if row is None or not token.may_act_for(row.agent_id):
        raise ApiError(404, f"no memory row with id {memory_id}", field="path.memory_id")
    return row


@router.get("/memories/{memory_id}", response_model=MemoryRowOut, tags=["memory rows"])
def show_memory(memory_id: MemoryId, token: Caller, memory: MemoryDep) -> MemoryRowOut:
    """One row, archived or not (N1; ``fermix memory show``); 404 for another agent's."""
    return MemoryRowOut(**wire.to_json(_own_row(memory, token, memory_id)))


@router.post("/memories/{memory_id}/restore", response_model=MemoryRowOut, tags=["memory rows"])
def restore_memory(memory_id: MemoryId, token: Caller, memory: MemoryDep) -> MemoryRowOut:
    """Un-archive a row and rebuild its prompt files (operator token; N1, N2, S7)."""
    require_operator(token, "restoring a memory row")
    _own_row(memory, token, memory_id)
    return MemoryRowOut(**wire.to_json(memory.restore_row(memory_id)))


# -- prompt-file resources and revisions (P2) --------------------------------------------


@router.get("/agents/{agent_id}/resources", response_model=Resources, tags=["resources"])
def list_resources(
    agent_id: AgentId,
    token: Caller,
    memory: MemoryDep,
    owner_id: Annotated[str | None, Query(description="Only this owner's files.")] = None,
) -> Resources:
    """The agent's prompt files and their current revisions (N1; ``fermix resource list``)."""
    require_agent(token, agent_id, field="path.agent_id")
    found = memory.resources(agent_id)
    if owner_id is not None:
        found = [r for r in found if r.owner_id == owner_id]
    return Resources(resources=[ResourceOut(**wire.to_json(r)) for r in found])


@router.get("/agents/{agent_id}/resources/{name}", response_model=RevisionOut, tags=["resources"])
def show_resource(
    agent_id: AgentId,
    name: ResourceName,
    token: Caller,
    memory: MemoryDep,
    owner_id: OwnerQuery = "",
    revision: Annotated[
        int | None, Query(ge=1, le=2**31 - 1, description="This revision; default the current.")
    ] = None,
) -> RevisionOut:
    """A prompt file's current text and revision, or an older revision's (N1)."""
    require_agent(token, agent_id, field="path.agent_id")
    found = memory.revision(agent_id, name, revision, owner_id=owner_id)
    return RevisionOut(**wire.to_json(found))


@router.get(
    "/agents/{agent_id}/resources/{name}/history", response_model=Revisions, tags=["resources"]
)
def resource_history(
    agent_id: AgentId,
    name: ResourceName,
    token: Caller,
    memory: MemoryDep,
    owner_id: OwnerQuery = "",
    limit: Limit = 20,
) -> Revisions:
    """A prompt file's revisions, newest first (N1; ``fermix resource history``)."""
    require_agent(token, agent_id, field="path.agent_id")
    found = memory.revisions(agent_id, name, owner_id=owner_id, limit=limit)
    return Revisions(revisions=[RevisionOut(**wire.to_json(r)) for r in found])


@router.post(
    "/agents/{agent_id}/resources/{name}/rollback", response_model=RevisionOut, tags=["resources"]
)
def rollback_resource(
    agent_id: AgentId, name: ResourceName, body: RollbackIn, token: Caller, memory: MemoryDep
) -> RevisionOut:
    """Write an old revision back to the file (operator token; N1, N2, P2); answers the
    current revision after it. The next rebuild from the rows replaces it again."""
    require_operator(token, "rolling back a prompt file")
    require_agent(token, agent_id, field="path.agent_id")
    current = memory.rollback(agent_id, name, body.revision, owner_id=body.owner_id)
    return RevisionOut(**wire.to_json(current))


# -- scheduled jobs and their runs (M9, SC1, T2) ------------------------------------------


def _job(job: ScheduledJob) -> JobOut:
    return JobOut(**wire.to_json(job))


def _run(run: JobRun) -> RunOut:
    return RunOut(**wire.to_json(run))


def _own_job(memory: Memory, token: ApiToken, job_id: int) -> ScheduledJob:
    job = memory.get_job(job_id)
    if job is None or not token.may_act_for(job.agent_id):
        raise ApiError(404, f"no scheduled job with id {job_id}", field="path.job_id")
    return job


def _own_run(memory: Memory, token: ApiToken, run_id: int) -> tuple[JobRun, ScheduledJob]:
    run = memory.get_run(run_id)
    job = None if run is None else memory.get_job(run.job_id)
    if run is None or job is None or not token.may_act_for(job.agent_id):
        raise ApiError(404, f"no job run with id {run_id}", field="path.run_id")
    return run, job


@router.post("/agents/{agent_id}/jobs", response_model=JobOut, status_code=201, tags=["jobs"])
def create_job(agent_id: AgentId, body: JobIn, token: Caller, memory: MemoryDep) -> JobOut:
    """Create a scheduled job and its memory source (N1, N4); the host keeps the schedule."""
    require_agent(token, agent_id, field="path.agent_id")
    job = memory.create_job(
        agent_id, body.name, schedule=body.schedule, prompt=body.prompt, owner_id=body.owner_id
    )
    return _job(job)


@router.get("/agents/{agent_id}/jobs", response_model=Jobs, tags=["jobs"])
def list_agent_jobs(agent_id: AgentId, token: Caller, memory: MemoryDep) -> Jobs:
    """The agent's jobs, oldest first (N1, N4)."""
    require_agent(token, agent_id, field="path.agent_id")
    return Jobs(jobs=[_job(j) for j in memory.list_jobs(agent_id=agent_id)])


@router.get("/jobs", response_model=Jobs, tags=["jobs"])
def list_jobs(token: Caller, memory: MemoryDep) -> Jobs:
    """The jobs of every agent the token acts for, oldest first (N4: ``list_jobs()``)."""
    found = [j for agent in token.agents for j in memory.list_jobs(agent_id=agent)]
    return Jobs(jobs=[_job(j) for j in sorted(found, key=lambda j: j.id)])


@router.get("/jobs/{job_id}", response_model=JobOut, tags=["jobs"])
def get_job(job_id: JobId, token: Caller, memory: MemoryDep) -> JobOut:
    """One job; 404 for another agent's (N2)."""
    return _job(_own_job(memory, token, job_id))


@router.post("/jobs/{job_id}/runs", response_model=RunOut, status_code=201, tags=["jobs"])
def start_run(job_id: JobId, token: Caller, memory: MemoryDep) -> RunOut:
    """Record that a run of the job starts now; answers it ``running`` (N4)."""
    _own_job(memory, token, job_id)
    return _run(memory.start_run(job_id))


@router.get("/jobs/{job_id}/runs", response_model=Runs, tags=["jobs"])
def list_runs(
    job_id: JobId,
    token: Caller,
    memory: MemoryDep,
    limit: Annotated[int, Query(ge=1, le=10_000, description="At most this many.")] = 20,
) -> Runs:
    """The job's newest runs, newest first (N4)."""
    _own_job(memory, token, job_id)
    return Runs(runs=[_run(r) for r in memory.list_runs(job_id, limit=limit)])


@router.get("/runs/{run_id}", response_model=RunOut, tags=["jobs"])
def get_run(run_id: RunId, token: Caller, memory: MemoryDep) -> RunOut:
    """One run; 404 for another agent's (N2)."""
    return _run(_own_run(memory, token, run_id)[0])


@router.post("/runs/{run_id}/finish", response_model=RunOut, tags=["jobs"])
def finish_run(run_id: RunId, body: FinishIn, token: Caller, memory: MemoryDep) -> RunOut:
    """Record how the run ended, once; its tools are refused from then on (N4, T2)."""
    _own_run(memory, token, run_id)
    finished = memory.finish_run(run_id, status=body.status, output=body.output, error=body.error)
    return _run(finished)


def _caller(run: JobRun, job: ScheduledJob) -> JobCaller:
    # Built from the stored job rather than Memory.job_caller, which refuses a finished
    # run: the tools refuse it themselves, as they do an embedded host's stale caller.
    return JobCaller(job.agent_id, job.memory_source_id, job.owner_id, run_id=run.id)


@router.get("/runs/{run_id}/caller", response_model=JobCallerOut, tags=["jobs"])
def job_caller(run_id: RunId, token: Caller, memory: MemoryDep) -> JobCallerOut:
    """The caller the run's tool calls act as (N4: ``job_caller``); 422 once finished."""
    run, job = _own_run(memory, token, run_id)
    if run.status != "running":
        raise ApiError(
            422, f"job run {run_id} already finished ({run.status})", field="path.run_id"
        )
    return JobCallerOut(**wire.to_json(_caller(run, job)))


@router.post("/runs/{run_id}/tools/run", response_model=ToolResult, tags=["jobs"])
def run_tool(run_id: RunId, body: ToolRunIn, token: Caller, memory: MemoryDep) -> ToolResult:
    """Run one tool call as the run's job: only the job's own memories, no history (T2).

    Never an error for the call itself: a refusal is the content ``{"error": ...}``.
    """
    run, job = _own_run(memory, token, run_id)
    return ToolResult(content=memory.tools.run(body.tool_call, _caller(run, job)))


# -- realtime voice transcripts (V1) and the server's status (N7) -------------------------


@router.post("/agents/{agent_id}/voice", response_model=VoiceOut, tags=["voice"])
def voice_transcript(
    agent_id: AgentId, body: VoiceIn, token: Caller, memory: MemoryDep
) -> VoiceOut:
    """Store a final voice transcript when ``persist_transcripts`` is on (N4, V1); the
    speaker's trust follows the token (a host token's is a guest's, N2)."""
    require_agent(token, agent_id, field="path.agent_id")
    trust = trust_for(token, memory, body.owner_id, body.trust, field="body.trust")
    stored = memory.voice_transcript(
        agent_id, body.device_id, body.role, body.text, owner_id=body.owner_id, trust=trust
    )
    return VoiceOut.model_validate(
        {"message": None if stored is None else wire.message_json(stored)}
    )


@router.get("/status", response_model=Status, tags=["server"])
def status(request: Request, token: Caller, memory: MemoryDep) -> Status:
    """The server's status document: memory, actors, request rates (operator token; N2)."""
    require_operator(token, "the status document")
    produce = request.app.state.status
    document: dict[str, Any]
    if produce is not None:
        document = produce()
    else:
        document = {"memory": memory.stats(), "metrics": request.app.state.metrics.snapshot()}
    return Status.model_validate(document)
