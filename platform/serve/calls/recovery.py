"""Rebuilding a stored semantic call after a restart of the ServeCore."""

from __future__ import annotations

import msgspec

from parrot.platform.serve.calls import transforms
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.platform.store.models import CallRecord
from parrot.wire.sampling import SamplingParams
from parrot.wire.template import parse_template


def rebuild_call(record: CallRecord, variables: dict[str, SemanticVariable]) -> RequestChain:
    """The call as it was submitted (its state comes back through the call driver, which
    owns it), bound to its session's restored ``variables``; raises
    KeyError (a variable is gone) or a ParrotError (a record this version cannot read)."""
    params = record.parameters
    bound = {p["name"]: variables[p["var_id"]] for p in params}
    out = params[-1]
    if "transform" in out:
        inputs = [bound[p["name"]] for p in params[:-1]]
        steps = msgspec.convert(out["transform"], transforms.Steps)
        call = RequestChain.transform(record.call_id, inputs, bound[out["name"]], steps)
    else:
        outputs = {
            p["name"]: msgspec.convert(p["sampling"] or {}, SamplingParams) for p in params if p["is_output"]
        }
        call = RequestChain.build(record.call_id, parse_template(record.template), bound, outputs)
    return call
