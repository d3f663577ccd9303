"""The operator's console at ``/console``: its pages, sign-in and its few JSON routes (W1, W2).

The pages are static files of the package (``console_assets/``: HTML, CSS and plain JS
modules, no build step), served under a strict Content-Security-Policy: no inline script
or style, nothing framed, nothing from another origin. Without a live session every
``/console`` page is the sign-in page; its form exchanges an operator token for a session
(:mod:`fermix.server.http.sessions`). The pages' JSON calls go to the ``/v1`` routes where
they exist (the session is their credential) and to the small routes here under
``/console/api`` for what ``/v1`` has no route for: owners, conversations and their
messages, a revision diff, setup, tokens, reviews. Those routes take only a session, of an
operator token, and act only on the agents that token acts for.

Values the pages show (rows, owner ids, file contents) go into the DOM as text
(``textContent``), never as markup; the server sends them as JSON only.
"""

from __future__ import annotations

import threading
import urllib.parse
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fermix import model, wire
from fermix.api import Memory
from fermix.core import render
from fermix.errors import ConfigError, InvalidInputError, NotFoundError
from fermix.model import ApiToken, ConversationKey
from fermix.runtime.live_config import LIVE_KEYS
from fermix.server.http.errors import ApiError
from fermix.server.http.sessions import (
    COOKIE,
    check_same_site,
    current_session,
    live_token,
    session_token,
    sessions_of,
)

router = APIRouter(include_in_schema=False)

PREFIX = "/console"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
ASSETS = {
    "console.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "people.js": "text/javascript; charset=utf-8",
    "setup.js": "text/javascript; charset=utf-8",
    "tokens.js": "text/javascript; charset=utf-8",
    "reviews.js": "text/javascript; charset=utf-8",
    "status.js": "text/javascript; charset=utf-8",
}
"""The assets served, by name: nothing else of the package is reachable."""
SETUP_KEYS = (
    "fermix_core.model.primary",
    "fermix_core.model.fallbacks",
    "fermix_core.memory.review_interval_hours",
    "fermix_core.compaction.enabled",
    "fermix_core.compaction.threshold",
    "fermix_core.realtime.persist_transcripts",
    "fermix_core.retention.messages_days",
    "fermix_core.retention.archived_days",
    "fermix_core.retention.revisions_keep",
    "fermix_core.retention.drop_unreviewed",
)
"""The keys the setup page edits; the rest of config.toml stays the CLI's."""
_config_lock = threading.Lock()
"""One setup write at a time: each reads, edits and replaces the whole file."""


class ConsoleHeaders:
    """Adds the console's security headers to every answer under ``/console`` (W2)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _asset(name: str) -> bytes:
    return (
        resources.files("fermix.server.http").joinpath("console_assets").joinpath(name).read_bytes()
    )


def _page(name: str, status: int = 200) -> Response:
    return Response(_asset(name), status_code=status, media_type="text/html; charset=utf-8")


# -- pages and sign-in (W2) ---------------------------------------------------------------


@router.get(PREFIX)
@router.get(PREFIX + "/")
async def console_page(request: Request) -> Response:
    """The console with a live session, else the sign-in page (a host token, no token or
    an expired session never gets more)."""
    found = current_session(request)
    if found is None or live_token(request, found[1].token_id) is None:
        return _page("signin.html")
    return _page("index.html")


@router.get(PREFIX + "/assets/{name}")
async def asset(name: str) -> Response:
    """One of the console's static files (:data:`ASSETS`); 404 for any other name."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, f"no console asset {name!r}", field="path.name")
    return Response(_asset(name), media_type=media_type)


@router.post(PREFIX + "/signin")
async def sign_in(request: Request) -> Response:
    """Exchange an operator token (form field ``token``) for a session cookie (W2).

    Anything but a live operator token answers the sign-in page again, with 401, and sets
    nothing; a form posted from another site is refused (403)."""
    check_same_site(request)
    sessions = sessions_of(request)
    if sessions is None:
        raise ApiError(404, "the console is off")
    body = await request.body()
    if len(body) > 4096:
        raise ApiError(413, "the sign-in form is too large", field="body.token")
    fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    secret = (fields.get("token") or [""])[0].strip()
    memory: Memory = request.app.state.memory
    token = memory.tokens.authenticate(secret) if secret else None
    if token is None or not token.operator:
        return _page("signin-failed.html", status=401)
    old = request.cookies.get(COOKIE)
    if old:
        sessions.end(old)  # signing in again replaces the session, never adds one
    session_id, _ = sessions.create(token)
    answer = RedirectResponse(PREFIX + "/", status_code=303)
    answer.set_cookie(
        COOKIE,
        session_id,
        max_age=int(sessions.ttl_s),
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return answer


async def console_session(request: Request) -> ApiToken:
    """The operator token of the request's console session, else a 401; a write must
    carry the session's CSRF token and come from this site (403). A bearer token is not
    a console credential: these routes are the console's only."""
    token = session_token(request)
    if token is None:
        raise ApiError(401, "sign in to the console first", field="cookie")
    return token


Operator = Annotated[ApiToken, Depends(console_session)]


def _memory(request: Request) -> Memory:
    memory: Memory = request.app.state.memory
    return memory


def _agent(token: ApiToken, agent_id: str, field: str = "query.agent_id") -> str:
    if not token.may_act_for(agent_id):
        raise ApiError(403, f"this session may not act for agent {agent_id!r}", field=field)
    return agent_id


@router.get(PREFIX + "/api/session")
async def session_info(request: Request, token: Operator) -> dict[str, Any]:
    """Who is signed in, the CSRF token the page's writes carry, and the vocabularies the
    filters offer."""
    found = current_session(request)
    assert found is not None  # console_session checked it
    return {
        "token": {"id": token.id, "name": token.name, "agents": list(token.agents)},
        "csrf": found[1].csrf,
        "expires_at": found[1].expires_at,
        "categories": list(model.CATEGORIES),
        "scope_types": list(model.SCOPE_TYPES),
    }


@router.post(PREFIX + "/api/signout")
async def sign_out(request: Request, token: Operator) -> Response:
    """End the session server-side and clear its cookie (W2)."""
    sessions = sessions_of(request)
    session_id = request.cookies.get(COOKIE, "")
    if sessions is not None:
        sessions.end(session_id)
    answer = JSONResponse({"signed_out": True})
    answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return answer


# -- people: owners, conversations, messages, revision diffs (W1) -------------------------


def _reads(memory: Memory) -> Any:
    """A read session of the server's store. The console is the operator's inspection
    inside the server's process; these reads are not part of ``Memory``'s host surface
    (which ``fermix.Client`` mirrors, N4), so the console takes them from the runtime."""
    return memory._runtime.read()


@router.get(PREFIX + "/api/owners")
def owners(
    request: Request, token: Operator, agent_id: Annotated[str, Query(min_length=1)]
) -> dict[str, Any]:
    """The agent's owners: of memory rows, prompt files or conversations (``""``: the
    agent's shared files and rows)."""
    _agent(token, agent_id)
    with _reads(_memory(request)) as reads:
        found = set(reads.memory_owners(agent_id))
        found |= {c.owner_id for c in reads.conversations(agent_id=agent_id)}
    return {"owners": sorted(found)}


def _conversation(state: model.ConversationState) -> dict[str, Any]:
    out: dict[str, Any] = wire.to_json(state)
    out.pop("review_claim_token", None)
    return out


@router.get(PREFIX + "/api/conversations")
def conversations(
    request: Request,
    token: Operator,
    agent_id: Annotated[str, Query(min_length=1)],
    owner_id: str | None = None,
) -> dict[str, Any]:
    """The agent's conversations (one owner's when given), newest activity first."""
    _agent(token, agent_id)
    with _reads(_memory(request)) as reads:
        found = reads.conversations(agent_id=agent_id)
    if owner_id is not None:
        found = [c for c in found if c.owner_id == owner_id]
    found.sort(key=lambda c: c.updated_at, reverse=True)
    return {"conversations": [_conversation(c) for c in found]}


@router.get(PREFIX + "/api/messages")
def messages(
    request: Request,
    token: Operator,
    agent_id: Annotated[str, Query(min_length=1)],
    channel: Annotated[str, Query(min_length=1)],
    chat_id: Annotated[str, Query(min_length=1)],
    thread_scope: str = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """A conversation's newest messages, oldest first (all stored ones, not only its
    window: compaction hides nothing from the operator)."""
    _agent(token, agent_id)
    try:
        key = ConversationKey(agent_id, channel, chat_id, thread_scope)
    except InvalidInputError as exc:
        raise ApiError(422, str(exc), field="query") from None
    with _reads(_memory(request)) as reads:
        found = reads.messages(key, limit=limit, newest=True)
    return {"messages": [wire.message_json(m) for m in found]}


@router.get(PREFIX + "/api/diff")
def diff(
    request: Request,
    token: Operator,
    agent_id: Annotated[str, Query(min_length=1)],
    name: Annotated[str, Query(pattern="^(user_md|memory_md)$")],
    a: Annotated[int, Query(ge=1, le=2**31 - 1)],
    b: Annotated[int, Query(ge=1, le=2**31 - 1)],
    owner_id: str = "",
) -> dict[str, Any]:
    """A unified diff from revision ``a`` to ``b`` of a prompt file, as ``fermix
    resource diff`` prints it."""
    _agent(token, agent_id)
    memory = _memory(request)
    try:
        old = memory.revision(agent_id, name, a, owner_id=owner_id)
        new = memory.revision(agent_id, name, b, owner_id=owner_id)
    except NotFoundError as exc:
        raise ApiError(404, str(exc), field="query.a") from None
    text = render.revision_diff(old, new)
    return {"name": name, "a": old.revision, "b": new.revision, "diff": text}


# -- setup: config.toml, checked as `fermix config set` checks it (W1) ---------------------


class SetupIn(BaseModel):
    """One setup value: a TOML literal or text, as ``fermix config set KEY VALUE`` reads
    it; empty unsets the key (back to its default)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="A dotted key of the setup page.")
    value: str = Field(max_length=2000, description="A TOML literal (24, true) or text.")


def _setup_state(memory: Memory) -> dict[str, Any]:
    from fermix.cli.config_file import document_values, read_document, toml_literal
    from fermix.config import KEYS, load_config

    path = memory.home.config_path
    config = load_config(path)
    in_file = document_values(read_document(path))
    entries = []
    for dotted in SETUP_KEYS:
        _, section, name = dotted.split(".")
        value = getattr(getattr(config, section), name)
        key = KEYS[dotted]
        entries.append(
            {
                "key": dotted,
                "value": "" if value is None else toml_literal(value),
                "default": "" if key.default is None else toml_literal(key.default),
                "set_in_file": dotted in in_file,
                "accepts": key.kind,
                "doc": key.doc,
                "applies": "now" if dotted in LIVE_KEYS else "at the server's next restart",
            }
        )
    return {"path": str(path), "keys": entries}


@router.get(PREFIX + "/api/setup")
def setup(request: Request, token: Operator) -> dict[str, Any]:
    """The setup page's keys: the effective value, the default, whether the file sets it."""
    try:
        return _setup_state(_memory(request))
    except ConfigError as exc:
        raise ApiError(422, str(exc), field="config.toml") from None


@router.post(PREFIX + "/api/setup")
def change_setup(request: Request, body: SetupIn, token: Operator) -> dict[str, Any]:
    """Set (or, with an empty value, unset) one key in config.toml in place: checked as
    ``fermix config set`` checks it, comments and layout kept, replaced atomically, and
    applied now where the running server can
    (:data:`~fermix.runtime.live_config.LIVE_KEYS`: the running reviewers, compactors,
    retention sweep and model route take it from their next run). A refused value answers
    422 naming ``body.value`` and the file is not touched."""
    from fermix.cli.config_cmd import checked_value
    from fermix.cli.config_file import (
        check_document,
        defaults_toml,
        parse_document,
        read_document,
        set_document_value,
        unset_document_value,
        write_document,
    )
    from fermix.config import parse_value

    if body.key not in SETUP_KEYS:
        raise ApiError(422, f"the console does not set {body.key!r}", field="body.key")
    memory = _memory(request)
    path = memory.home.config_path
    with _config_lock:
        try:
            if body.value.strip() == "":
                document = read_document(path)
                if not unset_document_value(document, body.key):
                    return _setup_state(memory)  # not set: nothing to write
            else:
                value = parse_value(body.value.strip())
                checked_value(body.key, value)
                if path.exists():
                    document = read_document(path)
                    set_document_value(document, body.key, value)
                else:
                    document = parse_document(defaults_toml({body.key: value}))
            loaded = check_document(document, str(path))
        except (ConfigError, InvalidInputError) as exc:
            raise ApiError(422, str(exc), field="body.value") from None
        write_document(path, document)
        memory._reconfigure(loaded)  # the server's own Memory: the console is its operator's
    return _setup_state(memory)


# -- tokens (W1, N2) ----------------------------------------------------------------------


class TokenIn(BaseModel):
    """A token to create: the agents it acts for, whether it is the operator's, a name."""

    model_config = ConfigDict(extra="forbid")

    agents: list[str] = Field(min_length=1, max_length=50)
    operator: bool = False
    name: str = Field(default="", max_length=200)


def _within(token: ApiToken, other: ApiToken) -> bool:
    """Whether ``other`` acts only for agents ``token`` acts for: what a session may see."""
    return set(other.agents) <= set(token.agents)


@router.get(PREFIX + "/api/tokens")
def tokens(request: Request, token: Operator) -> dict[str, Any]:
    """The tokens for this session's agents, oldest first, revoked ones too (no secret)."""
    found = _memory(request).tokens.list(include_revoked=True)
    return {"tokens": [wire.to_json(t) for t in found if _within(token, t)], "self": token.id}


@router.post(PREFIX + "/api/tokens", status_code=201)
def create_token(request: Request, body: TokenIn, token: Operator) -> dict[str, Any]:
    """Make a token for some of this session's agents; its secret is in this answer only."""
    outside = [a for a in body.agents if not token.may_act_for(a)]
    if outside:
        raise ApiError(
            403, f"this session may not act for agent {outside[0]!r}", field="body.agents"
        )
    try:
        made, secret = _memory(request).tokens.create(
            body.agents, operator=body.operator, name=body.name
        )
    except InvalidInputError as exc:
        raise ApiError(422, str(exc), field="body.agents") from None
    return {"token": wire.to_json(made), "secret": secret}


@router.post(PREFIX + "/api/tokens/{token_id}/revoke")
def revoke_token(request: Request, token_id: int, token: Operator) -> dict[str, Any]:
    """Revoke a token: refused from its next request on, and its console sessions end."""
    memory = _memory(request)
    found = next((t for t in memory.tokens.list(include_revoked=True) if t.id == token_id), None)
    if found is None or not _within(token, found):
        raise ApiError(404, f"no token with id {token_id}", field="path.token_id")
    revoked = memory.tokens.revoke(token_id)
    sessions = sessions_of(request)
    if sessions is not None:
        sessions.end_token(token_id)
    return {"token": wire.to_json(revoked)}


# -- reviews and compactions (W1) ---------------------------------------------------------


@router.get(PREFIX + "/api/reviews")
def reviews(
    request: Request, token: Operator, agent_id: Annotated[str, Query(min_length=1)]
) -> dict[str, Any]:
    """Each conversation's last review and compaction state, newest first, the ones due
    now, and the server's last errors (why a review or compaction failed)."""
    from fermix.clock import now_ms

    _agent(token, agent_id)
    memory = _memory(request)
    interval_ms = int(memory.config.memory.review_interval_hours * 3_600_000)
    with _reads(memory) as reads:
        found = reads.conversations(agent_id=agent_id)
        due = reads.due_reviews(
            now=now_ms(),
            limit=200,
            interval_ms=interval_ms,
            backoff_ms=memory.config.memory.review_failure_backoff_ms,
        )
    found.sort(key=lambda c: max(c.last_reviewed_at or 0, c.review_failed_at or 0), reverse=True)
    metrics = request.app.state.metrics.snapshot()
    return {
        "review_interval_hours": memory.config.memory.review_interval_hours,
        "conversations": [_conversation(c) for c in found],
        "due": [wire.to_json(k) for k in due if k.agent_id == agent_id],
        "failed": [
            _conversation(c)
            for c in found
            if c.review_failed_at is not None or c.compaction_failed_at is not None
        ],
        "last_errors": metrics.get("last_errors", []),
    }


# -- doctor's checks (W1) -----------------------------------------------------------------


@router.get(PREFIX + "/api/doctor")
def doctor(request: Request, token: Operator) -> dict[str, Any]:
    """``fermix doctor``'s checks of the server's home, read-only (no ``--fix``, no model
    call, the quick integrity check): what the status page shows on demand."""
    from fermix.cli.doctor_checks import diagnosis
    from fermix.clock import now_ms

    report: dict[str, Any] = diagnosis.diagnose(_memory(request).home, now=now_ms()).as_dict()
    return report
