"""Parrot's one exception hierarchy: every error a client can receive over HTTP, with its
status and stable ``code``, defined once here for both sides.

The server raises these classes (:mod:`parrot.engines.protocol.errors` and
:mod:`parrot.platform.serve.errors` only import them), and
:mod:`parrot.engines.protocol.error_responses` turns any of them into the body
``{"error": {"code", "message"}}`` (:class:`ErrorResponse`) in one place. A client turns
such a response back into the same class with :func:`error_for` (the SDK; the ServeCore
too, for its engines' answers), looking the class up by its code in a registry built from
this module, so the two sides cannot drift.

Rules the tests check: a subclass answers its base's status (all 400s are
:class:`BadRequestError`s, all 503s :class:`ServiceUnavailableError`s, ...), except the
direct children of :class:`ParrotError`; each code belongs to one class.
"""

from __future__ import annotations

import msgspec


class ErrorBody(msgspec.Struct, kw_only=True):
    code: str
    message: str


class ErrorResponse(msgspec.Struct, kw_only=True):
    """The body of every error answer of Parrot's servers."""

    error: ErrorBody


class ParrotError(Exception):
    """Base of all Parrot errors. ``str(error)`` (and ``message``) is the message a client
    is shown.

    ``status_code`` and ``code`` say what the error answers over HTTP (a class's own; an
    error rebuilt from a response keeps the ones it came with). ``status`` is the status of
    the response it came from, None for an error raised in this process."""

    status_code: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        if status is not None:
            self.status_code = status  # what it answers, as it came
        if code is not None:
            self.code = code


# -- 400 ------------------------------------------------------------------------------------
class BadRequestError(ParrotError):
    """The request is malformed or not allowed (a value out of range, a variable that
    already has one, ...); the message says what is wrong."""

    status_code = 400
    code = "bad_request"


class InvalidRequestError(BadRequestError):
    """The body or the query parameters do not have the route's types and bounds."""

    code = "invalid_request"


class InvalidJsonError(BadRequestError):
    """The request body is not JSON that can be read: malformed, nested too deeply, or not UTF-8."""

    code = "invalid_json"


class TemplateError(BadRequestError):
    """A semantic call's template or its parameters do not fit together
    (:mod:`parrot.wire.template`, which the client checks before it sends and the server
    when it receives).

    ``position`` is the character offset in the template the problem is at (or None when
    it is about the parameter list)."""

    code = "bad_template"

    def __init__(
        self, message: str, position: int | None = None, *, status: int | None = None, code: str | None = None
    ) -> None:
        where = "" if position is None else f" (at character {position})"
        super().__init__(message + where, status, code)
        self.position = position


class TransformError(BadRequestError):
    """A native string transform is malformed, or cannot be applied to its inputs."""

    code = "transform_error"


class FormatMismatchError(BadRequestError):
    """A value a client sets does not match its variable's format."""

    code = "format_mismatch"


class BadFormatError(BadRequestError):
    """An output format (issue 21) the grammar library rejects: an invalid JSON schema, an
    unsupported keyword, a regex or Lark grammar that does not compile, or a compile that
    took too long. The message is the library's own, naming the problem."""

    code = "bad_format"


class PromptTooLongError(BadRequestError):
    code = "prompt_too_long"


class CapacityError(BadRequestError):
    """The request can never fit: more KV than the whole cache holds."""

    code = "kv_capacity_exceeded"


class InvalidTokenError(BadRequestError):
    code = "invalid_token"


# -- 401, 403 -------------------------------------------------------------------------------
class AuthError(ParrotError):
    """A session's ``session_auth``, the admin token or an API key is missing or wrong
    (a base to catch both; never raised itself)."""


class UnauthorizedError(AuthError):
    """401: no credentials were sent (``Authorization: Bearer <token>``)."""

    status_code = 401
    code = "unauthorized"


class ForbiddenError(AuthError):
    """403: the credentials sent are not the right ones."""

    status_code = 403
    code = "forbidden"


# -- 404 ------------------------------------------------------------------------------------
class NotFoundError(ParrotError):
    """No such session, variable, call, engine or route."""

    status_code = 404
    code = "not_found"


class SessionClosedError(NotFoundError):
    """The session was deleted (or expired) while the request waited on it."""

    code = "session_closed"


class UnknownModelError(NotFoundError):
    """A call names only models that no registered engine serves (a client error, as the
    OpenAI front's unknown ``model`` is; 503 is for engines that exist but are down)."""

    code = "unknown_model"


class UnknownContextError(NotFoundError):
    code = "unknown_context"


# -- other 4xx ------------------------------------------------------------------------------
class MethodNotAllowedError(ParrotError):
    status_code = 405
    code = "method_not_allowed"


class WaitTimeoutError(ParrotError, TimeoutError):
    """A get saw no value in time (the value may still come: get again)."""

    status_code = 408
    code = "timeout"


class ConflictError(ParrotError):
    """The request contradicts the server's state (an engine registered twice, ...)."""

    status_code = 409
    code = "conflict"


class GraphError(ConflictError):
    """A semantic call would break the session's DAG (a cycle, a second producer of one
    variable)."""

    code = "graph_conflict"


class ContextConflictError(ConflictError):
    code = "context_conflict"


class ContextFreedError(ConflictError):
    """A job's context (or the parent it forks from) was freed before the job ran."""

    code = "context_freed"


class AbortedError(ConflictError):
    """The job was aborted (its context was aborted or freed, or its client went away)."""

    code = "aborted"


class PayloadTooLargeError(ParrotError):
    """A request body, a value, a prompt or a format is over one of the server's limits (the
    message names it and its value). Not a :class:`BadRequestError`: the request is well
    formed, only too large, and a client sends less rather than something else."""

    status_code = 413
    code = "payload_too_large"


class FormatTooLargeError(PayloadTooLargeError):
    """An output format larger than the configured limit (the message names it and its flag)."""

    code = "format_too_large"


class UnsupportedMediaTypeError(ParrotError):
    """A JSON route got a body whose Content-Type is not JSON."""

    status_code = 415
    code = "unsupported_media_type"


class ProducerFailedError(ParrotError):
    """The variable will never get a value: the call that produces it (or one it depends
    on) failed; the message says why."""

    status_code = 424
    code = "producer_failed"


class TooManyRequestsError(ParrotError):
    """A count limit of the server is reached (sessions per client, variables or calls per
    session, pending calls); the message names the limit and its value. Retry later, or
    free what you no longer use."""

    status_code = 429
    code = "too_many_requests"


class ClientGoneError(ParrotError):
    """The client went away before the answer was ready (nobody reads this response)."""

    status_code = 499
    code = "client_closed_request"


# -- 5xx ------------------------------------------------------------------------------------
class ModelLoadError(ParrotError):
    code = "model_load_error"


class SchemaUnmetError(BadRequestError):
    """A whole answer breaks its JSON schema where decoding could not enforce it (``oneOf``
    taken as ``anyOf``, ``uniqueItems``, ``not``, ...: checked at the end); 422, the status
    of a request that is well-formed but could not be carried out."""

    status_code = 422
    code = "schema_unmet"


class ConstraintError(ParrotError):
    """The grammar refused a token that its own mask allowed (a bug, not the client's)."""

    code = "constraint_error"


class BadEngineAnswerError(ParrotError):
    """An engine answered in a way the protocol does not allow (an OpenAI-compatible
    endpoint that does not stream): running the request again would answer the same."""

    status_code = 502
    code = "bad_engine_answer"


class ServiceUnavailableError(ParrotError):
    """The server cannot do it now (no engine, the database): retry later."""

    status_code = 503
    code = "service_unavailable"


class EngineUnavailableError(ServiceUnavailableError):
    """An engine could not be reached (connection refused, timed out, died mid-request)."""

    code = "engine_unavailable"


class NoEngineError(EngineUnavailableError):
    """No engine is registered to run the call."""

    code = "no_engine"


class EngineShutdownError(ServiceUnavailableError):
    """The engine is stopping, or stopped after an internal error in a step."""

    code = "engine_shutdown"


class EngineLoadingError(ServiceUnavailableError):
    """The engine is still loading its model (a first start converts it): retry soon."""

    code = "engine_loading"


class StoreError(ServiceUnavailableError):
    """The database did not take a write: nothing that depends on it was acknowledged."""

    code = "store_unavailable"


class InsufficientStorageError(ParrotError):
    """The values held by the whole server reached their bound (``max_value_bytes``)."""

    status_code = 507
    code = "insufficient_storage"


def _registries() -> tuple[dict[str, type[ParrotError]], dict[int, type[ParrotError]]]:
    """Each code's class, and each status's base class (the first class of a status defined
    here: bases come before their subclasses), over the classes of this module that declare
    a code."""
    by_code: dict[str, type[ParrotError]] = {}
    by_status: dict[int, type[ParrotError]] = {422: BadRequestError}  # 422: a proxy's validation error
    for cls in list(globals().values()):
        if not (isinstance(cls, type) and issubclass(cls, ParrotError) and "code" in vars(cls)):
            continue
        if cls.code in by_code:
            raise TypeError(f"code {cls.code!r} of {cls.__name__} is {by_code[cls.code].__name__}'s already")
        by_code[cls.code] = cls
        by_status.setdefault(cls.status_code, cls)
    return by_code, by_status


BY_CODE, BY_STATUS = _registries()


def error_for(status: int, code: str | None, message: str) -> ParrotError:
    """The error an answer ``{"error": {"code", "message"}}`` with this status stands for:
    the class of its code (when that class answers this status), else the base class of its
    status, else :class:`ParrotError`; it keeps the status and code it came with."""
    cls = BY_CODE.get(code or "")
    if cls is None or cls.status_code != status:
        cls = BY_STATUS.get(status, ParrotError)
    return cls(message, status=status, code=code)
