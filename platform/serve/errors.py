"""The errors of the serve layer, under the names its modules import them by.

Every class is defined once in the wire contract (:mod:`parrot.wire.errors`), with its HTTP
status and stable ``code``, so the SDK raises the very class the ServeCore raised; the
engines' errors are :mod:`parrot.engines.protocol.errors`, a template's ``TemplateError``
is :mod:`parrot.wire.template`'s.
"""

from parrot.wire.errors import (
    ForbiddenError,
    FormatMismatchError,
    GraphError,
    InsufficientStorageError,
    NoEngineError,
    ProducerFailedError,
    SessionClosedError,
    StoreError,
    TransformError,
    UnauthorizedError,
    UnknownModelError,
    WaitTimeoutError,
)

__all__ = [
    "ForbiddenError",
    "FormatMismatchError",
    "GraphError",
    "InsufficientStorageError",
    "NoEngineError",
    "ProducerFailedError",
    "SessionClosedError",
    "StoreError",
    "TransformError",
    "UnauthorizedError",
    "UnknownModelError",
    "WaitTimeoutError",
]
