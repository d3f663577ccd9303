"""``GET /metrics``: the memory's Prometheus registry, for a scraper (O1).

The body is prometheus_client's text format of ``Memory.metrics``. Least privilege: an
operator token may read it, and so may the scrape token whose SHA-256 is
``[fermix_core.server] metrics_token_sha256``, which reads nothing else (every other route
refuses it as an unknown token). A host token is a 403; no token, or an unknown one, a 401,
as JSON as every error.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import APIRouter, Request, Response

from fermix.api import Memory
from fermix.server.http.errors import ApiError

router = APIRouter()


def check_scraper(memory: Memory, header: str | None) -> None:
    """Let an operator token or the scrape token through; else the 401 or 403 it earns."""
    if header is None:
        raise ApiError(401, "missing Authorization: Bearer <token>", field="header.authorization")
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise ApiError(401, "Authorization must be 'Bearer <token>'", field="header.authorization")
    expected = memory.config.server.metrics_token_sha256
    if expected is not None:
        given = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()
        if hmac.compare_digest(given, expected):
            return
    token = memory.tokens.authenticate(secret)
    if token is None:
        raise ApiError(401, "unknown or revoked token", field="header.authorization")
    if not token.operator:
        raise ApiError(
            403,
            "metrics need an operator token or the scrape token"
            " ([fermix_core.server] metrics_token_sha256)",
            field="header.authorization",
        )


@router.get("/metrics", tags=["server"], response_class=Response)
def metrics(request: Request) -> Response:
    """The memory's metrics in the Prometheus text format (operator or scrape token)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    memory: Memory = request.app.state.memory
    check_scraper(memory, request.headers.get("authorization"))
    return Response(content=generate_latest(memory.metrics), media_type=CONTENT_TYPE_LATEST)
