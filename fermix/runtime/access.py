"""Bearer tokens of the memory server: made, checked, listed and revoked here (N2).

A token's secret is ``fmx_`` and 43 characters of ``secrets.token_urlsafe(32)`` (256 random
bits); the database keeps only its SHA-256, so a copy of ``memory.db`` grants nothing. A
plain hash is enough for a secret of that entropy (a slow password hash guards guessable
secrets; nobody guesses 256 bits). A token acts for the agents it lists, and as the
operator only when it was made with ``operator``: a host's token is a guest's, whatever
owner it names.
"""

from __future__ import annotations

import hashlib
import secrets

from fermix import validate
from fermix.errors import InvalidInputError, NotFoundError
from fermix.model import ApiToken
from fermix.runtime.writer import Writer
from fermix.storage import Storage

SECRET_PREFIX = "fmx_"
_SHOWN = 12
"""Characters of a secret kept in the clear, to tell tokens apart in a listing."""
_MAX_SECRET_CHARS = 256


def secret_hash(secret: str) -> str:
    """The hex SHA-256 under which a token's secret is stored."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class Tokens:
    """The tokens of one home's database."""

    def __init__(self, db: Storage, writer: Writer) -> None:
        self._db = db
        self._writer = writer

    def create(
        self, agents: list[str] | tuple[str, ...], *, operator: bool = False, name: str = ""
    ) -> tuple[ApiToken, str]:
        """Make a token for ``agents``; returns it and its secret, which is shown only now."""
        if not agents:
            raise InvalidInputError("a token needs at least one agent (--agent ID)")
        checked = tuple(dict.fromkeys(validate.identifier("agent", a) for a in agents))
        validate.text("name", name, max_chars=200, allow_empty=True)
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        token = self._writer.write(
            lambda w: w.insert_token(
                name=name,
                prefix=secret[:_SHOWN],
                secret_sha256=secret_hash(secret),
                agents=checked,
                operator=operator,
            ),
            label="token create",
        )
        return token, secret

    def authenticate(self, secret: str) -> ApiToken | None:
        """The live token whose secret this is, or None (unknown, malformed or revoked)."""
        if not secret.startswith(SECRET_PREFIX) or len(secret) > _MAX_SECRET_CHARS:
            return None
        with self._db.read() as reads:
            return reads.token_by_secret(secret_hash(secret))

    def list(self, *, include_revoked: bool = False) -> list[ApiToken]:
        """The tokens, oldest first (revoked ones only with ``include_revoked``)."""
        with self._db.read() as reads:
            return reads.tokens(include_revoked=include_revoked)

    def revoke(self, token_id: int) -> ApiToken:
        """Revoke ``token_id``: from the next request on, it is refused (a 401)."""
        token = self._writer.write(lambda w: w.revoke_token(token_id), label="token revoke")
        if token is None:
            raise NotFoundError(f"no token with id {token_id}")
        return token
