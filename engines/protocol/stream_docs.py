"""OpenAPI operations of the routes that answer with server-sent events.

Litestar documents a handler returning ``CompletionResponse | Stream`` as one JSON body
that is ``oneOf`` the response and ``{}`` (which any body matches, so no body fits
exactly one), and a ``ServerSentEvent`` as JSON too. These operation classes (a route's
``operation_class``) say what is really sent: the JSON response, or ``text/event-stream``
when the request asks for a stream; or only ``text/event-stream``.
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, Reference, Schema

EVENT_STREAM = "text/event-stream"
JSON = "application/json"


def _events() -> OpenAPIMediaType:
    """One event of the stream (OpenAPI 3.1 describes a stream by its events)."""
    text = Schema(type=OpenAPIType.STRING)
    event = Schema(
        type=OpenAPIType.OBJECT,
        required=["data"],
        properties={"event": text, "data": text, "id": text, "retry": Schema(type=OpenAPIType.INTEGER)},
        description="a server-sent event: its data is one JSON document ([DONE] ends an OpenAI stream)",
    )
    return OpenAPIMediaType(schema=event)


@dataclass
class JsonOrEventStream(Operation):
    """200: the JSON response, or server-sent events for a request with ``"stream": true``."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if ok is None or not ok.content or JSON not in ok.content:
            return
        schema = ok.content[JSON].schema
        if isinstance(schema, Schema) and schema.one_of:
            (body,) = [s for s in schema.one_of if isinstance(s, Reference)]  # drop the Stream's {}
            ok.content[JSON] = OpenAPIMediaType(schema=body)
        ok.content[EVENT_STREAM] = _events()


@dataclass
class EventStreamOnly(Operation):
    """200: server-sent events only."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if ok is not None:
            ok.content = {EVENT_STREAM: _events()}
