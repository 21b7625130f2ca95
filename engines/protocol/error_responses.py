"""The one place where exceptions become HTTP responses (for every Litestar app of Parrot).

Every answer's status and code is one of :mod:`parrot.wire.errors`'s classes (Litestar's own
exceptions are answered as the class of their status), so a client maps it back with
:func:`parrot.wire.errors.error_for`.
"""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import ExceptionHandlersMap

from parrot.wire.errors import (
    BY_STATUS,
    ErrorBody,
    ErrorResponse,
    InvalidRequestError,
    ParrotError,
    PayloadTooLargeError,
)

log = logging.getLogger(__name__)


def error_response(error: ParrotError) -> Response[ErrorResponse]:
    body = ErrorResponse(error=ErrorBody(code=error.code, message=str(error)))
    return Response(body, status_code=error.status_code)


def _parrot_error(_: Request, exc: ParrotError) -> Response:
    if exc.status_code >= 500:
        log.error("server error: %s", exc)
    return error_response(exc)


def _validation_error(_: Request, exc: ValidationException) -> Response:
    details = []
    for item in exc.extra or []:
        if isinstance(item, dict):
            where = item.get("key") or item.get("source") or ""
            details.append(f"{item.get('message', '')}{f' ({where})' if where else ''}")
    message = "; ".join(d for d in details if d) or str(exc.detail)
    return error_response(InvalidRequestError(f"invalid request: {message}"))


def _msgspec_error(_: Request, exc: msgspec.ValidationError) -> Response:
    return error_response(InvalidRequestError(f"invalid request: {exc}"))


def _http_error(_: Request, exc: HTTPException) -> Response:
    # Litestar's 404 (no route), 405, 401/403 of its guards: the class of their status; a
    # status no class has keeps its own with the code "http_error".
    known = BY_STATUS.get(exc.status_code)
    if known is None:
        return error_response(ParrotError(str(exc.detail), status=exc.status_code, code="http_error"))
    return error_response(known(str(exc.detail)))


def body_too_large(limit: int | None) -> PayloadTooLargeError:
    """A body over the app's (or the route's) ``request_max_body_size``, named so that a
    client knows what to send instead."""
    message = f"the request body is larger than the limit max_body_bytes = {limit} bytes (--max-body-bytes)"
    return PayloadTooLargeError(message)


def _body_too_large(request: Request, _: RequestEntityTooLarge) -> Response:
    return error_response(body_too_large(request.route_handler.resolve_request_max_body_size()))


def _unexpected(_: Request, exc: Exception) -> Response:
    log.exception("unexpected error", exc_info=exc)
    return error_response(ParrotError("internal server error"))


def exception_handlers() -> ExceptionHandlersMap:
    return {
        ParrotError: _parrot_error,
        ValidationException: _validation_error,
        msgspec.ValidationError: _msgspec_error,
        RequestEntityTooLarge: _body_too_large,
        HTTPException: _http_error,
        Exception: _unexpected,
    }
