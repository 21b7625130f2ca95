"""The one place where exceptions become HTTP responses (for every Litestar app of Parrot)."""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import ExceptionHandlersMap

from parrot.engines.protocol.errors import ParrotError
from parrot.engines.protocol.schemas import ErrorBody, ErrorResponse

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str) -> Response[ErrorResponse]:
    return Response(ErrorResponse(error=ErrorBody(code=code, message=message)), status_code=status)


def _parrot_error(_: Request, exc: ParrotError) -> Response:
    if exc.status_code >= 500:
        log.error("server error: %s", exc)
    return error_response(exc.status_code, exc.code, str(exc))


def _validation_error(_: Request, exc: ValidationException) -> Response:
    details = []
    for item in exc.extra or []:
        if isinstance(item, dict):
            where = item.get("key") or item.get("source") or ""
            details.append(f"{item.get('message', '')}{f' ({where})' if where else ''}")
    message = "; ".join(d for d in details if d) or str(exc.detail)
    return error_response(400, "invalid_request", f"invalid request: {message}")


def _msgspec_error(_: Request, exc: msgspec.ValidationError) -> Response:
    return error_response(400, "invalid_request", f"invalid request: {exc}")


def _http_error(_: Request, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 403: "forbidden"}
    return error_response(exc.status_code, code.get(exc.status_code, "http_error"), str(exc.detail))


def _body_too_large(request: Request, _: RequestEntityTooLarge) -> Response:
    # The limit is the app's (or the route's) request_max_body_size: name it, so a client
    # knows what to send instead.
    limit = request.route_handler.resolve_request_max_body_size()
    message = f"the request body is larger than the limit max_body_bytes = {limit} bytes (--max-body-bytes)"
    return error_response(413, "payload_too_large", message)


def _unexpected(_: Request, exc: Exception) -> Response:
    log.exception("unexpected error", exc_info=exc)
    return error_response(500, "internal_error", "internal server error")


def exception_handlers() -> ExceptionHandlersMap:
    return {
        ParrotError: _parrot_error,
        ValidationException: _validation_error,
        msgspec.ValidationError: _msgspec_error,
        RequestEntityTooLarge: _body_too_large,
        HTTPException: _http_error,
        Exception: _unexpected,
    }
