"""Exceptions of the Parrot SDK, one class per kind of failure a caller handles differently.

The classes of server errors are the wire contract's (:mod:`parrot.wire.errors`), the same
classes the server raises: a server error response ``{"error": {"code", "message"}}``
becomes the class of its code (else of its status) with :func:`error_for`, in one place
(:mod:`parrot.sdk.http`); ``str(error)`` is the server's message, ``status`` and ``code``
what the server answered. An error raised in this process (a semantic function's
definition, an unreachable server, a check before sending) has ``status`` None.

The main ones: :class:`BadRequestError` (400; :class:`TemplateError` for a template and
its parameters), :class:`AuthError` (:class:`UnauthorizedError` 401,
:class:`ForbiddenError` 403), :class:`NotFoundError` (404), :class:`WaitTimeoutError`
(408, also a ``TimeoutError``), :class:`ConflictError` (409; :class:`GraphError` for the
session's DAG), :class:`PayloadTooLargeError` (413: over a size limit of the server, not a
bad request), :class:`ProducerFailedError` (424), :class:`TooManyRequestsError` (429),
:class:`ServiceUnavailableError` (503; :class:`EngineUnavailableError` when no engine can
do the work).
"""

from __future__ import annotations

from parrot.wire.errors import (
    AuthError,
    BadRequestError,
    ConflictError,
    EngineUnavailableError,
    ForbiddenError,
    GraphError,
    NotFoundError,
    ParrotError,
    PayloadTooLargeError,
    ProducerFailedError,
    ServiceUnavailableError,
    TemplateError,
    TooManyRequestsError,
    UnauthorizedError,
    WaitTimeoutError,
    error_for,
)

__all__ = [
    "AuthError",
    "BadRequestError",
    "ConflictError",
    "DefinitionError",
    "EngineUnavailableError",
    "ForbiddenError",
    "GraphError",
    "NotFoundError",
    "ParrotError",
    "PayloadTooLargeError",
    "ProducerFailedError",
    "ServerUnreachableError",
    "ServiceUnavailableError",
    "TemplateError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "WaitTimeoutError",
    "error_for",
]


class DefinitionError(TemplateError):
    """A semantic function is defined wrongly; raised at decoration time, nothing is sent."""


class ServerUnreachableError(ParrotError, ConnectionError):
    """The Parrot server could not be reached (no response at all). No server sends it:
    it has no status and no code."""

    code = None  # type: ignore[assignment]
