"""The request and response bodies of the operator's routes (N1).

They make the OpenAPI document: each field says what it holds, so a host written in any
language can be generated from ``/openapi.json``. Response bodies carry every field of
the model type they stand for (``fermix.model``), as :mod:`fermix.wire` writes them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fermix.server.http.turn_models import MessageOut


class _Body(BaseModel):
    """A request body: unknown fields are refused, so a misspelt one is not ignored."""

    model_config = ConfigDict(extra="forbid")


class MemoryRowOut(BaseModel):
    """One long-term memory row, every column (S7)."""

    id: int = Field(description="The row's id.")
    agent_id: str = Field(description="The agent the row belongs to.")
    owner_id: str = Field(description="The owner (user) the row is about; '' single-user.")
    scope_type: str = Field(description="owner, agent, conversation or job.")
    scope_id: str = Field(description="The id within the scope type.")
    category: str = Field(description="One of the six categories (C1).")
    key: str = Field(description="The row's key, unique within its scope.")
    value: str = Field(description="What is remembered.")
    confidence: float = Field(description="The reviewer's confidence, 0..1.")
    promote_target: str | None = Field(description="user_md or memory_md, when promoted.")
    source_id: int | None = Field(description="The memory source that wrote it.")
    source_type: str | None = Field(description="conversation, job, realtime or operator.")
    source_name: str | None = Field(description="The source's name.")
    source_description: str | None = Field(description="The source's description.")
    session_id: str | None = Field(description="The conversation's scope id, if any.")
    run_id: int | None = Field(description="The job run that wrote it, if any.")
    source_message_id: int | None = Field(description="The message it was learnt from.")
    archived_at: int | None = Field(description="When it was archived (epoch ms), or null.")
    archived_by: str | None = Field(description="Who archived it.")
    archive_reason: str | None = Field(description="Why it was archived.")
    created_at: int = Field(description="Epoch milliseconds.")
    updated_at: int = Field(description="Epoch milliseconds.")


class MemoryRows(BaseModel):
    """Memory rows, most recently updated (list) or best matching (search) first."""

    memories: list[MemoryRowOut]


class ResourceOut(BaseModel):
    """A versioned prompt file of one agent and owner (P2)."""

    id: int = Field(description="The resource's id.")
    agent_id: str = Field(description="Its agent.")
    owner_id: str = Field(description="Its owner; '' for the agent's shared files.")
    name: str = Field(description="user_md (USER.md) or memory_md (MEMORY.md).")
    current_revision: int = Field(description="The current revision number; 0 for none.")
    updated_at: int = Field(description="Epoch milliseconds.")


class Resources(BaseModel):
    """The agent's prompt-file resources, by owner and name."""

    resources: list[ResourceOut]


class RevisionOut(BaseModel):
    """One recorded revision of a prompt file, with its full content (P2)."""

    resource_id: int = Field(description="The resource's id.")
    agent_id: str = Field(description="Its agent.")
    owner_id: str = Field(description="Its owner.")
    name: str = Field(description="user_md or memory_md.")
    revision: int = Field(description="The revision number, from 1.")
    content: str = Field(description="The file's text at this revision.")
    content_sha1: str = Field(description="Hex sha1 of the content as UTF-8.")
    reason: str = Field(description="Why it was recorded (rebuild, rollback:N, ...).")
    created_at: int = Field(description="Epoch milliseconds.")


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


class JobOut(BaseModel):
    """A scheduled job and its memory source."""

    id: int = Field(description="The job's id.")
    agent_id: str = Field(description="Its agent.")
    owner_id: str = Field(description="Its owner.")
    name: str = Field(description="Its name.")
    schedule: str = Field(description="The host's schedule text.")
    prompt: str = Field(description="What a run asks its model.")
    memory_source_id: int = Field(description="The memory source its runs' tools write as.")
    enabled: bool = Field(description="Whether the job is enabled.")
    next_run_at: int | None = Field(description="When it is next due (epoch ms), if known.")
    created_at: int = Field(description="Epoch milliseconds.")
    updated_at: int = Field(description="Epoch milliseconds.")


class Jobs(BaseModel):
    """Scheduled jobs, oldest first."""

    jobs: list[JobOut]


class RunOut(BaseModel):
    """One run of a scheduled job."""

    id: int = Field(description="The run's id.")
    job_id: int = Field(description="Its job.")
    status: str = Field(description="running, succeeded or failed.")
    output: str = Field(description="What the run produced.")
    error: str | None = Field(description="Why it failed, if it did.")
    started_at: int = Field(description="Epoch milliseconds.")
    finished_at: int | None = Field(description="Epoch milliseconds, once finished.")


class Runs(BaseModel):
    """Runs of one job, newest first."""

    runs: list[RunOut]


class FinishIn(_Body):
    """``POST /runs/{run_id}/finish``: how the run ended (once)."""

    status: Literal["succeeded", "failed"] = Field(description="succeeded or failed.")
    output: str = Field("", description="The run's output (or a failed run's partial output).")
    error: str | None = Field(None, description="Why it failed.")


class JobCallerOut(BaseModel):
    """The caller a run's tool calls act as: the job's memory source, agent and owner (T2)."""

    agent_id: str = Field(description="The job's agent.")
    memory_source_id: int = Field(description="The job's memory source.")
    owner_id: str = Field(description="The job's owner.")
    run_id: int | None = Field(description="The run.")


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
