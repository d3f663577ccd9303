"""Every error the HTTP API answers, as one JSON shape; never a traceback (N2, N8).

The body is ``{"error": {"type": ..., "message": ..., "field": ...}}``: ``type`` is a
stable word a client can branch on, ``message`` says what was wrong in words, and
``field`` (where one is to blame) names it as a dotted path into the request
(``body.role``, ``query.limit``, ``path.agent_id``, ``header.authorization``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fermix.errors import (
    AccessDeniedError,
    ActorUnavailableError,
    ConflictError,
    FermixError,
    InvalidInputError,
    NotFoundError,
    StorageError,
    SupervisorEscalationError,
)

log = logging.getLogger(__name__)

_STATUS_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    """An error with its HTTP status, raised by a route or a dependency."""

    def __init__(self, status: int, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def error_body(status: int, message: str, field: str | None = None) -> dict[str, Any]:
    """The JSON body of an error answer."""
    error: dict[str, Any] = {"type": _STATUS_TYPES.get(status, "error"), "message": message}
    if field is not None:
        error["field"] = field
    return {"error": error}


def error_response(
    status: int, message: str, *, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An error answer."""
    return JSONResponse(error_body(status, message, field), status_code=status, headers=headers)


def status_of(exc: FermixError) -> int:
    """The HTTP status of a fermix error."""
    if isinstance(exc, InvalidInputError):
        return 422
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, AccessDeniedError):
        return 403
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, ActorUnavailableError | SupervisorEscalationError | StorageError):
        return 503
    return 500


def _field(loc: Any) -> str:
    return ".".join(str(part) for part in loc)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as JSON."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        if exc.status >= 500:
            record(request, exc.status, exc.message)
        return error_response(exc.status, exc.message, field=exc.field, headers=headers)

    @app.exception_handler(FermixError)
    async def fermix_error(request: Request, exc: FermixError) -> JSONResponse:
        status = status_of(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
            record(request, status, f"{type(exc).__name__}: {exc}")
            return error_response(status, _public_message(status, exc))
        return error_response(status, str(exc), field=getattr(exc, "field", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        first = problems[0] if problems else {"loc": (), "msg": "invalid request"}
        field = _field(first.get("loc", ()))
        message = f"{field or 'request'}: {first.get('msg', 'invalid')}"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more)"
        return error_response(422, message, field=field or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code >= 500:
            record(request, exc.status_code, str(exc.detail))
        if exc.status_code == 413:
            limit = request.scope.get("fermix.max_body_bytes")
            return error_response(
                413, f"request body over the limit of {limit} bytes", field="body"
            )
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Logged whole for the operator; the client learns only that it failed.
        log.exception("%s %s failed", request.method, request.url.path)
        record(request, 500, f"{type(exc).__name__}: {exc}")
        return error_response(500, "internal error; the server's log has the details")


def record(request: Request, status: int, message: str) -> None:
    """Remember a 5xx answer for ``fermix server status`` (N7): the route's template
    (``POST /v1/conversations/{handle}/messages``, not the handle itself) and the status
    with the error's type and message, never a traceback."""
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is None:  # an app made without create_app: nothing to record into
        return
    metrics.error(f"{request.method} {_template(request)}", f"{status} {message}")


def _template(request: Request) -> str:
    """The request's path with each path parameter put back as ``{name}``: what route
    failed, without the handle or id it was called with."""
    names = {str(value): name for name, value in request.path_params.items()}
    return "/".join(
        f"{{{names[part]}}}" if part in names else part for part in request.url.path.split("/")
    )


def _public_message(status: int, exc: FermixError) -> str:
    if status == 503:
        return f"the memory is unavailable right now: {type(exc).__name__}; retry later"
    return "internal error; the server's log has the details"
