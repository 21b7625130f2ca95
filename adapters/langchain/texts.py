"""The texts of one run on Parrot, and the markers that stand for them in LangChain objects.

A compiled chain runs LangChain's own prompt templates, parsers and item getters, but on
values whose texts may not exist yet: the output of a call still generating on the server.
Each such text is a :class:`TextSlot`, and a LangChain object holds it as a *marker*, a
short string unique to the run (``⟦3f9a1c0b2e7d:4⟧``). Templates treat strings as opaque,
so a formatted prompt keeps the markers where the texts go; :meth:`Texts.split` then cuts a
string into literal text and slots, which become a semantic call's constant text and its
input variables. When the real values are needed, :meth:`Texts.fill` puts them in.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.prompt_values import ChatPromptValue, StringPromptValue

from parrot.sdk.aclient import AsyncVar


@dataclass(eq=False)
class TextSlot:
    """A text of the run: known on the client (``value``), held by a semantic variable on
    the server (``var``), or both. ``call_id`` is the call that generates it, if any."""

    name: str  # the LangChain variable or output it is (names its semantic variable)
    value: str | None = None
    var: AsyncVar | None = None
    call_id: str | None = None


Piece = str | TextSlot  # literal text, or a text of the run


class Texts:
    """The slots of one run and their markers."""

    def __init__(self) -> None:
        self._nonce = secrets.token_hex(6)
        self._slots: list[TextSlot] = []
        self._index: dict[int, int] = {}  # id(slot) -> its number in the markers
        self._pattern = re.compile(f"⟦{self._nonce}:(\\d+)⟧")

    def add(self, slot: TextSlot) -> str:
        """Register ``slot``; returns its marker."""
        self._index[id(slot)] = len(self._slots)
        self._slots.append(slot)
        return self.marker(slot)

    def __contains__(self, slot: object) -> bool:
        return id(slot) in self._index

    def marker(self, slot: TextSlot) -> str:
        return f"⟦{self._nonce}:{self._index[id(slot)]}⟧"

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
            pieces.append(self._slots[int(match.group(1))])
            pos = match.end()
        if pos < len(text):
            pieces.append(text[pos:])
        return pieces

    def slots_in(self, obj: Any) -> list[TextSlot]:
        """The slots whose markers occur anywhere in ``obj`` (each once, in order)."""
        found: dict[int, TextSlot] = {}
        for text in _strings(obj):
            for piece in self.split(text):
                if isinstance(piece, TextSlot):
                    found.setdefault(id(piece), piece)
        return list(found.values())

    def fill(self, obj: Any, values: Mapping[TextSlot, str]) -> Any:
        """``obj`` with every marker replaced by its slot's value (from ``values``, else
        the slot's own); containers, prompt values and messages are copied, not changed."""

        def text(s: str) -> str:
            parts = self.split(s)
            if all(isinstance(p, str) for p in parts):
                return s
            return "".join(p if isinstance(p, str) else values.get(p, p.value or "") for p in parts)

        return _map_strings(obj, text)


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
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
