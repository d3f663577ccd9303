"""The operator's routes for a person's data: erase it, hand it back (F1, F2, F6, F8).

Every route here needs an operator token that acts for the agent concerned: a host token is
refused with 403 before anything is looked up (F8), and a message, row or conversation of an
agent the token does not act for answers 404, as one that does not exist. An owner's
erasure and export name their agent (``agent_id``, required: a token acts for its agents);
the export is streamed, so an owner with a million messages costs the server one page of
them at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, TypeAlias

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from fermix import wire
from fermix.model import ApiToken, Erasure, ForgetReport
from fermix.runtime.forgetting import requested_by
from fermix.server.http.auth import Caller, MemoryDep, require_agent, require_operator
from fermix.server.http.errors import ApiError
from fermix.server.http.wire_models import derive

router = APIRouter(tags=["forgetting"])

MAX_ID = 2**63 - 1
OwnerId = Annotated[str, Path(description="The owner's id, exactly (never a pattern).")]
AgentQuery = Annotated[str, Query(description="The agent whose data it is; the token's.")]

if TYPE_CHECKING:
    ForgetReportOut: TypeAlias = BaseModel
    ErasureOut: TypeAlias = BaseModel
else:
    ForgetReportOut = derive(
        ForgetReport,
        "ForgetReportOut",
        "What a forget did (F1-F3).",
        erasure_id="The erasure's record (its audit).",
        target="owner, conversation, message or memory.",
        state="done: no copy left; pending: a reader holds an old copy, finished later.",
        counts="What was erased, by kind (messages, memory_rows, revisions, ...).",
        left="What still holds a copy, when pending.",
    )
    ErasureOut = derive(
        Erasure,
        "ErasureOut",
        "One erasure's audit record: no content, the subject only as a keyed hash (F1).",
        id="The record's id.",
        target="owner, conversation, message or memory.",
        agent_id="The agent, or null for every agent.",
        subject="Always null here: the subject is kept only while the erasure runs.",
        subject_key="A keyed hash of the subject (the owner id, the row's id, ...).",
        requested_by="Who asked: a token's name, or the operator.",
        state="running, pending or done.",
        counts="What was erased, by kind.",
        started_at="Epoch milliseconds.",
        finished_at="Epoch milliseconds: when its rows were gone and the store's own files clean.",
    )


class Erasures(BaseModel):
    """The erasure records, newest first."""

    erasures: list[ErasureOut]


def _requester(token: ApiToken) -> str:
    return f"token {token.name or token.prefix} (id {token.id})"


def _report(report: ForgetReport) -> ForgetReportOut:
    return ForgetReportOut(**wire.to_json(report))


def _allowed(token: ApiToken, agent_id: str, what: str, *, field: str) -> None:
    require_operator(token, what)
    require_agent(token, agent_id, field=field)


@router.delete("/owners/{owner_id:path}", response_model=ForgetReportOut)
def forget_owner(
    owner_id: OwnerId, agent_id: AgentQuery, token: Caller, memory: MemoryDep
) -> ForgetReportOut:
    """Erase everything of one owner of the agent (operator token; F1); 404 for an owner
    with nothing stored, 422 for an empty id or a pattern."""
    _allowed(token, agent_id, "forgetting an owner", field="query.agent_id")
    with requested_by(_requester(token)):
        return _report(memory.forget_owner(owner_id, agent_id=agent_id))


@router.get("/owners/{owner_id:path}/export", response_class=StreamingResponse)
def export_owner(
    owner_id: OwnerId, agent_id: AgentQuery, token: Caller, memory: MemoryDep
) -> StreamingResponse:
    """Everything kept of one owner of the agent as one JSON document, streamed (operator
    token; F6); 404 for an owner with nothing stored."""
    _allowed(token, agent_id, "exporting an owner", field="query.agent_id")
    pieces = memory.export_chunks(owner_id, agent_id=agent_id)
    return StreamingResponse(pieces, media_type="application/json")


@router.delete("/messages/{message_id}", response_model=ForgetReportOut)
def forget_message(
    message_id: Annotated[int, Path(ge=1, le=MAX_ID, description="The message's id.")],
    token: Caller,
    memory: MemoryDep,
) -> ForgetReportOut:
    """Erase one message, the rows drawn from it and a checkpoint that summarised it
    (operator token; F2); 404 for another agent's."""
    require_operator(token, "forgetting a message")
    found = memory.get_message(message_id)
    if found is None or not token.may_act_for(found.key.agent_id):
        raise ApiError(404, f"no message with id {message_id}", field="path.message_id")
    with requested_by(_requester(token)):
        return _report(memory.forget_message(message_id))


@router.delete("/memories/{memory_id}", response_model=ForgetReportOut)
def forget_memory(
    memory_id: Annotated[int, Path(ge=1, le=MAX_ID, description="The memory row's id.")],
    token: Caller,
    memory: MemoryDep,
) -> ForgetReportOut:
    """Erase one memory row, archived or not (operator token; F2); 404 for another
    agent's."""
    require_operator(token, "forgetting a memory row")
    row = memory.get_row(memory_id)
    if row is None or not token.may_act_for(row.agent_id):
        raise ApiError(404, f"no memory row with id {memory_id}", field="path.memory_id")
    with requested_by(_requester(token)):
        return _report(memory.forget_memory(memory_id))


@router.delete("/conversations/{handle}", response_model=ForgetReportOut)
def forget_conversation(handle: str, token: Caller, memory: MemoryDep) -> ForgetReportOut:
    """Erase one conversation (operator token; F2)."""
    require_operator(token, "forgetting a conversation")
    key, owner_id, _ = wire.decode_handle(handle)
    require_agent(token, key.agent_id, field="path.handle")
    conv = memory.conversation(*key.as_tuple(), owner_id=owner_id, trust="operator")
    with requested_by(_requester(token)):
        return _report(conv.forget())


@router.get("/erasures", response_model=Erasures)
def erasures(
    token: Caller,
    memory: MemoryDep,
    limit: Annotated[int, Query(ge=1, le=10_000, description="At most this many.")] = 100,
) -> Erasures:
    """The erasure records of the token's agents, newest first (operator token; F1)."""
    require_operator(token, "reading the erasure records")
    found = [
        e
        for e in memory.erasures(limit=limit)
        if e.agent_id is None or token.may_act_for(e.agent_id)
    ]
    return Erasures(erasures=[ErasureOut(**wire.to_json(e)) for e in found])
