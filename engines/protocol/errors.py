"""The errors of the engine layer, under the names its modules import them by.

Every class is defined once in the wire contract (:mod:`parrot.wire.errors`), with its HTTP
status and stable ``code``, so a client (the SDK; the ServeCore reading an engine's answer
with :func:`parrot.wire.errors.error_for`) rebuilds the very class the engine raised;
:mod:`parrot.engines.protocol.error_responses` turns them into JSON responses in one place.
Anything else that escapes is a bug and becomes a 500 without a traceback in the response.
"""

from parrot.wire.errors import (
    AbortedError,
    BadEngineAnswerError,
    BadFormatError,
    BadRequestError,
    CapacityError,
    ClientGoneError,
    ConflictError,
    ContextConflictError,
    ContextFreedError,
    EngineLoadingError,
    EngineShutdownError,
    EngineUnavailableError,
    FormatTooLargeError,
    InvalidJsonError,
    InvalidTokenError,
    ModelLoadError,
    NotFoundError,
    ParrotError,
    PayloadTooLargeError,
    PromptTooLongError,
    SchemaUnmetError,
    TooManyRequestsError,
    UnknownContextError,
    UnsupportedMediaTypeError,
)

__all__ = [
    "AbortedError",
    "BadEngineAnswerError",
    "BadFormatError",
    "BadRequestError",
    "CapacityError",
    "ClientGoneError",
    "ConflictError",
    "ContextConflictError",
    "ContextFreedError",
    "EngineLoadingError",
    "EngineShutdownError",
    "EngineUnavailableError",
    "FormatTooLargeError",
    "InvalidJsonError",
    "InvalidTokenError",
    "ModelLoadError",
    "NotFoundError",
    "ParrotError",
    "PayloadTooLargeError",
    "PromptTooLongError",
    "SchemaUnmetError",
    "TooManyRequestsError",
    "UnknownContextError",
    "UnsupportedMediaTypeError",
]
