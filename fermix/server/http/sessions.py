"""The operator's console sessions: a signed-in browser, and what it may send (W2).

An operator token is exchanged once (``POST /console/signin``) for a session: a random id
(256 bits) in an ``HttpOnly``, ``SameSite=Strict`` cookie, ``Secure`` when the request came
over TLS, with a ``Max-Age``. The server keeps the sessions in memory, keyed by the id's
SHA-256 (a dump of the process's memory holds no live cookie), with their expiry, which
is enforced on every request: a restart signs everyone out, which is what a console
wants. Each session has its own CSRF token, which every write must carry in the
``X-CSRF-Token`` header; a write whose ``Origin`` (or ``Sec-Fetch-Site``) says it came from
another site is refused before the token is even compared.

The session acts as its token: a token revoked or stripped of ``operator`` after sign-in
ends the session on its next request. :func:`session_token` is what
:func:`fermix.server.http.auth.caller` asks when a request has no ``Authorization``
header, so the console's JSON calls reuse the ``/v1`` routes with the session as their
credential.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from fermix.model import ApiToken
from fermix.server.http.errors import ApiError

COOKIE = "fermix_console"
CSRF_HEADER = "x-csrf-token"
SESSION_S = 8 * 3600.0
"""How long a session lasts after sign-in: a working day, then the token again."""
MAX_SESSIONS = 1000
"""Sessions kept at once; the oldest goes first (a flood of sign-ins cannot fill memory)."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Session:
    """One signed-in browser: the token it acts as, its CSRF token and when it ends."""

    token_id: int
    csrf: str
    expires_at: float
    """On the sessions' clock (wall seconds by default)."""


class Sessions:
    """The live console sessions of one server; thread-safe (routes run on threads).

    ``clock`` (seconds) and ``ttl_s`` are there for the tests of expiry, which move a
    clock instead of waiting.
    """

    def __init__(self, *, ttl_s: float = SESSION_S, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._by_hash: dict[str, Session] = {}

    def create(self, token: ApiToken) -> tuple[str, Session]:
        """A new session for ``token``: the cookie's value (shown only now) and the session."""
        session_id = secrets.token_urlsafe(32)
        session = Session(token.id, secrets.token_urlsafe(32), self._clock() + self.ttl_s)
        with self._lock:
            self._drop_expired()
            while len(self._by_hash) >= MAX_SESSIONS:
                del self._by_hash[next(iter(self._by_hash))]
            self._by_hash[_hash(session_id)] = session
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        """The live session of this cookie value, or None (unknown, ended or expired)."""
        key = _hash(session_id)
        with self._lock:
            session = self._by_hash.get(key)
            if session is not None and session.expires_at <= self._clock():
                del self._by_hash[key]
                return None
            return session

    def end(self, session_id: str) -> bool:
        """End the session server-side (sign-out); False if there was none."""
        with self._lock:
            return self._by_hash.pop(_hash(session_id), None) is not None

    def end_token(self, token_id: int) -> int:
        """End every session of ``token_id`` (its token was revoked); how many."""
        with self._lock:
            gone = [k for k, s in self._by_hash.items() if s.token_id == token_id]
            for key in gone:
                del self._by_hash[key]
        return len(gone)

    def _drop_expired(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._by_hash.items() if s.expires_at <= now]:
            del self._by_hash[key]


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


def sessions_of(request: Request) -> Sessions | None:
    """The app's sessions (None for an app made without the console)."""
    sessions: Sessions | None = getattr(request.app.state, "console_sessions", None)
    return sessions


def own_origin(request: Request) -> str:
    """``scheme://host[:port]`` of the server as this request reached it."""
    host = request.headers.get("host", "")
    return f"{request.url.scheme}://{host}"


def check_same_site(request: Request) -> None:
    """A 403 when the browser says the request came from another site (W2).

    ``Origin`` must be this server's own when sent (every browser sends it on a POST);
    ``Sec-Fetch-Site`` must be ``same-origin`` or ``none`` when sent.
    """
    origin = request.headers.get("origin")
    if origin is not None and origin != own_origin(request):
        raise ApiError(403, "a request from another origin is refused", field="header.origin")
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise ApiError(403, "a cross-site request is refused", field="header.sec-fetch-site")


def check_csrf(request: Request, session: Session) -> None:
    """A 403 unless this write carries the session's CSRF token and came from this site."""
    check_same_site(request)
    sent = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode("utf-8", "replace"), session.csrf.encode("utf-8")):
        raise ApiError(403, "missing or wrong CSRF token", field="header.x-csrf-token")


def current_session(request: Request) -> tuple[str, Session] | None:
    """The request's cookie value and live session, or None when it has neither."""
    sessions = sessions_of(request)
    session_id = request.cookies.get(COOKIE)
    if sessions is None or not session_id:
        return None
    session = sessions.get(session_id)
    return None if session is None else (session_id, session)


def session_token(request: Request) -> ApiToken | None:
    """The operator token a console session acts as, or None when the request has no
    session cookie. A cookie of no live session is a 401; a write without the session's
    CSRF token, or from another site, a 403; a token revoked, or no longer the operator's,
    since sign-in ends the session (401)."""
    if sessions_of(request) is None or COOKIE not in request.cookies:
        return None
    found = current_session(request)
    if found is None:
        raise ApiError(401, "no console session (expired or signed out)", field="cookie")
    session_id, session = found
    if request.method not in SAFE_METHODS:
        check_csrf(request, session)
    token = live_token(request, session.token_id)
    if token is None or not token.operator:
        sessions = sessions_of(request)
        if sessions is not None:
            sessions.end(session_id)
        raise ApiError(401, "the session's token was revoked; sign in again", field="cookie")
    return token


def live_token(request: Request, token_id: int) -> ApiToken | None:
    """The live (unrevoked) token ``token_id`` of the server's home, or None."""
    from fermix.api import Memory

    memory: Memory = request.app.state.memory
    return next((t for t in memory.tokens.list() if t.id == token_id), None)
