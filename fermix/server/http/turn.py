"""The turn routes: what a host does with a conversation, over HTTP (N1, N2, N3).

A host opens a conversation (``POST /v1/conversations/open``) and gets a *handle*
(:func:`fermix.wire.encode_handle`), then appends, composes and commits under
``/v1/conversations/{handle}/...`` exactly as it would with an embedded
:class:`~fermix.conversation.Conversation`: each route is one of its methods.

Nothing in a handle is taken on trust. Every request decodes it again, checks that the
token may act for its agent, and re-derives the trust from the token (:func:`trust_for`):
a host token's conversation and messages are a guest's whatever the handle or the body
says, so a host cannot make itself the operator by naming an owner the config lists.

The routes are plain ``def``: FastAPI runs them on its worker threads, where they wait for
their commit or their conversation's actor without holding up the event loop. Their
dependencies (the token, the handle) are ``async``: cheap checks on the event loop, so a
request makes one hop to a worker thread, not one per dependency (bench/server.py).
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, status

from fermix import wire
from fermix.api import Memory
from fermix.conversation import Conversation
from fermix.errors import NotFoundError
from fermix.model import ApiToken, AppendResult, ConversationKey
from fermix.server.http import blocking
from fermix.server.http.auth import Caller, MemoryDep, caller, require_agent, trust_for
from fermix.server.http.metrics import Metrics
from fermix.server.http.turn_models import (
    AppendRequest,
    CommandOut,
    CommandRequest,
    CommitRequest,
    CompactionOut,
    CompactRequest,
    ComposedOut,
    ComposeRequest,
    FilesOut,
    MessageOut,
    MessagesOut,
    OkOut,
    OpenedConversation,
    OpenRequest,
    PreflightOut,
    ReviewOut,
    ReviewRequest,
    StateOut,
    ToolRunOut,
    ToolRunRequest,
    ToolsOut,
)

REPLAYED_HEADER = "Idempotent-Replayed"
"""Set to ``true`` on the 200 answering an append whose ``client_key`` was already stored."""

router = APIRouter(tags=["conversations"])

_HANDLE = "/conversations/{handle}"


async def metrics_of(request: Request) -> Metrics:
    """The app's counters (``appends``, for the status rates, N7)."""
    metrics: Metrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[Metrics, Depends(metrics_of)]


async def conversation_of(handle: str, token: Caller, memory: MemoryDep) -> Conversation:
    """The conversation ``handle`` names, for this token (a dependency)."""
    return _conversation(handle, token, memory)


def _conversation(handle: str, token: ApiToken, memory: Memory) -> Conversation:
    """The conversation ``handle`` names, for this token: its agent checked, its trust
    re-derived from the token (a host token's is ``guest``; N2)."""
    key, owner_id, asked = wire.decode_handle(handle)
    require_agent(token, key.agent_id, field="path.handle")
    trust = trust_for(token, memory, owner_id, asked, field="path.handle")
    return memory.conversation(*key.as_tuple(), owner_id=owner_id, trust=trust)


Conv = Annotated[Conversation, Depends(conversation_of)]


@router.post("/conversations/open", response_model=OpenedConversation)
def open_conversation(body: OpenRequest, token: Caller, memory: MemoryDep) -> dict[str, Any]:
    """Open a conversation and answer its handle. Cheap: nothing is stored until a
    message is. The trust granted follows the token (M2, N2)."""
    require_agent(token, body.agent_id, field="body.agent_id")
    trust = trust_for(token, memory, body.owner_id, body.trust, field="body.trust")
    conv = memory.conversation(
        body.agent_id,
        body.channel,
        body.chat_id,
        body.thread_scope,
        owner_id=body.owner_id,
        trust=trust,
    )
    return {
        "handle": wire.encode_handle(conv.key, conv.owner_id, conv.trust),
        **_key_fields(conv.key),
        "owner_id": conv.owner_id,
        "trust": conv.trust,
    }


@router.post(
    f"{_HANDLE}/messages",
    response_model=MessageOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "Already stored under this client_key (replayed)."}},
)
async def append(body: AppendRequest, handle: str, request: Request) -> Response:
    """Store one message; answered once it is committed (A1). 201 when stored now; 200
    with ``Idempotent-Replayed: true`` when ``client_key`` was already stored (N3); 409
    when that key holds another message.

    The hot path of every host, so it is lean: the checks run on the event loop, the
    store with the other requests' appends in one batch on a worker thread
    (:mod:`fermix.server.http.batching`), and the answer is encoded once (no second
    validation of what :mod:`fermix.wire` built).
    """
    token = await caller(request)
    memory: Memory = request.app.state.memory
    conv = _conversation(handle, token, memory)
    owner = conv.owner_id if body.owner_id is None else body.owner_id
    pending = conv.prepare(
        body.role,
        body.text,
        sender=body.sender,
        kind=body.kind,
        metadata=body.metadata,
        peak_prompt_tokens=body.peak_prompt_tokens,
        owner_id=body.owner_id,
        trust=_author_trust(token, memory, owner, body.trust),
        client_key=body.client_key,
    )
    appended = await request.app.state.appends.append(pending)
    return _stored(appended, request.app.state.metrics)


@router.get(f"{_HANDLE}/messages", response_model=MessagesOut)
def history(
    conv: Conv,
    limit: Annotated[
        int | None, Query(ge=0, description="Only the newest messages of the window.")
    ] = None,
) -> dict[str, Any]:
    """The conversation's window, oldest first."""
    return {"messages": [wire.message_json(m) for m in conv.history(limit)]}


@router.get(f"{_HANDLE}/files", response_model=FilesOut)
def memory_files(conv: Conv) -> dict[str, Any]:
    """USER.md and MEMORY.md of the conversation's agent and owner, as they are now."""
    user_md, memory_md = conv.memory_files()
    return {"user_md": user_md, "memory_md": memory_md}


@router.post(f"{_HANDLE}/compose", response_model=ComposedOut)
def compose(body: ComposeRequest, conv: Conv) -> dict[str, Any]:
    """The messages for the next model call: the system prompt, the fenced memory
    context, then the window (P1, T5)."""
    return {"messages": conv.compose(body.system, limit=body.limit)}


@router.post(f"{_HANDLE}/preflight", response_model=PreflightOut)
def preflight(conv: Conv) -> dict[str, Any]:
    """Before a turn: compact when the previous turn's peak calls for it (K3)."""
    return {"notice": conv.preflight()}


@router.post(
    f"{_HANDLE}/commit",
    response_model=MessageOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "Already stored under this client_key (replayed)."}},
)
async def commit(body: CommitRequest, handle: str, request: Request) -> Response:
    """Store the turn's reply and its peak prompt tokens, then dispatch the review and
    the compaction off this request's path (E1, K3). Idempotent by ``client_key`` (N3)."""
    token = await caller(request)
    conv = _conversation(handle, token, request.app.state.memory)
    usage = None if body.usage is None else body.usage.model_dump()
    commit_keyed = functools.partial(
        conv.commit_keyed, body.reply, usage, metadata=body.metadata, client_key=body.client_key
    )
    appended = await blocking.run(commit_keyed)
    return _stored(appended, request.app.state.metrics)


@router.post(f"{_HANDLE}/command", response_model=CommandOut)
def handle_command(body: CommandRequest, conv: Conv) -> dict[str, Any]:
    """Run the text if it is a fermix chat command (K4); a guest's state-changing
    command is refused, with the refusal as the reply."""
    return {"reply": conv.handle_command(body.text)}


@router.get(
    f"{_HANDLE}/state",
    response_model=StateOut,
    responses={404: {"description": "Nothing stored in this conversation yet."}},
)
def state(conv: Conv) -> dict[str, Any]:
    """The conversation's stored state: owner, trust, window, gates."""
    found = conv.state()
    if found is None:
        raise NotFoundError("this conversation has nothing stored yet")
    result: dict[str, Any] = wire.to_json(found)
    return result


@router.post(f"{_HANDLE}/reload", response_model=OkOut)
def reload(conv: Conv) -> dict[str, Any]:
    """Re-read the window from SQLite (after another process compacted or cleared it)."""
    conv.reload()
    return {"ok": True}


@router.post(f"{_HANDLE}/review", response_model=ReviewOut)
def review(conv: Conv, memory: MemoryDep, body: ReviewRequest | None = None) -> dict[str, Any]:
    """Review the conversation now and answer what it did (may take model calls)."""
    force = True if body is None else body.force
    result: dict[str, Any] = wire.to_json(memory.review(conv, force=force))
    return result


@router.post(f"{_HANDLE}/compact", response_model=CompactionOut)
def compact(conv: Conv, memory: MemoryDep, body: CompactRequest | None = None) -> dict[str, Any]:
    """Compact the conversation now if due (``force``: whatever its peak)."""
    force = False if body is None else body.force
    result: dict[str, Any] = wire.to_json(memory.compact(conv, force=force))
    return result


@router.get("/tools", response_model=ToolsOut, tags=["tools"])
def tools(token: Caller, memory: MemoryDep) -> dict[str, Any]:
    """The memory tools' definitions, to pass as ``tools=`` to the model (T4)."""
    return {"tools": memory.tools.schemas()}


@router.post(f"{_HANDLE}/tools/run", response_model=ToolRunOut, tags=["tools"])
def run_tool(body: ToolRunRequest, conv: Conv, memory: MemoryDep) -> dict[str, Any]:
    """Run one tool call for this conversation; a refusal comes back as the content
    (``{"error": ...}``), as the embedded ``memory.tools.run`` never raises (T4)."""
    return {"content": memory.tools.run(body.tool_call, conv)}


# -- helpers -----------------------------------------------------------------------------


def _key_fields(key: ConversationKey) -> dict[str, str]:
    return {
        "agent_id": key.agent_id,
        "channel": key.channel,
        "chat_id": key.chat_id,
        "thread_scope": key.thread_scope,
    }


def _author_trust(token: ApiToken, memory: Memory, owner_id: str, asked: str | None) -> str | None:
    """A message author's trust (M1): a host token's is ``guest`` whatever is asked; an
    operator token's is what it asks, else None for the conversation's own default, as
    an embedded ``append`` decides it."""
    if token.operator and asked is None:
        return None
    return trust_for(token, memory, owner_id, asked, field="body.trust")


def _stored(appended: AppendResult, metrics: Metrics) -> Response:
    """The answer to an append or commit: 201, or 200 and the replay header (N3)."""
    body = json.dumps(wire.message_json(appended.message), ensure_ascii=False).encode("utf-8")
    if appended.replayed:
        return Response(
            body,
            status_code=status.HTTP_200_OK,
            media_type="application/json",
            headers={REPLAYED_HEADER: "true"},
        )
    metrics.count("appends")
    return Response(body, status_code=status.HTTP_201_CREATED, media_type="application/json")
