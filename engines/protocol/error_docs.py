"""The error answers of Parrot's routes, as their OpenAPI schemas (``/schema``) document them.

Every error a route gives is the one body of :mod:`parrot.engines.protocol.error_responses`
(``{"error": {"code", "message"}}``), whatever its status. Litestar would document a 400
with its own ``{"status_code", "detail"}`` body, which Parrot never sends; a route's
``responses=error_responses(...)`` replaces it and names the other statuses the route can
give, so clients (and the fuzz suite, which checks answers against the schema) know them.
"""

from __future__ import annotations

from litestar.openapi.datastructures import ResponseSpec

from parrot.wire.errors import ErrorResponse

_WHY: dict[int, str] = {
    400: "The request is malformed or invalid; the message says what is wrong.",
    401: "Credentials are missing: send 'Authorization: Bearer <token>'.",
    403: "The credentials sent do not grant this.",
    404: "What the request names does not exist.",
    408: "The value was not ready within the timeout (it may still come).",
    409: "The request conflicts with the current state.",
    413: "The request, or a value in it, is larger than a configured limit.",
    415: "The body is not sent as JSON: use 'Content-Type: application/json'.",
    424: "The value will never come: the call that produces it (or one it needs) failed.",
    429: "A configured limit on how many (sessions, variables, calls, pending work) was reached.",
    503: "No engine can serve it now, or the database did not take the write.",
    507: "The values the server holds reached their configured bound (--max-value-bytes).",
}

# Built once: every route shares these specs (and so one ErrorResponse component).
_SPECS: dict[int, ResponseSpec] = {
    status: ResponseSpec(data_container=ErrorResponse, description=why, generate_examples=False)
    for status, why in _WHY.items()
}

# Statuses that come with a kind of route.
BODY = (400, 413, 415)  # takes a JSON body: invalid, too large, not JSON
PARAMS = (400,)  # takes query parameters that are checked
SESSION = (401, 403, 404)  # opens a session with its session_auth
ADMIN = (401, 403, 429)  # needs the admin token (or an API key); 429: repeated wrong admin tokens
CREATES = (429,)  # creates something a configured limit counts
STORE = (503,)  # writes to the database
VALUES = (429, 507)  # keeps a value: one client's share of value memory, the server's bound


def error_responses(*statuses: int | tuple[int, ...]) -> dict[int, ResponseSpec]:
    """The ``responses`` of a route that can answer these error statuses, given one by one
    or as the groups above (``error_responses(BODY, SESSION, 408)``)."""
    flat = {s for group in statuses for s in (group if isinstance(group, tuple) else (group,))}
    return {status: _SPECS[status] for status in sorted(flat)}
