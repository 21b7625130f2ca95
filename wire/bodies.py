"""Request bodies of the Parrot REST API: the SDK builds and encodes them, the ServeCore
decodes and validates them with the same types (responses: :mod:`parrot.wire.responses`;
the adapters' routes: :mod:`parrot.wire.adapter_bodies`).

Only the shape and fixed bounds are checked here (a bad body is a 400 naming the field);
what needs the server (its configured size limits, whether a variable exists, which fields
an engine's kind takes) is checked by the ServeCore. Fields left at their default are not
sent (``omit_defaults``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams
from parrot.wire.transforms import Steps

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# Values and templates: their size limits are the server's configured Limits (413 with the
# limit named, checked by the ServeCore), not a fixed bound here.
Text = str
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
# How a session is found again (on the dashboard's sessions page): a label and a few tags.
MAX_LABEL_CHARS, MAX_TAGS, MAX_TAG_CHARS = 200, 16, 64
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TAG_CHARS)]
Tags = Annotated[list[Tag], msgspec.Meta(max_length=MAX_TAGS)]


class Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A request body: unknown fields are refused, defaults are not sent."""


class NewSession(Body):
    """``POST /v1/session``'s body, which may be left out: a ``label`` and ``tags`` that
    the dashboard's sessions page finds the session by."""

    label: Label | None = None
    tags: Tags = []


class CreateVar(Body):
    """A variable, with its value or set later; ``format`` makes it typed (its value must
    match, 400 otherwise)."""

    session_id: str
    name: Name
    value: Text | None = None
    format: OutputFormat | None = None


class SetVar(Body):
    session_id: str
    value: Text


class OutputRef(Body):
    """An output of an earlier call of the same batch: its position in ``calls`` and its
    placeholder's name."""

    call: Annotated[int, msgspec.Meta(ge=0)]
    output: Name


class CallParameter(Body):
    """A placeholder of the template: an input (``var_id``, ``value``, or in a batch
    ``output_of`` an earlier call of the batch) or an output; an output's ``format`` (a
    JSON schema, JSON object, regex, choice or grammar) constrains its generation and types
    its variable."""

    name: str
    is_output: bool = False
    var_id: str | None = None
    output_of: OutputRef | None = None
    value: str | None = None
    sampling: SamplingParams | None = None
    format: OutputFormat | None = None


class CallSpec(Body):
    """A templated call: its template, what each placeholder is bound to, the models it may
    run on and its outputs' criteria."""

    template: Text
    parameters: Annotated[list[CallParameter], msgspec.Meta(max_length=1024)]
    models: list[str] = msgspec.field(default_factory=list)
    output_criteria: str | None = None


class SubmitCall(CallSpec, kw_only=True):
    session_id: str


class SubmitCalls(Body):
    """Calls submitted together (``POST /v1/semantic_calls``): a DAG in one request.

    A call's input may be ``output_of`` an earlier call of the batch. Every call is checked
    before any is accepted. No ``session_id``: the batch opens a new session (its key is in
    the answer). ``stream``: the answer is the event stream of that output (a ``submitted``
    event first, then its ``delta`` / ``value`` / ``error`` events, as
    ``GET /v1/semantic_var/{id}/stream`` sends them), read with ``criteria``; ``close``
    deletes the session when that stream ends: a one-shot application in one round trip.
    ``deltas=false`` leaves the stream's ``delta`` events out: a reader that wants only the
    value gets one event for it, not one per generated piece. ``label`` and ``tags`` are
    those of the session the batch opens (as :class:`NewSession`'s).
    """

    calls: Annotated[list[CallSpec], msgspec.Meta(min_length=1, max_length=1024)]
    session_id: str | None = None
    stream: OutputRef | None = None
    criteria: Literal["latency", "throughput"] = "latency"
    close: bool = False
    deltas: bool = True
    label: Label | None = None
    tags: Tags = []


class TransformInput(Body):
    """An input of a transform: a variable (``var_id``) or a value."""

    var_id: str | None = None
    value: str | None = None


class SubmitTransform(Body):
    """A call that derives one variable from others by native string transforms: the input
    values, in order, go through ``steps`` (:mod:`parrot.wire.transforms`), which must end
    with a single value."""

    session_id: str
    inputs: Annotated[list[TransformInput], msgspec.Meta(min_length=1, max_length=256)]
    steps: Steps
    output: Name = "result"


class RegisterEngine(Body):
    """A builtin engine: ``url``. An OpenAI-compatible endpoint: ``kind: "openai"``,
    ``base_url``, ``model``, ``api_key``, ``api`` ("chat" or "completions")."""

    kind: Literal["builtin", "openai"] = "builtin"
    url: Url | None = None
    base_url: Url | None = None
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    api_key: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    api: Literal["chat", "completions"] = "chat"
    # Tasks at once (default: a builtin engine's own running-job limit; 16 for an endpoint).
    capacity: Annotated[int, msgspec.Meta(ge=1, le=4096)] | None = None
