"""Who may call what, as Litestar guards and dependencies (never checks inside handlers):

- ``admin_guard``: routes that change or show every session's engines need the admin token;
- ``openai_key_guard``: the OpenAI front needs one of its API keys, when any is configured;
- ``sessions`` (a dependency, :mod:`parrot.platform.api.deps`): a :class:`SessionAccess`
  bound to the request's bearer token, which opens a session only for the holder of its
  ``session_auth``.

Failures raise the shared error classes (401 without a token, 403 with a wrong one), which
the one exception translator turns into JSON.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.handlers.base import BaseRouteHandler

from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import ForbiddenError, UnauthorizedError
from parrot.platform.serve.session_service import Session


def bearer_token(connection: ASGIConnection) -> str | None:
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def same_secret(sent: str, secret: str) -> bool:
    """Whether ``sent`` (a header's value) is ``secret``, compared in constant time as bytes:
    ``hmac.compare_digest`` on ``str`` raises TypeError for non-ASCII text. Header bytes
    reach us decoded as latin-1, so encoding back gives the bytes sent, which match a
    non-ASCII secret as its UTF-8 (``surrogateescape``: a secret from the command line or
    the environment holds the bytes that are not UTF-8 as surrogate escapes)."""
    try:
        wire = sent.encode("latin-1")
    except UnicodeEncodeError:  # not from a header: compare its UTF-8
        wire = sent.encode(errors="surrogatepass")
    try:
        expected = secret.encode(errors="surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no argv or environment gives
        expected = secret.encode(errors="surrogatepass")
    return hmac.compare_digest(wire, expected)


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    token = bearer_token(connection)
    if not token:
        raise UnauthorizedError("this route needs 'Authorization: Bearer <admin token>'")
    if not same_secret(token, connection.app.state.admin_token):
        raise ForbiddenError("wrong admin token")


def openai_key_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    keys: tuple[str, ...] = connection.app.state.openai_api_keys
    if not keys:
        return
    token = bearer_token(connection)
    if not token:
        raise UnauthorizedError("this API needs 'Authorization: Bearer <api key>'")
    if not any(same_secret(token, key) for key in keys):
        raise ForbiddenError("unknown API key")


@dataclass(frozen=True)
class SessionAccess:
    """Opens sessions with the request's ``session_auth`` (raises 401 / 403 / 404)."""

    core: ServeCore
    token: str | None

    def __call__(self, session_id: str) -> Session:
        return self.core.sessions.open(session_id, self.token)


Sessions = NamedDependency[SessionAccess]  # a handler's ``sessions`` parameter
