"""The memory over MCP: the memory tools and the prompt files, for any MCP client (N5).

:func:`build_server` makes an MCP server (the official SDK's low-level ``Server``) over a
started :class:`~fermix.api.Memory`. ``fermix mcp`` serves it over stdio for one identity
(:mod:`fermix.cli.mcp_cmd`); :func:`fermix.server.mcp_http.http_app` serves it over
streamable HTTP in the memory server, an identity per request from its bearer token.

Tools: ``memory_store``, ``memory_recall``, ``memory_sources_list``, with exactly the JSON
schemas a host hands its model (:meth:`MemoryTools.schemas`): the low-level API is used
because the SDK's high-level ``MCPServer`` derives a tool's schema from a Python
signature, and ours is the one source of the argument rules. A call runs
``memory.tools.run`` as the conversation ``(agent, "mcp", chat)`` of the owner; a refused
call comes back as a tool error (``isError``) whose text is the tools' own
``{"error": ...}`` content, so a model reads the same words it would through a host.

Resources: the prompt files USER.md and MEMORY.md of an agent and owner, as text::

    fermix://agents/{agent_id}/USER.md                      the agent's default owner ("")
    fermix://agents/{agent_id}/owners/{owner_id}/USER.md    a named owner

(and ``MEMORY.md`` likewise). Each id is one percent-encoded segment
(``urllib.parse.quote(id, safe="")``), so an id holding ``/`` stays one segment; the
default owner has its own shape rather than a spelling some owner id could also have. A
caller reads only the files of agents it may act for, and, unless it has the operator's
trust, only its own owner's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, unquote

import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from fermix import validate
from fermix.api import Memory
from fermix.errors import AccessDeniedError, FermixError, InvalidInputError
from fermix.model import ConversationKey

log = logging.getLogger(__name__)

CHANNEL: Final = "mcp"
"""The channel of every conversation an MCP client acts as."""
SCHEME: Final = "fermix://agents/"
FILE_NAMES: Final = ("USER.md", "MEMORY.md")
IDENTITY_SCOPE_KEY: Final = "fermix.mcp.identity"
"""Where :mod:`fermix.server.mcp_http` leaves a request's :class:`Identity` in its ASGI scope."""
_TEMPLATES: Final = (
    ("prompt file of an agent's default owner", SCHEME + "{agent_id}/{file}"),
    ("prompt file of an agent's named owner", SCHEME + "{agent_id}/owners/{owner_id}/{file}"),
)


@dataclass(frozen=True)
class Identity:
    """Who an MCP client acts as: one conversation of one owner, at one trust.

    ``agents`` are the agents whose prompt files it may read (a token's agents; the one
    ``--agent`` over stdio). Tools always act for ``agent_id``.
    """

    agent_id: str
    owner_id: str = ""
    chat_id: str = ""
    trust: str = "guest"
    agents: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        validate.identifier("owner_id", self.owner_id, allow_empty=True)
        if not self.chat_id:
            object.__setattr__(self, "chat_id", self.owner_id or "default")
        if not self.agents:
            object.__setattr__(self, "agents", (self.agent_id,))
        if self.trust not in ("guest", "operator"):
            raise InvalidInputError(f"trust must be guest or operator, not {self.trust!r}")
        ConversationKey(self.agent_id, CHANNEL, self.chat_id)  # checks both ids

    @property
    def key(self) -> ConversationKey:
        """The conversation the tools act in: ``(agent, "mcp", chat)``."""
        return ConversationKey(self.agent_id, CHANNEL, self.chat_id, "")


@dataclass(frozen=True)
class McpCaller:
    """The caller ``memory.tools.run`` is given: a conversation's key and owner."""

    key: ConversationKey
    owner_id: str


# -- URIs ------------------------------------------------------------------------------


def resource_uri(agent_id: str, owner_id: str, name: str) -> str:
    """The URI of prompt file ``name`` (USER.md or MEMORY.md) of ``agent_id`` and ``owner_id``."""
    agent = quote(agent_id, safe="")
    if owner_id == "":
        return f"{SCHEME}{agent}/{name}"
    return f"{SCHEME}{agent}/owners/{quote(owner_id, safe='')}/{name}"


def parse_resource_uri(uri: str) -> tuple[str, str, str]:
    """``(agent_id, owner_id, name)`` of a prompt file URI; raises InvalidInputError."""
    if not uri.startswith(SCHEME):
        raise InvalidInputError(f"not a fermix prompt file URI (they start {SCHEME})")
    parts = uri[len(SCHEME) :].split("/")
    if len(parts) == 2:
        agent, owner, name = parts[0], None, parts[1]
    elif len(parts) == 4 and parts[1] == "owners":
        agent, owner, name = parts[0], parts[2], parts[3]
    else:
        raise InvalidInputError(
            "a prompt file URI is fermix://agents/{agent_id}/{file} or"
            " fermix://agents/{agent_id}/owners/{owner_id}/{file}"
        )
    if name not in FILE_NAMES:
        raise InvalidInputError(f"the prompt files are {' and '.join(FILE_NAMES)}")
    agent_id = validate.identifier("agent_id", _segment(agent))
    owner_id = "" if owner is None else validate.identifier("owner_id", _segment(owner))
    return agent_id, owner_id, name


def _segment(text: str) -> str:
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise InvalidInputError("a URI segment is not percent-encoded UTF-8") from None


# -- the server ------------------------------------------------------------------------


def build_server(memory: Memory, identity: Identity | None = None) -> Server[Any]:
    """The MCP server over a started ``memory``.

    With an ``identity`` (stdio) every request acts as it; without one (streamable HTTP)
    each request's identity is the one :func:`fermix.server.mcp_http.http_app` put in its
    ASGI scope, and a request that has none is refused.
    """
    schemas = {tool["function"]["name"]: tool["function"] for tool in memory.tools.schemas()}

    def who(ctx: ServerRequestContext[Any, Any]) -> Identity:
        if identity is not None:
            return identity
        scope = getattr(ctx.request, "scope", None)
        found = scope.get(IDENTITY_SCOPE_KEY) if isinstance(scope, Mapping) else None
        if not isinstance(found, Identity):
            raise MCPError(code=types.INVALID_REQUEST, message="no fermix identity on this request")
        return found

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=name,
                    description=function["description"],
                    input_schema=function["parameters"],
                )
                for name, function in schemas.items()
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        me = who(ctx)
        call = {"function": {"name": params.name, "arguments": dict(params.arguments or {})}}
        caller = McpCaller(me.key, me.owner_id)
        content = await anyio.to_thread.run_sync(memory.tools.run, call, caller)
        result = json.loads(content)
        refused = isinstance(result, dict) and "error" in result
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=content)],
            structured_content=result if isinstance(result, dict) else None,
            is_error=refused,
        )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        me = who(ctx)
        owner = f"owner {me.owner_id!r}" if me.owner_id else "the default owner"
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=name,
                    uri=resource_uri(me.agent_id, me.owner_id, name),
                    description=f"{name} of agent {me.agent_id!r} for {owner}",
                    mime_type="text/markdown",
                )
                for name in FILE_NAMES
            ]
        )

    async def list_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name=template,
                    uri_template=template,
                    description=what,
                    mime_type="text/markdown",
                )
                for what, template in _TEMPLATES
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        me, uri = who(ctx), str(params.uri)
        try:
            agent_id, owner_id, name = parse_resource_uri(uri)
            _check_may_read(me, agent_id, owner_id)
            text = await anyio.to_thread.run_sync(_file_text, memory, me, agent_id, owner_id, name)
        except FermixError as exc:
            log.info("resource %r refused: %s", uri[:200], exc)
            raise MCPError(code=_code(exc), message=str(exc), data={"uri": uri[:2000]}) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type="text/markdown")]
        )

    return Server(
        "fermix",
        version=_version(),
        instructions=(
            "fermix memory: store and recall facts of this conversation and its user with the"
            " memory tools; the resources are the prompt files USER.md and MEMORY.md."
        ),
        get_tool_input_schema=lambda name: schemas[name]["parameters"] if name in schemas else None,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


async def serve_stdio(server: Server[Any]) -> None:
    """Serve ``server`` on this process's stdin and stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _check_may_read(me: Identity, agent_id: str, owner_id: str) -> None:
    """Refuse another agent's files, and a guest another owner's (an AccessDeniedError)."""
    if agent_id not in me.agents:
        raise AccessDeniedError(f"this caller may not act for agent {agent_id!r}")
    if owner_id != me.owner_id and me.trust != "operator":
        raise AccessDeniedError("a guest reads only its own owner's prompt files")


def _code(exc: FermixError) -> int:
    """The JSON-RPC error code of a refused read: bad params, refused, or the server's fault."""
    if isinstance(exc, InvalidInputError):
        return types.INVALID_PARAMS
    if isinstance(exc, AccessDeniedError):
        return types.INVALID_REQUEST
    return types.INTERNAL_ERROR


def _file_text(memory: Memory, me: Identity, agent_id: str, owner_id: str, name: str) -> str:
    conv = memory.conversation(agent_id, CHANNEL, me.chat_id, owner_id=owner_id, trust=me.trust)
    user_md, memory_md = conv.memory_files()
    return user_md if name == "USER.md" else memory_md


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fermix")
    except metadata.PackageNotFoundError:
        return "unknown"
