"""A semantic call made from pieces: Parrot's ``{{placeholder}}`` template and its inputs.

Literal text becomes the template's constant text (shared by every call and session that
uses it), unless it has a brace: Parrot templates have no escape, so such text is bound as
an input value instead, which the server never parses (the model reads the same text).
Each slot becomes an input placeholder, once however often it occurs; a field of a slot
(a :class:`FieldRef`) is that placeholder with the field's path (``{{city.name}}``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from parrot.adapters.langchain.texts import FieldRef, Piece, TextSlot
from parrot.wire.template import format_path

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
MAX_NAME = 64


@dataclass(frozen=True)
class CallTemplate:
    template: str
    inputs: dict[str, TextSlot]  # input placeholder -> the text it is bound to
    output: str  # the output placeholder (last in the template)


def call_template(pieces: Sequence[Piece], output: str) -> CallTemplate:
    """The template of ``pieces`` followed by the output placeholder ``output`` (its name
    made valid and unique)."""
    if not any(_has_text(p) for p in pieces):
        raise ValueError("the prompt is empty: there is nothing to generate from")
    names = _Names()
    out = names.new(output)
    parts: list[str] = []
    inputs: dict[str, TextSlot] = {}
    placeholders: dict[int, str] = {}  # id(slot) -> its placeholder
    for piece in pieces:
        if isinstance(piece, str) and "{" not in piece and "}" not in piece:
            parts.append(piece)
            continue
        path = piece.path if isinstance(piece, FieldRef) else ()
        slot = piece.slot if isinstance(piece, FieldRef) else piece
        slot = TextSlot("text", value=slot) if isinstance(slot, str) else slot
        name = placeholders.get(id(slot))
        if name is None:
            name = placeholders[id(slot)] = names.new(slot.name)
            inputs[name] = slot
        parts.append("{{" + name + format_path(path) + "}}")  # a field: read on the server
    parts.append("{{" + out + "}}")
    return CallTemplate("".join(parts), inputs, out)


def _has_text(piece: Piece) -> bool:
    if isinstance(piece, str):
        return bool(piece)
    return isinstance(piece, FieldRef) or piece.var is not None or bool(piece.value)


class _Names:
    """Valid placeholder names (letters, digits, ``_``), each used once."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def new(self, wanted: str) -> str:
        base = _NOT_NAME.sub("_", wanted)[:MAX_NAME] or "text"
        if base[0].isdigit():
            base = "_" + base
        name, n = base, 1
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        return name
