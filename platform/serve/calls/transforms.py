"""Native string transforms: derive a semantic variable from others without an LLM call.

A fixed set of safe operations, described as data (never code from a request; the step
types are the wire contract's, :mod:`parrot.wire.transforms`): the pipeline starts with the
list of input values; ``strip``/``lower``/``upper``/``regex``/``json_field``/``split_take``
apply to each value, ``join`` and ``format`` combine all values into one. The result must
be a single string, and valid text (see :mod:`parrot.engines.protocol.text`).

A transform is CPU work on client data: it runs within one time budget for all its steps
and values together (:class:`Deadline`; each regex search gets what is left of it), and
:mod:`parrot.platform.serve.calls.transform_runner` runs it in a worker thread, off the event
loop. Whatever goes wrong while applying it is a :class:`TransformError` with the reason.
"""

from __future__ import annotations

import json
import re
import time

import regex

from parrot.engines.protocol import text
from parrot.platform.serve.errors import TransformError
from parrot.wire.transforms import (
    Format,
    Join,
    JsonField,
    Lower,
    RegexExtract,
    SplitTake,
    Step,
    Steps,  # noqa: F401 (re-exported: recovery reads stored steps back with it)
    Strip,
    Upper,
)

# A format field {N} (at most 6 digits); "{{0}}" is counted as a field too, an overestimate
# that only matters at the size limit.
FORMAT_FIELD = re.compile(r"\{([0-9]{1,6})\}")
INDEX = re.compile(r"-?[0-9]{1,18}")  # a list index in a json_field path (ASCII digits only)


class Deadline:
    """The time budget of one transform, shared by all its steps and values."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.ends = time.monotonic() + budget_s

    def left(self) -> float:
        """Seconds left; raises :class:`TransformError` once there are none."""
        left = self.ends - time.monotonic()
        if left <= 0:
            raise TransformError(f"the transform ran out of its time budget of {self.budget_s:g} s")
        return left


def validate(steps: list[Step]) -> None:
    """Checks that need more than types: the regexes compile."""
    for step in steps:
        if isinstance(step, RegexExtract):
            try:
                regex.compile(step.pattern)
            except regex.error as error:
                raise TransformError(f"invalid regex {step.pattern!r}: {error}") from None


def apply(steps: list[Step], inputs: list[str], budget_s: float = 2.0, max_chars: int = 8 * 2**20) -> str:
    """The transform's result; raises :class:`TransformError` (with the step and the reason)
    when it cannot be applied, takes longer than ``budget_s`` in all, or would build a value
    longer than ``max_chars`` (checked before it is built: 256 inputs joined could make
    gigabytes)."""
    deadline = Deadline(budget_s)
    values = list(inputs)
    for n, step in enumerate(steps, 1):
        try:
            _check_size(step, values, max_chars)
            values = _apply(step, values, deadline)
        except TransformError as error:
            raise TransformError(f"step {n} ({type(step).__name__}): {error}") from None
    if len(values) != 1:
        raise TransformError(f"the transform ends with {len(values)} values; finish with join or format")
    why = text.problem(values[0])
    if why is not None:
        raise TransformError(f"the result is not valid text: {why}")
    return values[0]


def _check_size(step: Step, values: list[str], max_chars: int) -> None:
    """A step that combines values must not build more than a value may hold."""
    match step:
        case Join(separator=sep):
            size = sum(map(len, values)) + len(sep) * max(len(values) - 1, 0)
        case Format(template=template):
            size = len(template)
            for field in FORMAT_FIELD.finditer(template):
                n = int(field.group(1))
                size += (len(values[n]) if n < len(values) else 0) - len(field.group(0))
        case _:
            return
    if size > max_chars:
        raise TransformError(f"it would make a value of {size} characters, over the limit of {max_chars}")


def _apply(step: Step, values: list[str], deadline: Deadline) -> list[str]:
    match step:
        case Join(separator=sep):
            return [sep.join(values)]
        case Format(template=template):
            return [_format(template, values)]
        case RegexExtract():
            flags = regex.IGNORECASE if step.ignore_case else 0
            try:
                pattern = regex.compile(step.pattern, flags)
            except regex.error as error:
                raise TransformError(f"invalid regex {step.pattern!r}: {error}") from None
            return [_regex(step, pattern, v, deadline) for v in values]
    out = []
    for value in values:  # one value at a time, each within what is left of the budget
        deadline.left()
        out.append(_each(step, value))
    return out


def _each(step: Step, value: str) -> str:
    match step:
        case Strip(chars=chars):
            return value.strip(chars)
        case Lower():
            return value.lower()
        case Upper():
            return value.upper()
        case JsonField(path=path):
            return _json_field(value, path)
        case SplitTake(separator=sep, index=index):
            return _split_take(value, sep, index)
    raise TransformError(f"unknown step {step!r}")  # pragma: no cover - the union is closed


def _regex(step: RegexExtract, pattern: regex.Pattern, value: str, deadline: Deadline) -> str:
    left = deadline.left()
    try:
        # concurrent: the search releases the GIL, so the event loop's thread runs meanwhile
        match = pattern.search(value, concurrent=True, timeout=left)
    except TimeoutError:
        raise TransformError(
            f"regex {step.pattern!r} ran out of the transform's time budget of {deadline.budget_s:g} s"
        ) from None
    if match is None:
        raise TransformError(f"regex {step.pattern!r} did not match")
    try:
        return match.group(step.group) or ""
    except IndexError:
        raise TransformError(f"regex {step.pattern!r} has no group {step.group!r}") from None


def _json_field(value: str, path: str) -> str:
    try:
        node = json.loads(value)
    except json.JSONDecodeError as error:
        raise TransformError(f"value is not JSON: {error}") from None
    except (ValueError, RecursionError) as error:  # a number of >4,300 digits, deep nesting
        raise TransformError(f"value is JSON this server does not read: {error}") from None
    for part in path.split("."):
        if isinstance(node, list) and INDEX.fullmatch(part) and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise TransformError(f"JSON has no field {part!r} (path {path!r})")
    if isinstance(node, str):
        return node
    try:
        return json.dumps(node)
    except (ValueError, RecursionError) as error:
        raise TransformError(f"the field cannot be written back as JSON: {error}") from None


def _split_take(value: str, sep: str, index: int) -> str:
    parts = value.split(sep)
    if not -len(parts) <= index < len(parts):
        raise TransformError(f"split on {sep!r} gave {len(parts)} parts; no part {index}")
    return parts[index]


def _format(template: str, values: list[str]) -> str:
    """``{N}`` is the N-th value; ``{{`` and ``}}`` are braces. Nothing else is interpreted."""
    out, pos = [], 0
    for token in re.finditer(r"\{\{|\}\}|\{(\d{1,6})\}|[{}]", template):  # {N}: at most 6 digits
        out.append(template[pos : token.start()])
        text = token.group(0)
        if text in ("{{", "}}"):
            out.append(text[0])
        elif token.group(1) is not None:
            n = int(token.group(1))
            if n >= len(values):
                raise TransformError(f"format field {{{n}}} but only {len(values)} values")
            out.append(values[n])
        else:
            raise TransformError(f"lone {text!r} at {token.start()} in the format template; use {text * 2}")
        pos = token.end()
    out.append(template[pos:])
    return "".join(out)
