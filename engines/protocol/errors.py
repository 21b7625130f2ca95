"""The one exception hierarchy of Parrot: the engines' errors.

Every error a client can cause is a :class:`ParrotError` subclass that carries its HTTP
status and a stable ``code``; the root classes are part of the wire contract
(:mod:`parrot.wire.errors`), and :mod:`parrot.engines.protocol.error_responses` turns them into JSON
responses in one place. Anything else that escapes is a bug and becomes a 500 without a
traceback in the response.
"""

from parrot.wire.errors import BadRequestError, ConflictError, NotFoundError, ParrotError


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


class ClientGoneError(ParrotError):
    """The client went away before the answer was ready (nobody reads this response)."""

    status_code = 499
    code = "client_closed_request"


class PayloadTooLargeError(ParrotError):
    """A request, a value or a prompt is larger than a configured limit (the message names it)."""

    status_code = 413
    code = "payload_too_large"


class TooManyRequestsError(ParrotError):
    """A configured count limit is reached (sessions per client, variables or calls per
    session, pending calls); the message names the limit and its value."""

    status_code = 429
    code = "too_many_requests"


class EngineShutdownError(ParrotError):
    status_code = 503
    code = "engine_shutdown"


class ModelLoadError(ParrotError):
    status_code = 500
    code = "model_load_error"


class InvalidJsonError(BadRequestError):
    """The request body is not JSON that can be read: malformed, nested too deeply, or not UTF-8."""

    code = "invalid_json"


class UnsupportedMediaTypeError(ParrotError):
    """A JSON route got a body whose Content-Type is not JSON."""

    status_code = 415
    code = "unsupported_media_type"


class EngineUnavailableError(ParrotError):
    """An engine could not be reached (connection refused, timed out, died mid-request)."""

    status_code = 503
    code = "engine_unavailable"


class BadEngineAnswerError(ParrotError):
    """An engine answered in a way the protocol does not allow (an OpenAI-compatible
    endpoint that does not stream): running the request again would answer the same."""

    status_code = 502
    code = "bad_engine_answer"


class BadFormatError(BadRequestError):
    """An output format (issue 21) the grammar library rejects: an invalid JSON schema, an
    unsupported keyword, a regex or Lark grammar that does not compile, or a compile that
    took too long. The message is the library's own, naming the problem."""

    code = "bad_format"


class FormatTooLargeError(PayloadTooLargeError):
    """An output format larger than the configured limit (the message names it and its flag)."""

    code = "format_too_large"


def error_from_response(status: int, code: str, message: str) -> ParrotError:
    """Rebuild the error an engine reported, so callers see the same class it raised."""
    for cls in _all_subclasses(ParrotError):
        if cls.code == code and cls.status_code == status:
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
