"""Native string transforms: derive a semantic variable from others without an LLM call.

A fixed set of safe operations, described as data (never code from a request): the
pipeline starts with the list of input values; ``strip``/``lower``/``upper``/``regex``/
``json_field``/``split_take`` apply to each value, ``join`` and ``format`` combine all
values into one. The result must be a single string.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

import msgspec
import regex

from parrot.platform.serve.errors import TransformError

MAX_PATTERN = 512
REGEX_TIMEOUT_S = 0.5  # a pathological pattern fails instead of hanging the server
FIELD = re.compile(r"\{(\d+)\}")


class Strip(msgspec.Struct, tag="strip", forbid_unknown_fields=True):
    chars: str | None = None


class Lower(msgspec.Struct, tag="lower", forbid_unknown_fields=True):
    pass


class Upper(msgspec.Struct, tag="upper", forbid_unknown_fields=True):
    pass


class RegexExtract(msgspec.Struct, tag="regex", forbid_unknown_fields=True):
    pattern: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PATTERN)]
    group: Annotated[int, msgspec.Meta(ge=0, le=99)] | str = 0
    ignore_case: bool = False


class JsonField(msgspec.Struct, tag="json_field", forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]  # "a.b.0.c"


class Join(msgspec.Struct, tag="join", forbid_unknown_fields=True):
    separator: str = ""


class SplitTake(msgspec.Struct, tag="split_take", forbid_unknown_fields=True):
    separator: Annotated[str, msgspec.Meta(min_length=1)]
    index: int = 0


class Format(msgspec.Struct, tag="format", forbid_unknown_fields=True):
    template: Annotated[str, msgspec.Meta(max_length=100_000)]  # "{0} and {1}"; "{{" for a brace


Step = Strip | Lower | Upper | RegexExtract | JsonField | Join | SplitTake | Format
Steps = Annotated[list[Step], msgspec.Meta(min_length=1, max_length=32)]


def validate(steps: list[Step]) -> None:
    """Checks that need more than types: the regexes compile."""
    for step in steps:
        if isinstance(step, RegexExtract):
            try:
                regex.compile(step.pattern)
            except regex.error as error:
                raise TransformError(f"invalid regex {step.pattern!r}: {error}") from None


def apply(steps: list[Step], inputs: list[str]) -> str:
    values = list(inputs)
    for n, step in enumerate(steps, 1):
        try:
            values = _apply(step, values)
        except TransformError as error:
            raise TransformError(f"step {n} ({type(step).__name__}): {error}") from None
    if len(values) != 1:
        raise TransformError(f"the transform ends with {len(values)} values; finish with join or format")
    return values[0]


def _apply(step: Step, values: list[str]) -> list[str]:
    match step:
        case Strip(chars=chars):
            return [v.strip(chars) for v in values]
        case Lower():
            return [v.lower() for v in values]
        case Upper():
            return [v.upper() for v in values]
        case RegexExtract():
            return [_regex(step, v) for v in values]
        case JsonField(path=path):
            return [_json_field(v, path) for v in values]
        case Join(separator=sep):
            return [sep.join(values)]
        case SplitTake(separator=sep, index=index):
            return [_split_take(v, sep, index) for v in values]
        case Format(template=template):
            return [_format(template, values)]
    raise TransformError(f"unknown step {step!r}")  # pragma: no cover - the union is closed


def _regex(step: RegexExtract, value: str) -> str:
    flags = regex.IGNORECASE if step.ignore_case else 0
    try:
        match = regex.search(step.pattern, value, flags=flags, timeout=REGEX_TIMEOUT_S)
    except TimeoutError:
        raise TransformError(f"regex {step.pattern!r} took longer than {REGEX_TIMEOUT_S}s") from None
    except regex.error as error:
        raise TransformError(f"invalid regex {step.pattern!r}: {error}") from None
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
    for part in path.split("."):
        if isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise TransformError(f"JSON has no field {part!r} (path {path!r})")
    return node if isinstance(node, str) else json.dumps(node)


def _split_take(value: str, sep: str, index: int) -> str:
    parts = value.split(sep)
    if not -len(parts) <= index < len(parts):
        raise TransformError(f"split on {sep!r} gave {len(parts)} parts; no part {index}")
    return parts[index]


def _format(template: str, values: list[str]) -> str:
    """``{N}`` is the N-th value; ``{{`` and ``}}`` are braces. Nothing else is interpreted."""
    out, pos = [], 0
    for token in re.finditer(r"\{\{|\}\}|\{(\d+)\}|[{}]", template):
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
