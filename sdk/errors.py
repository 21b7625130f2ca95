"""Exceptions of the Parrot SDK, one class per kind of failure a caller handles differently.

A server error response ``{"error": {"code", "message"}}`` becomes the class that matches
its status (and, where one status has several meanings, its code); ``str(error)`` is the
server's message. ``status`` and ``code`` are None for errors raised in this process
(a semantic function's definition, an unreachable server).
"""

from __future__ import annotations


class ParrotError(Exception):
    """Base of every error the SDK raises."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class BadRequestError(ParrotError):
    """400: the request is malformed or not allowed (a value out of range, a var that
    already has one, a prompt too long, ...)."""


class TemplateError(BadRequestError):
    """400 ``bad_template``: a template and its parameters do not fit together."""


class DefinitionError(TemplateError):
    """A semantic function is defined wrongly; raised at decoration time, nothing is sent."""


class AuthError(ParrotError):
    """401 or 403: a session's ``session_auth`` or the admin token is missing or wrong."""


class UnauthorizedError(AuthError):
    """401: no credentials were sent."""


class ForbiddenError(AuthError):
    """403: the credentials sent are not the right ones."""


class NotFoundError(ParrotError):
    """404: no such session, variable, call or engine."""


class WaitTimeoutError(ParrotError, TimeoutError):
    """408: a get saw no value in time (it may still come: get again)."""


class ConflictError(ParrotError):
    """409: the request contradicts the server's state (an engine registered twice, ...)."""


class GraphError(ConflictError):
    """409 ``graph_conflict``: a call would break the session's DAG (a cycle, a second
    producer of one variable)."""


class ProducerFailedError(ParrotError):
    """424: the variable will never get a value, because the call that produces it (or one
    it depends on) failed; the message says why."""


class PayloadTooLargeError(BadRequestError):
    """413: a request body, a value or a prompt is over one of the server's limits (the
    message names it and its value)."""


class TooManyRequestsError(ParrotError):
    """429: a count limit of the server is reached (sessions per client, variables or calls
    per session, calls pending on the server); the message names it. Retry later, or free
    what you no longer use."""


class EngineUnavailableError(ParrotError):
    """503: no engine can do the work now."""


class ServerUnreachableError(ParrotError, ConnectionError):
    """The Parrot server could not be reached (no response at all)."""


_BY_STATUS: dict[int, type[ParrotError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    408: WaitTimeoutError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: BadRequestError,
    424: ProducerFailedError,
    429: TooManyRequestsError,
    503: EngineUnavailableError,
}
_BY_CODE: dict[str, type[ParrotError]] = {"bad_template": TemplateError, "graph_conflict": GraphError}


def error_for(status: int, code: str | None, message: str) -> ParrotError:
    """The exception for a server's error response."""
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status, ParrotError)
    return cls(message, status=status, code=code)
