"""The request and response bodies of the operator's routes (N1).

They make the OpenAPI document: each field says what it holds, so a host written in any
language can be generated from ``/openapi.json``. Response bodies carry every field of
the model type they stand for (``fermix.model``), as :mod:`fermix.wire`
writes them: their models are derived from those dataclasses
(:mod:`fermix.server.http.wire_models`), and only their prose is written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from fermix.model import JobCaller, JobRun, MemoryRow, Resource, Revision, ScheduledJob
from fermix.server.http.turn_models import MessageOut
from fermix.server.http.wire_models import derive


class _Body(BaseModel):
    """A request body: unknown fields are refused, so a misspelt one is not ignored."""

    model_config = ConfigDict(extra="forbid")


if TYPE_CHECKING:
    # To mypy a derived model is a BaseModel: its fields exist once it is derived.
    MemoryRowOut: TypeAlias = BaseModel
    ResourceOut: TypeAlias = BaseModel
    RevisionOut: TypeAlias = BaseModel
    JobOut: TypeAlias = BaseModel
    RunOut: TypeAlias = BaseModel
    JobCallerOut: TypeAlias = BaseModel
else:
    MemoryRowOut = derive(
        MemoryRow,
        "MemoryRowOut",
        "One long-term memory row, every column (S7).",
        id="The row's id.",
        agent_id="The agent the row belongs to.",
        owner_id="The owner (user) the row is about; '' single-user.",
        scope_type="owner, agent, conversation or job.",
        scope_id="The id within the scope type.",
        category="One of the six categories (C1).",
        key="The row's key, unique within its scope.",
        value="What is remembered.",
        confidence="The reviewer's confidence, 0..1.",
        promote_target="user_md or memory_md, when promoted.",
        source_id="The memory source that wrote it.",
        source_type="conversation, job, realtime or operator.",
        source_name="The source's name.",
        source_description="The source's description.",
        session_id="The conversation's scope id, if any.",
        run_id="The job run that wrote it, if any.",
        source_message_id="The message it was learnt from.",
        archived_at="When it was archived (epoch ms), or null.",
        archived_by="Who archived it.",
        archive_reason="Why it was archived.",
        created_at="Epoch milliseconds.",
        updated_at="Epoch milliseconds.",
    )
    ResourceOut = derive(
        Resource,
        "ResourceOut",
        "A versioned prompt file of one agent and owner (P2).",
        id="The resource's id.",
        agent_id="Its agent.",
        owner_id="Its owner; '' for the agent's shared files.",
        name="user_md (USER.md) or memory_md (MEMORY.md).",
        current_revision="The current revision number; 0 for none.",
        updated_at="Epoch milliseconds.",
    )
    RevisionOut = derive(
        Revision,
        "RevisionOut",
        "One recorded revision of a prompt file, with its full content (P2).",
        resource_id="The resource's id.",
        agent_id="Its agent.",
        owner_id="Its owner.",
        name="user_md or memory_md.",
        revision="The revision number, from 1.",
        content="The file's text at this revision.",
        content_sha1="Hex sha1 of the content as UTF-8.",
        reason="Why it was recorded (rebuild, rollback:N, ...).",
        created_at="Epoch milliseconds.",
    )
    JobOut = derive(
        ScheduledJob,
        "JobOut",
        "A scheduled job and its memory source.",
        id="The job's id.",
        agent_id="Its agent.",
        owner_id="Its owner.",
        name="Its name.",
        schedule="The host's schedule text.",
        prompt="What a run asks its model.",
        memory_source_id="The memory source its runs' tools write as.",
        enabled="Whether the job is enabled.",
        next_run_at="When it is next due (epoch ms), if known.",
        created_at="Epoch milliseconds.",
        updated_at="Epoch milliseconds.",
    )
    RunOut = derive(
        JobRun,
        "RunOut",
        "One run of a scheduled job.",
        id="The run's id.",
        job_id="Its job.",
        status="running, succeeded or failed.",
        output="What the run produced.",
        error="Why it failed, if it did.",
        started_at="Epoch milliseconds.",
        finished_at="Epoch milliseconds, once finished.",
    )
    JobCallerOut = derive(
        JobCaller,
        "JobCallerOut",
        "The caller a run's tool calls act as: the job's memory source, agent and owner (T2).",
        agent_id="The job's agent.",
        memory_source_id="The job's memory source.",
        owner_id="The job's owner.",
        run_id="The run.",
    )


class MemoryRows(BaseModel):
    """Memory rows, most recently updated (list) or best matching (search) first."""

    memories: list[MemoryRowOut]


class _HostRow(_Body):
    """Where a host's row lives: its owner, its scope, its key (SC1)."""

    owner_id: str = Field("", description="The row's owner; '' for the agent's shared rows.")
    scope_type: Literal["owner", "agent", "conversation", "job"] = Field(
        description="owner (the owner's profile), agent, conversation or job."
    )
    scope_id: str = Field(
        description=(
            "owner: the owner id ('_default' for ''); agent: the agent id; conversation:"
            " CHANNEL:CHAT_ID[:THREAD] percent-encoded; job: its memory source id."
        )
    )
    key: str = Field(min_length=1, max_length=200, description="Unique within the scope.")
    trust: Literal["operator", "guest"] | None = Field(
        None, description="operator needs an operator token; a host token is a guest."
    )
    source: str = Field(
        "host", min_length=1, max_length=200, description="The host's name, its provenance."
    )


class PutRowIn(_HostRow):
    """``POST /agents/{agent_id}/memories/put``: a host's row to store (or replace)."""

    value: str = Field(min_length=1, max_length=10_000, description="What to remember.")


class ArchiveRowIn(_HostRow):
    """``POST /agents/{agent_id}/memories/archive``: a host's row to archive (S7)."""


class ArchivedRow(BaseModel):
    """The row archived, or null when no live row had the key (nothing changed)."""

    memory: MemoryRowOut | None = Field(description="The archived row, or null.")


class Resources(BaseModel):
    """The agent's prompt-file resources, by owner and name."""

    resources: list[ResourceOut]


class Revisions(BaseModel):
    """Revisions of one prompt file, newest first."""

    revisions: list[RevisionOut]


class RollbackIn(_Body):
    """``POST .../resources/{name}/rollback``: the revision to write back."""

    revision: int = Field(ge=1, le=2**31 - 1, description="The revision number to restore.")
    owner_id: str = Field("", description="The owner of the file; '' for the shared one.")


class JobIn(_Body):
    """``POST /agents/{agent_id}/jobs``: a scheduled job to create (M9, SC1)."""

    name: str = Field(description="Unique among the agent's jobs.")
    schedule: str = Field(description="The host's own schedule text; fermix only stores it.")
    prompt: str = Field(description="What a run of the job asks its model.")
    owner_id: str = Field("", description="The owner the job works for; '' for none.")


class Jobs(BaseModel):
    """Scheduled jobs, oldest first."""

    jobs: list[JobOut]


class Runs(BaseModel):
    """Runs of one job, newest first."""

    runs: list[RunOut]


class FinishIn(_Body):
    """``POST /runs/{run_id}/finish``: how the run ended (once)."""

    status: Literal["succeeded", "failed"] = Field(description="succeeded or failed.")
    output: str = Field("", description="The run's output (or a failed run's partial output).")
    error: str | None = Field(None, description="Why it failed.")


class ToolRunIn(_Body):
    """``POST /runs/{run_id}/tools/run``: one tool call of the run's model."""

    tool_call: dict[str, Any] = Field(
        description='An OpenAI-format tool call: {"function": {"name", "arguments"}}.'
    )


class ToolResult(BaseModel):
    """The tool message's content: JSON text, ``{"error": ...}`` when refused."""

    content: str = Field(description="The tool message content to hand back to the model.")


class VoiceIn(_Body):
    """``POST /agents/{agent_id}/voice``: one final realtime transcript (V1)."""

    device_id: str = Field(description="The device; its conversation is realtime/<device_id>.")
    role: Literal["user", "assistant"] = Field(description="Who spoke.")
    text: str = Field(description="The final transcript.")
    owner_id: str = Field("", description="The speaker (a user turn's owner).")
    trust: Literal["operator", "guest"] | None = Field(
        None, description="operator needs an operator token; a host token is a guest."
    )


class VoiceOut(BaseModel):
    """The stored transcript, or null when ``persist_transcripts`` is off."""

    message: MessageOut | None = Field(description="The stored voice_turn message, or null.")


class Status(BaseModel):
    """``GET /v1/status``: the server's status document (operator only, N7)."""

    model_config = ConfigDict(extra="allow")
