"""The request and response bodies of the turn routes (N1), as pydantic models.

FastAPI validates every request against these before a route runs (a bad one is a 422
naming the field, ``body.role``) and documents them in ``/openapi.json``. The shapes are
those of :mod:`fermix.wire`, so :class:`fermix.Client` reads the answers back into
fermix's own types. Requests refuse unknown fields: a misspelt ``txt`` is an error, not a
message stored without its text. The responses that carry a fermix type (a message, a
conversation's state, a review's or compaction's result) are derived from its dataclass
(:mod:`fermix.server.http.wire_models`): here they only get their names and prose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from fermix.core.compaction import CompactionResult
from fermix.core.review import ReviewResult
from fermix.model import MAX_CONTENT_CHARS, ConversationKey, ConversationState, Message
from fermix.server.http.wire_models import derive
from fermix.validate import MAX_IDENTIFIER_CHARS

_NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
Id = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_IDENTIFIER_CHARS, pattern=_NO_CONTROL)
]
"""A required identifier (agent, channel, chat): 1-200 characters, no control characters."""
OptionalId = Annotated[str, StringConstraints(max_length=MAX_IDENTIFIER_CHARS, pattern=_NO_CONTROL)]
"""An identifier that may be empty (thread scope, owner, sender)."""
Trust = Literal["operator", "guest"]
Role = Literal["user", "assistant", "system", "tool"]
Text = Annotated[str, StringConstraints(max_length=MAX_CONTENT_CHARS)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests ----------------------------------------------------------------------------


class OpenRequest(_Request):
    """Open a conversation: its key, whose it is and the trust asked for (M1, M2)."""

    agent_id: Id = Field(
        description="The agent whose conversation this is; the token must list it."
    )
    channel: Id = Field(description="Where the chat happens: 'telegram', 'cli', ...")
    chat_id: Id = Field(description="The chat's id within the channel.")
    thread_scope: OptionalId = Field("", description="A thread within the chat, or ''.")
    owner_id: OptionalId = Field("", description="The user the conversation belongs to.")
    trust: Trust | None = Field(
        None,
        description="'operator' or 'guest'. A host token always gets 'guest' (asking"
        " 'operator' is a 403); an operator token gets what it asks, else the config's"
        " default for the owner.",
    )


class AppendRequest(_Request):
    """Store one message; committed in SQLite before the answer (A1)."""

    role: Role = Field(description="'user', 'assistant', 'system' or 'tool'.")
    text: Text = Field(description="The message's content.")
    sender: OptionalId = Field("", description="Who sent it, as the chat names them.")
    kind: Id = Field("chat", description="The kind of message: 'chat', 'voice_turn', ...")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Any JSON object, stored with the message."
    )
    peak_prompt_tokens: int | None = Field(
        None, ge=0, description="The turn's peak prompt tokens, recorded for compaction (K3)."
    )
    owner_id: OptionalId | None = Field(
        None, description="The author in a group chat (M1); the conversation's owner if null."
    )
    trust: Trust | None = Field(
        None, description="The author's trust; a host token's messages are always a guest's."
    )
    client_key: OptionalId | None = Field(
        None,
        description="The client's own key for this message: sending it again with the same"
        " key stores nothing new and answers 200 with the stored message (N3).",
    )


class Usage(BaseModel):
    """The model provider's usage of the turn; only ``prompt_tokens`` is read (K3)."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int | None = Field(
        None, ge=0, description="The turn's prompt tokens, recorded as its peak."
    )


class CommitRequest(_Request):
    """Store the turn's reply and its usage, then dispatch the review and compaction."""

    reply: Text = Field(description="The assistant's reply, as delivered.")
    usage: Usage | None = Field(None, description="The provider's usage of the turn.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Stored with the reply.")
    client_key: OptionalId | None = Field(
        None, description="As for an append: a retried commit stores the reply once (N3)."
    )


class ComposeRequest(_Request):
    """Compose the next model call's messages (P1, T5)."""

    system: Text = Field(description="The host's system prompt.")
    limit: int | None = Field(None, ge=0, description="Only the newest messages of the window.")


class CommandRequest(_Request):
    """A chat message that may be a fermix command (K4)."""

    text: Text = Field(description="What the user sent, e.g. '/new' or '/compact'.")


class ReviewRequest(_Request):
    """Review the conversation now."""

    force: bool = Field(True, description="Review past the time gates.")


class CompactRequest(_Request):
    """Compact the conversation now."""

    force: bool = Field(False, description="Compact whatever the recorded peak.")


class ToolRunRequest(_Request):
    """Run one of the agent's memory tools for this conversation (T4)."""

    tool_call: dict[str, Any] = Field(
        description="An OpenAI-format tool call: {'function': {'name', 'arguments'}}."
    )


# -- responses ---------------------------------------------------------------------------


class OpenedConversation(BaseModel):
    """An opened conversation and the handle that names it in the other routes."""

    handle: str = Field(description="Use in /v1/conversations/{handle}/...")
    agent_id: str
    channel: str
    chat_id: str
    thread_scope: str
    owner_id: str
    trust: Trust = Field(description="The trust the server granted (a host token's: 'guest').")


if TYPE_CHECKING:
    # To mypy a derived model is a BaseModel: its fields exist once it is derived.
    MessageOut: TypeAlias = BaseModel
    KeyOut: TypeAlias = BaseModel
    StateOut: TypeAlias = BaseModel
    ReviewOut: TypeAlias = BaseModel
    CompactionOut: TypeAlias = BaseModel
else:
    MessageOut = derive(
        Message,
        "MessageOut",
        "A stored message.",
        narrowed={"trust": Trust},
        owner_id="Its author (M1).",
        metadata="The JSON object stored with it.",
        created_at="Epoch milliseconds.",
        trust="The author's trust when it was written.",
        client_key="The client's key it was stored under (N3).",
    )
    KeyOut = derive(ConversationKey, "KeyOut", "A conversation's key.")
    StateOut = derive(
        ConversationState, "StateOut", "A conversation's stored state: owner, trust, window, gates."
    )
    ReviewOut = derive(
        ReviewResult,
        "ReviewOut",
        "What one review did.",
        status="'applied', 'nothing', 'skipped' or 'failed'.",
        skip="Why it was skipped ('no_model', 'under_interval', ...).",
    )
    CompactionOut = derive(
        CompactionResult,
        "CompactionOut",
        "What one compaction attempt did.",
        status="'compacted', 'skipped' or 'failed'.",
    )


class MessagesOut(BaseModel):
    """The conversation's window, oldest first."""

    messages: list[MessageOut]


class FilesOut(BaseModel):
    """The current prompt files of the conversation's agent and owner (P2)."""

    user_md: str = Field(description="USER.md")
    memory_md: str = Field(description="MEMORY.md")


class ComposedOut(BaseModel):
    """The litellm / OpenAI messages for the next model call."""

    messages: list[dict[str, Any]]


class PreflightOut(BaseModel):
    """What the preflight did (K3)."""

    notice: str | None = Field(description="The notice to send when it compacted, else null.")


class CommandOut(BaseModel):
    """A command's reply (K4)."""

    reply: str | None = Field(description="The reply to send; null: not a fermix command.")


class OkOut(BaseModel):
    """Done."""

    ok: bool


class ToolsOut(BaseModel):
    """The memory tools' definitions, as ``tools=`` for litellm (T4)."""

    tools: list[dict[str, Any]]


class ToolRunOut(BaseModel):
    """The tool message's content (JSON text; a refusal is {"error": ...}, never a 4xx)."""

    content: str
