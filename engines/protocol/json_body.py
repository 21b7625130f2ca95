"""How every Parrot app reads a JSON request body (the ServeCore's and the builtin engine's).

Litestar decodes a JSON body on the first ``request.json()`` and turns only msgspec's
``DecodeError`` into a 400 (here: ``invalid_json``, like the others); a body nested
thousands of levels deep (``RecursionError``) or with invalid UTF-8 inside a string
(``UnicodeDecodeError``) escaped as a 500. It also decoded any body as JSON whatever its
``Content-Type``: a ``text/plain`` POST is a "simple" cross-origin request that a browser
sends without a CORS preflight, so a web page could drive the API. :class:`JsonRequest`
(an app's ``request_class``) checks both, and raises errors of the one hierarchy, so the
one translator answers them with a clear 4xx.

Routes without a JSON body (the dashboard's form posts) never call ``json()``: they are
not affected.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.exceptions import SerializationException

from parrot.engines.protocol.error_responses import body_too_large
from parrot.engines.protocol.errors import BadRequestError, InvalidJsonError, UnsupportedMediaTypeError

JSON = "application/json"


def is_json_media_type(media_type: str) -> bool:
    """``application/json`` or a structured ``+json`` type (``application/merge-patch+json``)."""
    kind = media_type.strip().lower()
    return kind == JSON or (kind.startswith("application/") and kind.endswith("+json"))


class JsonRequest(Request):
    """A request whose JSON body must say it is JSON and fail cleanly when it cannot be read."""

    async def json(self) -> Any:
        media_type, _ = self.content_type
        if not is_json_media_type(media_type):
            got = f"got {media_type[:100]!r}" if media_type else "no Content-Type was given"
            raise UnsupportedMediaTypeError(
                f"this route takes a JSON body: send it with 'Content-Type: {JSON}' ({got})"
            )
        try:
            return await super().json()
        except SerializationException as error:  # malformed JSON (msgspec's DecodeError)
            if "UTF-8" in str(error.detail):  # msgspec 0.23 reports bad UTF-8 here, not as below
                raise InvalidJsonError(f"the request body is not valid UTF-8 ({error.detail})") from None
            raise InvalidJsonError(f"the request body is not valid JSON: {error.detail}") from None
        except RecursionError:
            raise InvalidJsonError("the JSON body is nested too deeply") from None
        except UnicodeDecodeError as error:
            raise InvalidJsonError(
                f"the request body is not valid UTF-8 ({error.reason} at byte {error.start})"
            ) from None


class OptionalJsonRequest(JsonRequest):
    """A request of a route whose JSON body may be left out (``POST /v1/session``): no body
    at all, whatever its headers, reads as ``null``; a body is read as any other."""

    async def json(self) -> Any:
        if not await self.body():
            return None
        return await super().json()


async def refuse_declared_oversize(request: Request) -> None:
    """An app's ``before_request``: 413 for a body whose ``Content-Length`` is over the
    route's limit, before the handler runs. Litestar applies the limit only when a handler
    reads the body, so a route that reads none (``POST /v1/session``) answered 201 to
    ``Content-Length: 999999999999`` (issue 37)."""
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.strip().isdigit():
        raise BadRequestError(f"Content-Length must be a number of bytes, got {declared[:40]!r}")
    limit = request.route_handler.resolve_request_max_body_size()
    if limit is not None and int(declared) > limit:
        raise body_too_large(limit)
