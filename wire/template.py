"""Prompt templates: text with ``{{name}}`` placeholders, split into chunks and bound to
parameters. Every error names what is wrong and where (a character offset).

A placeholder of an input may read a field of a JSON value: ``{{plan.steps[0]}}``,
``{{review.verdict}}``, ``{{x[2].y}}``, ``{{row["a key"]}}``: the parameter's name, then a
path of ``.field``, ``[index]`` (a non-negative integer) or ``["any key"]`` (a JSON string)
steps, without spaces. The chunk's ``name`` is the parameter's, its ``path`` the steps.

Part of the wire contract: the SDK checks a semantic function's template with these rules
before it sends anything, and the ServeCore checks every call with the same rules."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from parrot.wire.errors import TemplateError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# One step of a field path: .field, [index], ["key"] (a JSON string literal).
_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(0|[1-9][0-9]*)\]|\[("(?:[^"\\]|\\.)*")\]')

PathStep = str | int


@dataclass(frozen=True)
class TextChunk:
    text: str
    start: int  # offset of the text in the template


@dataclass(frozen=True)
class PlaceholderChunk:
    name: str  # the parameter's name
    start: int  # offset of the opening braces
    end: int  # offset after the closing braces
    path: tuple[PathStep, ...] = ()  # the field read from the parameter's JSON value (keys, indexes)

    @property
    def ref(self) -> str:
        """What is inside the braces, normalized: ``plan.steps[0]``."""
        return self.name + format_path(self.path)


def format_path(path: Sequence[PathStep]) -> str:
    """A path as a template writes it: ``.steps[0]``, ``["a key"]``."""
    out = []
    for step in path:
        if isinstance(step, int):
            out.append(f"[{step}]")
        elif NAME.fullmatch(step):
            out.append(f".{step}")
        else:
            out.append(f"[{json.dumps(step, ensure_ascii=False)}]")
    return "".join(out)


def field_text(data: object) -> str:
    """What a field placeholder (``{{plan.steps[0]}}``) fills in for the JSON value it reads:
    a string as it is, any other value as compact JSON. The server fills fields so, and a
    client that renders a prompt itself (the LangChain adapter) must do the same."""
    return data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def parse_path(text: str, offset: int) -> tuple[PathStep, ...]:
    """The steps of a field path (``text`` starts at ``.`` or ``[``; ``offset`` is where
    it is in the template, for the error)."""
    steps: list[PathStep] = []
    pos = 0
    while pos < len(text):
        match = _STEP.match(text, pos)
        if match is None:
            raise TemplateError(
                f"malformed field path {text!r} at {text[pos:]!r}: use .field, [index] "
                '(a non-negative integer) or ["key"]',
                offset + pos,
            )
        field_name, index, quoted = match.groups()
        if field_name is not None:
            steps.append(field_name)
        elif index is not None:
            steps.append(int(index))
        else:
            steps.append(json.loads(quoted))
        pos = match.end()
    return tuple(steps)


Chunk = TextChunk | PlaceholderChunk


def parse_template(template: str) -> list[Chunk]:
    """Split a template into text and placeholder chunks.

    ``{{`` opens a placeholder, which must be closed by ``}}`` around a name (spaces allowed
    inside the braces); single braces and a stray ``}}`` are ordinary text. The size of a
    template is bounded where it enters the server (``--max-prompt-chars``, 413), not here:
    one limit, one answer.
    """
    chunks: list[Chunk] = []
    pos = 0
    while pos < len(template):
        open_at = template.find("{{", pos)
        if open_at < 0:
            chunks.append(TextChunk(template[pos:], pos))
            break
        if open_at > pos:
            chunks.append(TextChunk(template[pos:open_at], pos))
        close_at = template.find("}}", open_at + 2)
        if close_at < 0:
            raise TemplateError("unclosed placeholder: '{{' without a matching '}}'", open_at)
        inner = template[open_at + 2 : close_at]
        if "{{" in inner:
            raise TemplateError("malformed placeholder: '{{' inside another placeholder", open_at)
        ref = inner.strip()
        if not ref:
            raise TemplateError("empty placeholder '{{}}': a placeholder needs a name", open_at)
        head = NAME.match(ref)
        if head is None or (head.end() < len(ref) and ref[head.end()] not in ".["):
            raise TemplateError(
                f"malformed placeholder name {ref!r}: use letters, digits and '_', not starting with a digit",
                open_at,
            )
        name = head.group()
        path_at = open_at + 2 + (len(inner) - len(inner.lstrip())) + head.end()
        path = parse_path(ref[head.end() :], path_at)
        chunks.append(PlaceholderChunk(name, open_at, close_at + 2, path))
        pos = close_at + 2
    return chunks


@dataclass(frozen=True)
class ParameterSpec:
    """What the binding needs to know of a call parameter."""

    name: str
    is_output: bool


def check_binding(chunks: Sequence[Chunk], parameters: Sequence[ParameterSpec]) -> None:
    """The template's placeholders and the call's parameters must match one to one."""
    by_name: dict[str, ParameterSpec] = {}
    for p in parameters:
        if p.name in by_name:
            raise TemplateError(f"parameter {p.name!r} is given twice")
        if not NAME.fullmatch(p.name):
            raise TemplateError(f"parameter name {p.name!r} is not a valid placeholder name")
        by_name[p.name] = p
    used: dict[str, int] = {}
    previous: Chunk | None = None
    for chunk in chunks:
        if isinstance(chunk, TextChunk):
            previous = chunk
            continue
        param = by_name.get(chunk.name)
        if param is None:
            raise TemplateError(f"placeholder {{{{{chunk.ref}}}}} has no parameter", chunk.start)
        if param.is_output:
            if chunk.path:
                raise TemplateError(
                    f"output {{{{{chunk.ref}}}}} reads a field: only an input's placeholder may have "
                    "a path (an output is generated whole)",
                    chunk.start,
                )
            if chunk.name in used:
                raise TemplateError(f"output {{{{{chunk.name}}}}} appears twice", chunk.start)
            if previous is None:
                raise TemplateError(
                    f"output {{{{{chunk.name}}}}} is not preceded by any text: nothing to generate from",
                    chunk.start,
                )
            if isinstance(previous, PlaceholderChunk) and by_name[previous.name].is_output:
                raise TemplateError(
                    f"outputs {{{{{previous.name}}}}} and {{{{{chunk.name}}}}} are adjacent: "
                    "put text between them",
                    chunk.start,
                )
        used.setdefault(chunk.name, chunk.start)
        previous = chunk
    unused = [p.name for p in parameters if p.name not in used]
    if unused:
        raise TemplateError(f"parameter {unused[0]!r} has no placeholder in the template")
