"""Who may call what, as Litestar guards and dependencies (never checks inside handlers):

- ``admin_guard``: routes that change or show every session's engines need the admin token;
- ``openai_key_guard``: the OpenAI front needs one of its API keys, when any is configured;
- ``sessions`` (a dependency, :mod:`parrot.platform.api.deps`): a :class:`SessionAccess`
  bound to the request's bearer token, which opens a session only for the holder of its
  ``session_auth``.

Failures raise the shared error classes (401 without a token, 403 with a wrong one, 429 while
repeated wrong admin tokens from one address are slowed down), which
the one exception translator turns into JSON.
"""

from __future__ import annotations

import hmac
import math
from dataclasses import dataclass

from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.handlers.base import BaseRouteHandler

from parrot.engines.protocol.errors import TooManyRequestsError
from parrot.platform.api.token_throttle import TokenThrottle
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import ForbiddenError, UnauthorizedError
from parrot.platform.serve.sessions.session import Session


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


def client_address(connection: ASGIConnection) -> str:
    return connection.client.host if connection.client else "unknown"


def check_admin_token(connection: ASGIConnection, token: str) -> bool:
    """Whether ``token`` is the admin token, with repeated failures from one address slowed
    down (:class:`TokenThrottle`): inside a wait the token is not even compared (429)."""
    throttle: TokenThrottle = connection.app.state.token_throttle
    client = client_address(connection)
    wait = throttle.retry_after(client)
    if wait > 0:
        raise TooManyRequestsError(
            f"too many wrong admin tokens from {client}: try again in {math.ceil(wait)} s"
        )
    if same_secret(token, connection.app.state.admin_token):
        throttle.succeeded(client)
        return True
    throttle.failed(client)
    return False


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    token = bearer_token(connection)
    if not token:
        raise UnauthorizedError("this route needs 'Authorization: Bearer <admin token>'")
    if not check_admin_token(connection, token):
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
