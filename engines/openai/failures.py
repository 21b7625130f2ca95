"""What a failed request to the endpoint means for Parrot.

Availability problems (no connection, timeouts, 408 / 429 / 5xx, a rejected API key with
401 / 403, an answer that is not an OpenAI response) become
:class:`EngineUnavailableError`, so the ServeCore reschedules the task on another engine
and marks this one down; they are *hard* (the engine reports itself unhealthy) once they
are final. Other 4xx answers are problems of the request and become the matching
:class:`ParrotError` with the endpoint's message (400 / 422 -> BadRequestError, a context
length error -> PromptTooLongError, 404 -> NotFoundError, 409 -> ConflictError).

Messages never contain the API key: the caller passes a ``redact`` function that every
text from the endpoint goes through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx2
import openai

from parrot.engines.protocol.errors import (
    BadRequestError,
    ConflictError,
    EngineUnavailableError,
    NotFoundError,
    ParrotError,
    PromptTooLongError,
)

AUTH_STATUS = frozenset({401, 403})
_REQUEST_ERRORS: dict[int, type[ParrotError]] = {
    404: NotFoundError,
    409: ConflictError,
    413: PromptTooLongError,
}
_LENGTH_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})


@dataclass(frozen=True)
class Failure:
    """A request that failed for good (the ``openai`` client has done its retries)."""

    error: ParrotError  # what to raise
    hard: bool = False  # an availability failure: the engine is unhealthy


def classify(error: BaseException, where: str, timeout_s: float, redact: Callable[[str], str]) -> Failure:
    """The meaning of an exception raised by the ``openai`` client (or its transport while
    a stream is read); ``where`` names the endpoint in messages."""
    if isinstance(error, openai.APITimeoutError | httpx2.TimeoutException):
        return Failure(EngineUnavailableError(f"{where} did not answer within {timeout_s:g} s"), hard=True)
    if isinstance(error, openai.APIConnectionError | httpx2.TransportError):
        cause = error.__cause__ or error
        detail = redact(str(cause) or type(cause).__name__)
        return Failure(EngineUnavailableError(f"{where} is unreachable: {detail}"), hard=True)
    if isinstance(error, openai.APIStatusError):
        return _status_failure(error, where, redact)
    detail = redact(str(error))[:300]
    return Failure(EngineUnavailableError(f"{where} answered something unexpected: {detail}"), hard=True)


def _status_failure(error: openai.APIStatusError, where: str, redact: Callable[[str], str]) -> Failure:
    status = error.status_code
    message = redact(_server_message(error.body))
    said = f"{where} answered {status}" + (f": {message}" if message else "")
    if status in AUTH_STATUS:
        return Failure(
            EngineUnavailableError(f"{where} rejected the credentials ({status}): {message}"), hard=True
        )
    if status in (408, 429) or status >= 500:
        return Failure(EngineUnavailableError(said), hard=True)
    code = getattr(error, "code", None)
    cls = PromptTooLongError if code in _LENGTH_CODES else _REQUEST_ERRORS.get(status, BadRequestError)
    return Failure(cls(said))


def _server_message(body: object) -> str:
    """The ``message`` of an OpenAI-style error body (``{"error": {"message": ...}}`` or
    the inner object), else the body itself, shortened."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"][:1000]
        if isinstance(inner, str):
            return inner[:1000]
    if body is None:
        return ""
    return str(body)[:300]
