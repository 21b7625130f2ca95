"""Errors of the serve layer: what a client of the Parrot API can get wrong, or run into.

They extend the one hierarchy of :mod:`parrot.engines.protocol.errors` (each carries its
HTTP status and a stable ``code``), so the same single translator turns them into JSON
responses; the classes that only the serve layer raises live here (a template's
``TemplateError`` is the wire contract's, :mod:`parrot.wire.template`).
"""

from __future__ import annotations

from parrot.engines.protocol.errors import BadRequestError, ConflictError, NotFoundError, ParrotError


class GraphError(ConflictError):
    """A semantic call would break the session's DAG (a cycle, a second producer)."""

    code = "graph_conflict"


class TransformError(BadRequestError):
    """A native string transform is malformed, or cannot be applied to its inputs."""

    code = "transform_error"


class ProducerFailedError(ParrotError):
    """A variable will never get a value: the call that produces it (or one it needs) failed."""

    status_code = 424
    code = "producer_failed"


class SessionClosedError(NotFoundError):
    """The session was deleted (or expired) while the request waited on it."""

    code = "session_closed"


class NoEngineError(ParrotError):
    status_code = 503
    code = "no_engine"


class UnknownModelError(NotFoundError):
    """A call names only models that no registered engine serves (a client error, as the
    OpenAI front's unknown ``model`` is; 503 is for engines that exist but are down)."""

    code = "unknown_model"


class StoreError(ParrotError):
    """The database did not take a write: nothing that depends on it was acknowledged."""

    status_code = 503
    code = "store_unavailable"


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


class FormatMismatchError(BadRequestError):
    """A value a client sets does not match its variable's format."""

    code = "format_mismatch"


class InsufficientStorageError(ParrotError):
    """The values held by the whole server reached their bound (``max_value_bytes``)."""

    status_code = 507
    code = "insufficient_storage"
