"""Typed request bodies of the Parrot REST API (responses: :mod:`parrot.wire.responses`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from parrot.engines.protocol.errors import BadRequestError
from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.calls.transforms import Steps
from parrot.platform.serve.engines.registry import EngineSpec
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# Values and templates: their size limits are the server's configured Limits (413 with the
# limit named, checked by the ServeCore), not a fixed bound here.
Text = str


class CreateVar(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A variable, with its value or set later; ``format`` makes it typed (its value must
    match, 400 otherwise)."""

    session_id: str
    name: Name
    value: Text | None = None
    format: OutputFormat | None = None


class SetVar(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: str
    value: Text


class CallParameter(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A placeholder of the template: an input (``var_id`` or ``value``) or an output; an
    output's ``format`` (a JSON schema, JSON object, regex, choice or grammar) constrains
    its generation and types its variable."""

    name: str
    is_output: bool = False
    var_id: str | None = None
    value: str | None = None
    sampling: SamplingParams | None = None
    format: OutputFormat | None = None

    def binding(self) -> Binding:
        return Binding(self.name, self.is_output, self.var_id, self.value, self.sampling, self.format)


class TransformInput(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    var_id: str | None = None
    value: str | None = None

    def binding(self, position: int) -> Binding:
        """Bound as ``input<position>`` (the name the stored call and the DAG show)."""
        return Binding(f"input{position}", var_id=self.var_id, value=self.value)


class SubmitCall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: str
    template: Text
    parameters: Annotated[list[CallParameter], msgspec.Meta(max_length=1024)]
    models: list[str] = msgspec.field(default_factory=list)
    output_criteria: str | None = None


class SubmitTransform(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A call that derives one variable from others by native string transforms: the input
    values, in order, go through ``steps`` (strip, lower, upper, regex, json_field, join,
    split_take, format), which must end with a single value."""

    session_id: str
    inputs: Annotated[list[TransformInput], msgspec.Meta(min_length=1, max_length=256)]
    steps: Steps
    output: Name = "result"


Url = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]


class RegisterEngine(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
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

    def spec(self) -> EngineSpec:
        if self.kind == "builtin":
            if self.url is None:
                raise BadRequestError("a builtin engine needs 'url'")
            if self.base_url or self.model or self.api_key:
                raise BadRequestError("'base_url', 'model' and 'api_key' are for kind 'openai'")
            return EngineSpec("builtin", self.url, self.capacity)
        if self.base_url is None or self.model is None:
            raise BadRequestError("an openai engine needs 'base_url' and 'model'")
        return EngineSpec("openai", self.base_url, self.capacity, self.model, self.api, self.api_key)
