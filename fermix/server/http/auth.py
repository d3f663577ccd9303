"""Who is asking: the bearer token of a request, and what it may do (N2).

Every data route depends on :func:`caller`: no ``Authorization: Bearer <secret>``, or one
that is unknown or revoked, is a 401. A token acts only for the agents it lists
(:func:`require_agent`, else a 403) and as the operator only when it was made with
``--operator`` (:func:`require_operator`). Trust follows the token: a host token's
conversations and messages are a guest's whatever owner they name, and asking for
``operator`` with one is a 403 (:func:`trust_for`); an operator token gets the trust it
asks for, else the config's default for the owner (M2).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from fermix.api import Memory
from fermix.model import ApiToken, check_trust
from fermix.server.http.errors import ApiError
from fermix.server.http.sessions import session_token


async def memory_of(request: Request) -> Memory:
    """The server's ``Memory`` (set on the app's state when it was made)."""
    memory: Memory = request.app.state.memory
    return memory


async def caller(request: Request) -> ApiToken:
    """The live token of the request, or a 401.

    ``async``, as every cheap dependency here: FastAPI runs a plain ``def`` dependency on a
    worker thread, a hop of its own per request, while this is one indexed read on a
    pooled read connection (WAL: it never waits for a writer), cheaper than the hop.

    With no ``Authorization`` header, a console session's cookie is the credential
    (:func:`~fermix.server.http.sessions.session_token`: its writes carry a CSRF token).
    """
    header = request.headers.get("authorization")
    if header is None:
        session = session_token(request)  # the operator's console (W2)
        if session is not None:
            request.state.token = session
            return session
        raise ApiError(401, "missing Authorization: Bearer <token>", field="header.authorization")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "Authorization must be 'Bearer <token>'", field="header.authorization")
    memory: Memory = request.app.state.memory
    token = memory.tokens.authenticate(secret.strip())
    if token is None:
        raise ApiError(401, "unknown or revoked token", field="header.authorization")
    request.state.token = token
    return token


Caller = Annotated[ApiToken, Depends(caller)]
MemoryDep = Annotated[Memory, Depends(memory_of)]


def require_agent(token: ApiToken, agent_id: str, *, field: str = "agent_id") -> None:
    """A 403 unless ``token`` may act for ``agent_id``."""
    if not token.may_act_for(agent_id):
        raise ApiError(403, f"this token may not act for agent {agent_id!r}", field=field)


def require_operator(token: ApiToken, what: str) -> None:
    """A 403 unless ``token`` is an operator token."""
    if not token.operator:
        raise ApiError(403, f"{what} needs an operator token (fermix token create --operator)")


def trust_for(
    token: ApiToken, memory: Memory, owner_id: str, asked: str | None, *, field: str = "trust"
) -> str:
    """The trust a request gets for ``owner_id``: see the module's docstring (M2, N2)."""
    if asked is not None:
        check_trust(asked)
    if not token.operator:
        if asked == "operator":
            raise ApiError(403, "only an operator token may act as operator", field=field)
        return "guest"
    return memory.config.trust_of(owner_id) if asked is None else asked
