"""HTTP to the memory server: one keep-alive pool, JSON both ways, errors as fermix's (N1).

:class:`Transport` is what :class:`~fermix.remote.Client` and its mixins send through:
``request(method, path, *, json=None, params=None)`` answers the decoded JSON, or raises
the fermix error the server's error body names (422 :class:`InvalidInputError`, 404
:class:`NotFoundError`, 401/403 :class:`AccessDeniedError`, 409 :class:`ConflictError`,
503 :class:`ActorUnavailableError`), with ``status`` and ``field`` set on it.

One urllib3 pool of at most 32 kept-alive connections serves every thread of the host
(``block=True``: a 33rd concurrent request waits for a free connection rather than opening
and dropping extra ones). ``http+unix:///path/to.sock`` talks over a Unix socket.

Retries: a request that never reached the server (the connection was refused or could not
be made) and a 503 are tried again, up to ``retries`` times with a short growing pause.
A request that may have reached it (the connection broke, the answer timed out) is tried
again only when repeating it is harmless: a GET, or a request the caller marks
``idempotent`` (an append or commit carrying its client key, which the server stores
once, N3). Anything else is raised: doubling a review or a job run is not this layer's
call to make.
"""

from __future__ import annotations

import json as jsonlib
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, Final

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import (
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from fermix.errors import (
    AccessDeniedError,
    ActorUnavailableError,
    ConflictError,
    FermixError,
    InvalidInputError,
    NotFoundError,
)

API_PREFIX: Final = "/v1"
POOL_SIZE: Final = 32
RETRY_PAUSE_S: Final = 0.1
"""The first pause between tries; it doubles each time (0.1, 0.2, 0.4 s...)."""
MAX_PAUSE_S: Final = 2.0
DOWNLOAD_PIECE: Final = 64 * 1024
"""The bytes a streamed answer is copied by."""

_ERRORS: Final[dict[int, type[FermixError]]] = {
    401: AccessDeniedError,
    403: AccessDeniedError,
    404: NotFoundError,
    405: NotFoundError,
    409: ConflictError,
    413: InvalidInputError,
    422: InvalidInputError,
    503: ActorUnavailableError,
}


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status, headers (lower-case names) and decoded JSON body."""

    status: int
    headers: dict[str, str]
    data: Any


class UnixHTTPConnection(HTTPConnection):
    """An HTTP connection over a Unix socket; the pool's host is only the Host header."""

    socket_path: str = ""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise NewConnectionError(self, f"cannot connect to {self.socket_path}: {exc}") from exc
        self.sock = sock


def _unix_pool(path: str, timeout: urllib3.Timeout) -> urllib3.HTTPConnectionPool:
    connection = type("_Connection", (UnixHTTPConnection,), {"socket_path": path})
    pool = urllib3.HTTPConnectionPool(
        "localhost", maxsize=POOL_SIZE, block=True, timeout=timeout, retries=False
    )
    pool.ConnectionCls = connection
    return pool


class Transport:
    """JSON over one connection pool to the server at ``url``, with ``token``."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 3):
        if not isinstance(token, str) or not token.strip():
            raise InvalidInputError("the client needs a token (fermix token create)")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidInputError(f"retries must be a non-negative integer, not {retries!r}")
        self.url = url.rstrip("/")
        self.retries = retries
        self._timeout = urllib3.Timeout(connect=min(timeout, 10.0), read=timeout)
        self._headers = {
            "Authorization": f"Bearer {token.strip()}",
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": "fermix-client",
        }
        self._pool = self._make_pool(self.url)

    def _make_pool(self, url: str) -> urllib3.HTTPConnectionPool:
        parts = urllib.parse.urlsplit(url)
        common: dict[str, Any] = {
            "maxsize": POOL_SIZE,
            "block": True,
            "timeout": self._timeout,
            "retries": False,
        }
        if parts.scheme == "http+unix":
            path = urllib.parse.unquote(parts.path or parts.netloc)
            if not path:
                raise InvalidInputError(f"no socket path in {url!r}")
            return _unix_pool(path, self._timeout)
        if parts.scheme == "http" and parts.hostname:
            return urllib3.HTTPConnectionPool(parts.hostname, parts.port or 80, **common)
        if parts.scheme == "https" and parts.hostname:
            return urllib3.HTTPSConnectionPool(parts.hostname, parts.port or 443, **common)
        raise InvalidInputError(
            f"the server url must be http://HOST:PORT, https://... or http+unix:///PATH,"
            f" not {url!r}"
        )

    def close(self) -> None:
        """Close the pooled connections (a later request opens new ones)."""
        self._pool.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> Any:
        """Send one request; answer its decoded JSON (None for no body).

        ``path`` is the route's (``"/v1/conversations/open"``; one without the ``/v1``
        prefix gets it), its parts already quoted; ``params`` None values are left out.
        Raises the fermix error of a 4xx or 5xx.
        """
        return self.send(method, path, json=json, params=params, idempotent=idempotent).data

    def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> Answer:
        """As :meth:`request`, answering the status and headers too."""
        url = (path if path.startswith(API_PREFIX + "/") else API_PREFIX + path) + _query(params)
        body = None if json is None else jsonlib.dumps(json, ensure_ascii=False).encode()
        repeatable = method == "GET" if idempotent is None else idempotent
        attempt = 0
        while True:
            try:
                response = self._pool.urlopen(
                    method,
                    url,
                    body=body,
                    headers=self._headers,
                    retries=False,
                    redirect=False,
                    preload_content=True,
                )
            except NewConnectionError as exc:
                error: FermixError = ActorUnavailableError(
                    f"the memory server at {self.url} is not reachable: {exc}"
                )
                if attempt < self.retries:
                    attempt = self._pause(attempt)
                    continue
                raise error from exc
            except (ProtocolError, ReadTimeoutError) as exc:
                if repeatable and attempt < self.retries:
                    attempt = self._pause(attempt)
                    continue
                raise ActorUnavailableError(
                    f"{method} {path}: no answer from {self.url}: {exc}"
                ) from exc
            except HTTPError as exc:
                raise ActorUnavailableError(f"{method} {path} failed: {exc}") from exc
            answer = Answer(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                _decode(response.data),
            )
            if answer.status == 503 and attempt < self.retries:
                attempt = self._pause(attempt)
                continue
            if answer.status >= 400:
                raise error_of(answer)
            return answer

    def download(
        self, path: str, into: IO[bytes], *, params: Mapping[str, Any] | None = None
    ) -> int:
        """GET ``path`` and copy its body into ``into`` as it arrives (a streamed export);
        answer the bytes copied. Raises the fermix error of a 4xx or 5xx, before writing."""
        url = (path if path.startswith(API_PREFIX + "/") else API_PREFIX + path) + _query(params)
        try:
            response = self._pool.urlopen(
                "GET",
                url,
                headers=self._headers,
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except NewConnectionError as exc:
            raise ActorUnavailableError(
                f"the memory server at {self.url} is not reachable: {exc}"
            ) from exc
        except HTTPError as exc:
            raise ActorUnavailableError(f"GET {path} failed: {exc}") from exc
        try:
            if response.status >= 400:
                headers = {k.lower(): v for k, v in response.headers.items()}
                raise error_of(Answer(response.status, headers, _decode(response.read())))
            copied = 0
            for piece in response.stream(DOWNLOAD_PIECE):
                into.write(piece)
                copied += len(piece)
            return copied
        except (ProtocolError, ReadTimeoutError) as exc:
            raise ActorUnavailableError(f"GET {path}: the answer broke off: {exc}") from exc
        finally:
            response.release_conn()

    @staticmethod
    def _pause(attempt: int) -> int:
        # A pause between tries of a request, not a wait for another thread: the server
        # was unreachable or busy, and asking again at once would fail the same way.
        time.sleep(min(RETRY_PAUSE_S * 2**attempt, MAX_PAUSE_S))
        return attempt + 1


def error_of(answer: Answer) -> FermixError:
    """The fermix error of an error answer, with ``status`` and ``field`` set on it."""
    error = answer.data.get("error") if isinstance(answer.data, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message", "")) or f"HTTP {answer.status}"
        field = error.get("field")
    else:
        message, field = f"HTTP {answer.status}: {str(answer.data)[:200]}", None
    cls = _ERRORS.get(answer.status, FermixError)
    exc = cls(message)
    exc.status = answer.status  # type: ignore[attr-defined]
    exc.field = field if isinstance(field, str) else None  # type: ignore[attr-defined]
    return exc


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return jsonlib.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def _query(params: Mapping[str, Any] | None) -> str:
    if not params:
        return ""
    pairs = [
        (name, ("true" if value else "false") if isinstance(value, bool) else str(value))
        for name, value in params.items()
        if value is not None
    ]
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


def quote(part: str) -> str:
    """``part`` quoted as one path segment (an agent id with a ``/`` in it)."""
    return urllib.parse.quote(part, safe="")
