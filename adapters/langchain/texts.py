"""The texts of one run on Parrot, and the markers that stand for them in LangChain objects.

A compiled chain runs LangChain's own prompt templates, parsers and item getters, but on
values whose texts may not exist yet: the output of a call still generating on the server.
Each such text is a :class:`TextSlot`, and a LangChain object holds it as a *marker*, a
short string unique to the run (``⟦3f9a1c0b2e7d:4⟧``). Templates treat strings as opaque,
so a formatted prompt keeps the markers where the texts go; :meth:`Texts.split` then cuts a
string into literal text and slots, which become a semantic call's constant text and its
input variables. When the real values are needed, :meth:`Texts.fill` puts them in.

A structured model step (``with_structured_output``) gives a :class:`Structured` instead:
its fields (``value["name"]``, ``value.name``) are fields of the typed variable, and a
field formatted into a prompt is a field marker (``⟦3f9a1c0b2e7d:4|.name⟧``) that becomes
the placeholder ``{{city.name}}``, filled on the server.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.prompt_values import ChatPromptValue, StringPromptValue

from parrot.sdk.aclient import AsyncVar
from parrot.wire.template import PathStep, format_path, parse_path
from parrot.wire.template import field_text as json_field_text


@dataclass(eq=False)
class TextSlot:
    """A text of the run: known on the client (``value``), held by a semantic variable on
    the server (``var``), or both. ``call_id`` is the call that generates it, if any."""

    name: str  # the LangChain variable or output it is (names its semantic variable)
    value: str | None = None
    var: AsyncVar | None = None
    call_id: str | None = None


@dataclass(frozen=True, eq=False)
class FieldRef:
    """A field of a JSON text of the run: the placeholder ``{{name<path>}}``."""

    slot: TextSlot
    path: tuple[PathStep, ...]


Piece = str | TextSlot | FieldRef  # literal text, a text of the run, or a field of one


class Texts:
    """The slots of one run and their markers."""

    def __init__(self) -> None:
        self._nonce = secrets.token_hex(6)
        self._slots: list[TextSlot] = []
        self._index: dict[int, int] = {}  # id(slot) -> its number in the markers
        self._pattern = re.compile(f"⟦{self._nonce}:(\\d+)(?:\\|([^⟧]+))?⟧")

    def add(self, slot: TextSlot) -> str:
        """Register ``slot``; returns its marker."""
        self._index[id(slot)] = len(self._slots)
        self._slots.append(slot)
        return self.marker(slot)

    def __contains__(self, slot: object) -> bool:
        return id(slot) in self._index

    def marker(self, slot: TextSlot) -> str:
        return f"⟦{self._nonce}:{self._index[id(slot)]}⟧"

    def field_marker(self, slot: TextSlot, path: tuple[PathStep, ...]) -> str:
        return f"⟦{self._nonce}:{self._index[id(slot)]}|{format_path(path)}⟧"

    def known(self, name: str, value: str) -> str:
        """The marker of a new slot for a text the client has."""
        return self.add(TextSlot(name, value=value))

    def split(self, text: str) -> list[Piece]:
        """``text`` as literal pieces (never empty) and slots, in order."""
        pieces: list[Piece] = []
        pos = 0
        for match in self._pattern.finditer(text):
            if match.start() > pos:
                pieces.append(text[pos : match.start()])
            slot = self._slots[int(match.group(1))]
            pieces.append(slot if match.group(2) is None else FieldRef(slot, parse_path(match.group(2), 0)))
            pos = match.end()
        if pos < len(text):
            pieces.append(text[pos:])
        return pieces

    def slots_in(self, obj: Any) -> list[TextSlot]:
        """The slots whose markers occur anywhere in ``obj`` (each once, in order)."""
        found: dict[int, TextSlot] = {}
        for text in _strings(obj):
            for piece in self.split(text):
                slot = piece.slot if isinstance(piece, FieldRef) else piece
                if isinstance(slot, TextSlot):
                    found.setdefault(id(slot), slot)
        return list(found.values())

    def fill(self, obj: Any, values: Mapping[TextSlot, str]) -> Any:
        """``obj`` with every marker replaced by its slot's value (from ``values``, else
        the slot's own); containers, prompt values and messages are copied, not changed."""

        def value(slot: TextSlot) -> str:
            return values.get(slot, slot.value or "")

        def piece(p: Piece) -> str:
            if isinstance(p, FieldRef):
                return field_text(value(p.slot), p.path)
            return p if isinstance(p, str) else value(p)

        def text(s: str) -> str:
            parts = self.split(s)
            if all(isinstance(p, str) for p in parts):
                return s
            return "".join(piece(p) for p in parts)

        return _map_strings(obj, text)


class Structured:
    """The value of a structured model step of a compiled run (a typed variable on the
    server), or a field of it (``path``), before it exists.

    ``value["key"]``, ``value[0]`` and ``value.name`` (a property of the schema) are its
    fields; formatted into a prompt, a field is its field marker. Anything that needs the
    real value waits for it: it is then what the uncompiled chain has there (the parser's
    result, or the field of it)."""

    def __init__(
        self, texts: Texts, slot: TextSlot, parse: Any, schema: Any, path: tuple[PathStep, ...] = ()
    ) -> None:
        self._texts, self._slot, self._parse, self._schema, self._path = texts, slot, parse, schema, path

    def __getitem__(self, key: PathStep) -> Structured:
        return self._field(key)

    def __getattr__(self, name: str) -> Structured:
        properties = self._schema.get("properties", {}) if isinstance(self._schema, dict) else {}
        if name.startswith("_") or name not in properties:
            raise AttributeError(name)
        return self._field(name)

    def _field(self, key: PathStep) -> Structured:
        schema = self._schema if isinstance(self._schema, dict) else {}
        inner = schema.get("items") if isinstance(key, int) else schema.get("properties", {}).get(key)
        return Structured(self._texts, self._slot, self._parse, inner, (*self._path, key))

    def __format__(self, spec: str) -> str:
        if not self._path:  # the whole value reads as the parser's result, on the client
            raise TypeError("a structured value is formatted whole: wait for it first")
        return self._texts.field_marker(self._slot, self._path)

    def __str__(self) -> str:
        return self.__format__("")

    def __repr__(self) -> str:
        return f"Structured({self._slot.name}{format_path(self._path)})"

    @property
    def is_field(self) -> bool:
        return bool(self._path)

    def marker(self) -> str:
        return self._texts.marker(self._slot)

    def read(self, text: str) -> Any:
        """The value, from the JSON ``text`` of the whole: the parser's result, then each
        field of the path (an attribute of a model, an item of a dict or a list)."""
        value = self._parse(text)
        for step in self._path:
            value = value[step] if isinstance(value, dict | list) else getattr(value, step)
        return value


def field_text(text: str, path: tuple[PathStep, ...]) -> str:
    """The text a field placeholder fills in (as the server does): a string as it is,
    any other JSON value compact."""
    data: Any = json.loads(text)
    for step in path:
        data = data[step]
    return json_field_text(data)


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, Structured):
        yield obj.marker()
    elif isinstance(obj, str):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list) or type(obj) is tuple:
        for item in obj:
            yield from _strings(item)
    elif isinstance(obj, BaseMessage):
        yield from _strings(obj.content)
    elif isinstance(obj, StringPromptValue):
        yield obj.text
    elif isinstance(obj, ChatPromptValue):
        yield from _strings(list(obj.messages))


def _map_strings(obj: Any, text: Any) -> Any:
    """``obj`` rebuilt with ``text(s)`` for each string ``s`` in it (the kinds of objects
    a chain passes between its steps; anything else is returned as it is)."""
    if isinstance(obj, Structured):
        return obj.read(text(obj.marker()))
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, Mapping):
        return {key: _map_strings(value, text) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_map_strings(item, text) for item in obj]
    if type(obj) is tuple:
        return tuple(_map_strings(item, text) for item in obj)
    if isinstance(obj, BaseMessage):
        return obj.model_copy(update={"content": _map_strings(obj.content, text)})
    if isinstance(obj, StringPromptValue):
        return obj.model_copy(update={"text": text(obj.text)})
    if isinstance(obj, ChatPromptValue):
        return obj.model_copy(update={"messages": [_map_strings(m, text) for m in obj.messages]})
    return obj
