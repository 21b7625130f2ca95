"""What the routes make of the request bodies (:mod:`parrot.wire.bodies`, the types the
SDK sends): the serve layer's domain values, with the checks that need more than the
body's types (which fields an engine's kind takes)."""

from __future__ import annotations

from parrot.engines.protocol.errors import BadRequestError
from parrot.platform.serve.calls.service import Binding, CallRequest
from parrot.platform.serve.engines.registry import EngineSpec
from parrot.wire.bodies import CallParameter, CallSpec, RegisterEngine, TransformInput


def binding(p: CallParameter, in_batch: bool = False) -> Binding:
    if p.output_of is not None and not in_batch:
        raise BadRequestError(
            f"parameter {p.name!r}: output_of names a call of the same batch (POST /v1/semantic_calls)"
        )
    ref = None if p.output_of is None else (p.output_of.call, p.output_of.output)
    return Binding(p.name, p.is_output, p.var_id, p.value, p.sampling, p.format, ref)


def call_request(spec: CallSpec) -> CallRequest:
    """A call of a batch."""
    bindings = [binding(p, in_batch=True) for p in spec.parameters]
    return CallRequest(spec.template, bindings, spec.models, spec.output_criteria)


def transform_binding(item: TransformInput, position: int) -> Binding:
    """Bound as ``input<position>`` (the name the stored call and the DAG show)."""
    return Binding(f"input{position}", var_id=item.var_id, value=item.value)


def engine_spec(body: RegisterEngine) -> EngineSpec:
    if body.kind == "builtin":
        if body.url is None:
            raise BadRequestError("a builtin engine needs 'url'")
        if body.base_url or body.model or body.api_key:
            raise BadRequestError("'base_url', 'model' and 'api_key' are for kind 'openai'")
        return EngineSpec("builtin", body.url, body.capacity)
    if body.base_url is None or body.model is None:
        raise BadRequestError("an openai engine needs 'base_url' and 'model'")
    return EngineSpec("openai", body.base_url, body.capacity, body.model, body.api, body.api_key)
