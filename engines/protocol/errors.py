"""The one exception hierarchy of Parrot.

Every error a client can cause is a :class:`ParrotError` subclass that carries its HTTP
status and a stable ``code``; :mod:`parrot.engines.protocol.http` turns them into JSON
responses in one place. Anything else that escapes is a bug and becomes a 500 without a
traceback in the response.
"""


class ParrotError(Exception):
    """Base of all Parrot errors. ``str(error)`` is the message shown to the client."""

    status_code = 500
    code = "internal_error"


class BadRequestError(ParrotError):
    status_code = 400
    code = "bad_request"


class NotFoundError(ParrotError):
    status_code = 404
    code = "not_found"


class ConflictError(ParrotError):
    status_code = 409
    code = "conflict"


class UnknownContextError(NotFoundError):
    code = "unknown_context"


class ContextConflictError(ConflictError):
    code = "context_conflict"


class PromptTooLongError(BadRequestError):
    code = "prompt_too_long"


class CapacityError(BadRequestError):
    """The request can never fit: more KV than the whole cache holds."""

    code = "kv_capacity_exceeded"


class InvalidTokenError(BadRequestError):
    code = "invalid_token"


class ContextFreedError(ConflictError):
    """A job's context (or the parent it forks from) was freed before the job ran."""

    code = "context_freed"


class AbortedError(ConflictError):
    """The job was aborted (its context was aborted or freed, or its client went away)."""

    code = "aborted"


class EngineShutdownError(ParrotError):
    status_code = 503
    code = "engine_shutdown"


class ModelLoadError(ParrotError):
    status_code = 500
    code = "model_load_error"


class TemplateError(BadRequestError):
    """A semantic call's template or its parameters do not fit together.

    ``position`` is the character offset in the template the problem is at (or None when
    it is about the parameter list)."""

    code = "bad_template"

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message if position is None else f"{message} (at character {position})")
        self.position = position


class GraphError(ConflictError):
    """A semantic call would break the session's DAG (a cycle, a second producer)."""

    code = "graph_conflict"


class EngineUnavailableError(ParrotError):
    """An engine could not be reached (connection refused, timed out, died mid-request)."""

    status_code = 503
    code = "engine_unavailable"


def error_from_response(status: int, code: str, message: str) -> ParrotError:
    """Rebuild the error an engine reported, so callers see the same class it raised."""
    for cls in _all_subclasses(ParrotError):
        if cls.code == code and cls.status_code == status and cls is not TemplateError:
            return cls(message)
    fallback = {400: BadRequestError, 404: NotFoundError, 409: ConflictError}.get(status, ParrotError)
    error = fallback(message)
    error.status_code = status
    return error


def _all_subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


class TransformError(BadRequestError):
    """A native string transform is malformed, or cannot be applied to its inputs."""

    code = "transform_error"


class ProducerFailedError(ParrotError):
    """A variable will never get a value: the call that produces it (or one it needs) failed."""

    status_code = 424
    code = "producer_failed"


class NoEngineError(ParrotError):
    status_code = 503
    code = "no_engine"


class UnauthorizedError(ParrotError):
    status_code = 401
    code = "unauthorized"


class ForbiddenError(ParrotError):
    status_code = 403
    code = "forbidden"


class WaitTimeoutError(ParrotError):
    """A get did not see a value in time (the value may still come)."""

    status_code = 408
    code = "timeout"
