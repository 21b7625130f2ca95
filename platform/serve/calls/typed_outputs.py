"""Typed outputs of a semantic call, checked at submit (issue 21): where a format may be
given, which format each output is generated with, and whether the field paths of the
template (``{{plan.steps[0]}}``) are ones their variables may have. Every refusal is a 400
(``bad_format``) before anything is created."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from parrot.engines.protocol.errors import BadFormatError
from parrot.platform.serve.variables.formats import unreachable
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams
from parrot.wire.template import Chunk, PlaceholderChunk

if TYPE_CHECKING:
    from parrot.platform.serve.calls.service import Binding


def check_formats(bindings: Sequence[Binding]) -> None:
    """A format belongs on an output parameter (``format``), never in its sampling. (The
    formats themselves are checked before: ``VariableService.check_formats``.)"""
    for p in bindings:
        if p.format is not None and not p.is_output:
            raise BadFormatError(
                f"input {p.name!r} cannot have a format: a format declares what an output is generated as"
            )
        if p.sampling is not None and p.sampling.format is not None:
            raise BadFormatError(
                f"parameter {p.name!r}: give the format as the parameter's 'format', not in its sampling"
            )


def type_outputs(
    bindings: Sequence[Binding], named: dict[str, SemanticVariable], outputs: dict[str, SamplingParams]
) -> list[tuple[SemanticVariable, OutputFormat]]:
    """Each output's sampling gets its format: the parameter's, or the one its existing
    variable already has. Returns the existing variables the call types (set once
    accepted)."""
    retyped = []
    for p in bindings:
        if not p.is_output:
            continue
        var = named.get(p.name)
        fmt = p.format
        if var is not None and var.format is not None:
            if fmt is not None and fmt.key() != var.format.key():
                raise BadFormatError(
                    f"output {p.name!r}: variable {var.var_id!r} already has another format "
                    f"({var.format.kind}); leave 'format' out to use it"
                )
            fmt = var.format
        elif var is not None and fmt is not None:
            retyped.append((var, fmt))
        if fmt is not None:
            outputs[p.name] = msgspec.structs.replace(outputs[p.name], format=fmt)
    return retyped


def check_paths(chunks: list[Chunk], bound: dict[str, SemanticVariable]) -> None:
    """A field path (``{{plan.steps[0]}}``) must be one its variable may have: a typed
    variable's value must be JSON, and a JSON schema must allow the path (400 otherwise).
    An untyped or ``json_object`` variable is read when the call runs (a missing field
    fails the call then)."""
    for chunk in chunks:
        if not isinstance(chunk, PlaceholderChunk) or not chunk.path:
            continue
        fmt = bound[chunk.name].format
        if fmt is None or fmt.json_object:
            continue
        if fmt.json_schema is None:
            raise BadFormatError(
                f"placeholder {{{{{chunk.ref}}}}} reads a field of {chunk.name!r}, whose format is a "
                f"{fmt.kind}: only a JSON value (json_schema, json_object) has fields "
                f"(at character {chunk.start})"
            )
        why = unreachable(fmt.json_schema, chunk.path)
        if why is not None:
            raise BadFormatError(
                f"placeholder {{{{{chunk.ref}}}}} reads a field that the json_schema of {chunk.name!r} "
                f"cannot have: {why} (at character {chunk.start})"
            )
