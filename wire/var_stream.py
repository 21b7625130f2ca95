"""Events of a streamed semantic variable (``GET /v1/semantic_var/{id}/stream``).

The server sends ``text/event-stream`` events named after these structs' roles:

- ``delta`` (:class:`VarDelta`): the text generated since the previous event, in order;
- ``value`` (:class:`VarValue`): the last event of a stream that ends well: the whole value
  (always the deltas joined, when there were deltas) and how its producer finished;
- ``error`` (:class:`VarStreamError`): the last event of a stream that ends badly (the
  producer failed, the session was deleted): the same ``code``/``message`` as an HTTP error.

Light on purpose (msgspec only): the SDK decodes what the server encodes.
"""

from __future__ import annotations

import msgspec

from parrot.wire.formats import OutputFormat

DELTA, VALUE, ERROR = "delta", "value", "error"  # the event names
# The first event of a batch's stream (``POST /v1/semantic_calls`` with ``stream``): the
# batch's CallsSubmitted (:mod:`parrot.wire.responses`).
SUBMITTED = "submitted"


class VarDelta(msgspec.Struct, kw_only=True, frozen=True):
    """Text new since the previous event, and the tokens it took (a slow reader gets
    several tokens' text in one event)."""

    delta: str
    tokens: int = 0


class VarValue(msgspec.Struct, kw_only=True, frozen=True):
    """The variable's value. ``finish_reason`` is its producer's ("stop", "length"; None
    for a value a client set); ``tokens`` how many it generated; ``format`` the variable's
    when it is typed (the value matches it), as a get answers it."""

    value: str
    finish_reason: str | None = None
    tokens: int = 0
    format: OutputFormat | None = None


class ErrorDetail(msgspec.Struct, kw_only=True, frozen=True):
    code: str
    message: str
    status: int  # what the same failure answers as an HTTP error (424: its producer failed)


class VarStreamError(msgspec.Struct, kw_only=True, frozen=True):
    error: ErrorDetail
