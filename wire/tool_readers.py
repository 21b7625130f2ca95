"""Answers in a model's own tool syntax (:mod:`parrot.wire.tool_syntax`) read as they stream.

The readers behave as the generic format's (:class:`~parrot.wire.tool_stream.AnswerStream`):
text for the user streams as content as it comes; each call comes out whole once its JSON
is complete; a call the answer already holds (same name, same arguments) ends the list; the
syntax's own text never comes out as content, and a call cut by ``max_tokens`` is dropped,
never half given. ``given_calls`` counts the calls the reader's user has sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Final

from parrot.wire.openai_schemas import FunctionCall, ToolCall
from parrot.wire.tool_calls import COMPACT, ToolAnswer, new_call_id

_DECODER = json.JSONDecoder()
_BETWEEN_ITEMS = re.compile(r"[\s,]*")
LIST_END: Final = object()  # what :func:`whole_items` gives once the list closes


def whole_items(text: str, start: int) -> Iterator[tuple[Any, int]]:
    """The items of a JSON list being written that are whole, from ``start`` (after its
    bracket or an item), each with where it ends; :data:`LIST_END` once the list closes."""
    while True:
        at = _BETWEEN_ITEMS.match(text, start).end()
        if text.startswith("]", at):
            yield LIST_END, at + 1
            return
        try:
            item, start = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return  # not whole yet
        yield item, start


def _call(item: Any, arguments_key: str) -> ToolCall | None:
    """The call of a decoded ``{"name": ..., arguments_key: {...}}`` (None: not a call)."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get(arguments_key, item.get("arguments", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, **COMPACT)
    return ToolCall(id=new_call_id(), function=FunctionCall(name=item["name"], arguments=text))


class CallList:
    """The calls read so far, and whether one came again (the list ends there)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.count = 0
        self.repeated = False
        self.given_calls = 0
        self.last_end = 0  # where the last new call ends in the answer's text

    @property
    def cut_at(self) -> int | None:
        """Where the text ends once a call came again: after the last new call."""
        return self.last_end if self.repeated else None

    def take(self, call: ToolCall) -> bool:
        """Whether ``call`` is new (False: a repetition, which ends the list)."""
        try:
            arguments = json.dumps(json.loads(call.function.arguments or "{}"), sort_keys=True)
        except json.JSONDecodeError:
            arguments = call.function.arguments or ""
        key = (call.function.name, arguments)
        if key in self.seen:
            self.repeated = True
            return False
        self.seen.add(key)
        self.count += 1
        return True


class TaggedCallReader(CallList):
    """Calls in tags (``<tool_call>{...}</tool_call>``), after text or none."""

    def __init__(self, open_tag: str, close_tag: str, arguments_key: str = "arguments") -> None:
        super().__init__()
        self.open_tag, self.close_tag, self.arguments_key = open_tag, close_tag, arguments_key
        self.text = ""
        self.read_to = 0  # the text before this is read (sent as content, or a call's)
        self.in_call = False  # an open tag was read, its close not yet
        self.closed = False  # the list ended (a repetition, or a call that is not one)

    def feed(self, piece: str) -> ToolAnswer:
        self.text += piece
        content, calls = [], []
        while not self.closed:
            if self.in_call:
                end = self.text.find(self.close_tag, self.read_to)
                if end < 0:
                    break
                call = self._decode(self.text[self.read_to : end])
                self.read_to, self.in_call = end + len(self.close_tag), False
                if call is None or not self.take(call):
                    self.closed = True
                    break
                calls.append(call)
                self.last_end = self.read_to
                continue
            start = self.text.find(self.open_tag, self.read_to)
            if start < 0:
                held = _held_back(self.text, self.open_tag)
                upto = max(self.read_to, len(self.text) - held)
                content.append(self._content(self.read_to, upto))
                self.read_to = upto
                break
            content.append(self._content(self.read_to, start))
            self.read_to, self.in_call = start + len(self.open_tag), True
        return ToolAnswer("".join(content), tuple(calls))

    def _content(self, start: int, end: int) -> str:
        """Text for the user; after the first call only what is not blank between calls."""
        text = self.text[start:end]
        return text if self.count == 0 or text.strip() else ""

    def _decode(self, body: str) -> ToolCall | None:
        try:
            return _call(json.loads(body), self.arguments_key)
        except json.JSONDecodeError:
            return None

    @property
    def pending_from(self) -> int | None:
        """After a call, what follows may yet be cut (a repetition of a call)."""
        return self.last_end if self.count and not self.closed else None

    @property
    def called_tools(self) -> bool:
        """The answer is a complete list of calls (``finish_reason: "tool_calls"``)."""
        return self.count > 0 and not self.in_call

    def finish(self) -> ToolAnswer:
        """The rest: nothing of a call cut off, nor of a tag cut off (the syntax's text,
        not the user's); any other text held back."""
        if self.closed or self.in_call:
            return ToolAnswer("")
        end = len(self.text) - _held_back(self.text, self.open_tag)
        rest = self._content(self.read_to, end)
        self.read_to = len(self.text)
        return ToolAnswer(rest)


class XmlCallReader(TaggedCallReader):
    """Calls in ``<tool_call>`` tags with XML inside (Qwen3-Coder, Qwen3.5):
    ``<function=NAME>`` and a ``<parameter=KEY>`` block per argument, whose value is text.
    ``types`` (tool name -> argument name -> its JSON schema) says how to read a value back:
    a string as it is, a number, boolean or null as such, anything else as JSON; an argument
    of no known type is JSON where it reads as JSON, else text."""

    def __init__(self, types: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__("<tool_call>", "</tool_call>")
        self.types = types or {}

    def _decode(self, body: str) -> ToolCall | None:
        function = _FUNCTION.fullmatch(body)
        if function is None:
            return None
        name, inside = function.group(1), function.group(2)
        types = self.types.get(name, {})
        arguments = {}
        for found in _PARAMETER.finditer(inside):
            key, value = found.group(1), found.group(2)
            arguments[key] = xml_value(value, types.get(key))
        return _call({"name": name, "arguments": arguments}, "arguments")


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>", re.DOTALL)


def xml_value(text: str, schema: Any) -> Any:
    """An argument's value written as text (the template writes a string as it is, anything
    else with ``tojson``, a number or boolean with Python's ``str``), read by its schema."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return text
    lowered = text.strip().lower()
    if kind == "boolean" and lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null") and kind in (None, "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class JsonCallReader(CallList):
    """One call as the whole answer (``{"name": ..., "parameters": {...}}``), or text."""

    def __init__(self, arguments_key: str = "parameters") -> None:
        super().__init__()
        self.arguments_key = arguments_key
        self.text = ""
        self.kind: str | None = None  # "call" once the answer starts with "{", else "text"
        self.sent = 0

    def feed(self, piece: str) -> ToolAnswer:
        self.text += piece
        if self.kind is None and self.text.strip():
            self.kind = "call" if self.text.lstrip().startswith("{") else "text"
        if self.kind == "text":
            delta, self.sent = self.text[self.sent :], len(self.text)
            return ToolAnswer(delta)
        if self.kind == "call" and self.count == 0:
            call = self._whole_call()
            if call is not None and self.take(call):
                return ToolAnswer(None, (call,))
        return ToolAnswer("")

    def _whole_call(self) -> ToolCall | None:
        body = self.text.lstrip()
        try:
            item, _ = _DECODER.raw_decode(body)
        except json.JSONDecodeError:
            return None
        return _call(item, self.arguments_key)

    cut_at = pending_from = None  # one call: nothing repeats

    @property
    def called_tools(self) -> bool:
        return self.count > 0

    def finish(self) -> ToolAnswer:
        if self.kind == "call" and self.count == 0:
            try:
                json.loads(self.text)
            except json.JSONDecodeError:
                return ToolAnswer("")  # a call cut off: nothing to say
            return ToolAnswer(self.text)  # JSON that is no call: the model's text
        if self.kind == "text":
            return ToolAnswer(self.text[self.sent :])
        return ToolAnswer("")


class MarkedCallsReader(CallList):
    """Calls after a marker that opens the answer (``[TOOL_CALLS]``), or text: what the
    readers of Mistral's two syntaxes share. ``_whole_calls`` reads the calls whole so far."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.text = ""
        self.kind: str | None = None  # "calls" once the prefix is read, "text" once it cannot be
        self.sent = 0  # text sent as content
        self.closed = False  # the list ended (its end, a repetition, text that is no call)

    def feed(self, piece: str) -> ToolAnswer:
        self.text += piece
        if self.kind is None:
            head = self.text.lstrip()
            if head.startswith(self.prefix):
                self.kind = "calls"
                self.calls_from(len(self.text) - len(head) + len(self.prefix))
            elif not self.prefix.startswith(head):
                self.kind = "text"
        if self.kind == "text":
            delta, self.sent = self.text[self.sent :], len(self.text)
            return ToolAnswer(delta)
        if self.kind == "calls" and not self.closed:
            return ToolAnswer("", self._whole_calls())
        return ToolAnswer("")

    def calls_from(self, at: int) -> None:
        """The calls start after the marker, at ``at``."""

    def _whole_calls(self) -> tuple[ToolCall, ...]:
        raise NotImplementedError

    @property
    def pending_from(self) -> int | None:
        return self.last_end if self.kind == "calls" and not self.closed else None

    def finish(self) -> ToolAnswer:
        if self.kind == "text":
            return ToolAnswer(self.text[self.sent :])
        if self.kind is None and not self.text.strip():
            return ToolAnswer(self.text)
        return ToolAnswer("")  # calls, or the marker cut off: nothing more to say


class PrefixedListReader(MarkedCallsReader):
    """A marker, then a JSON list of calls (``[TOOL_CALLS][{...}, {...}]``), or text."""

    def __init__(self, prefix: str, arguments_key: str = "arguments") -> None:
        super().__init__(prefix)
        self.arguments_key = arguments_key
        self.item_start = 0  # where the next item of the list may start
        self.opened = False  # the list's bracket was read

    def calls_from(self, at: int) -> None:
        self.item_start = self.last_end = at

    def _whole_calls(self) -> tuple[ToolCall, ...]:
        if not self.opened:  # the list's bracket, after the marker
            bracket = self.text.find("[", self.item_start)
            if bracket < 0:
                return ()
            self.opened, self.item_start = True, bracket + 1
        calls = []
        for item, end in whole_items(self.text, self.item_start):
            call = None if item is LIST_END else _call(item, self.arguments_key)
            if call is None or not self.take(call):
                self.closed = True
                break
            calls.append(call)
            self.item_start = self.last_end = end
        return tuple(calls)

    @property
    def called_tools(self) -> bool:
        return self.count > 0 and (self.closed or self.repeated)


class NamedCallsReader(MarkedCallsReader):
    """A marker, a tool's name and its JSON arguments per call (``[TOOL_CALLS]name[ARGS]{...}``
    once per call, Small 3.2's past calls with a ``[CALL_ID]``), or text."""

    def __init__(self, prefix: str = "[TOOL_CALLS]") -> None:
        super().__init__(prefix)
        self.head = re.compile(rf"\s*{re.escape(prefix)}([^\[]+?)(?:\[CALL_ID\][A-Za-z0-9]+)?\[ARGS\]")
        self.at = 0  # where the next call (its marker) may start

    def _whole_calls(self) -> tuple[ToolCall, ...]:
        calls = []
        while not self.closed:
            found = self.head.match(self.text, self.at)
            if found is None:
                rest = self.text[self.at :].lstrip()
                self.closed = not (self.prefix.startswith(rest) or rest.startswith(self.prefix))
                break  # the next call's head is not whole yet, or there is none
            try:
                arguments, end = _DECODER.raw_decode(self.text, found.end())
            except json.JSONDecodeError:
                break  # not whole yet
            call = _call({"name": found.group(1), "arguments": arguments}, "arguments")
            if call is None or not self.take(call):
                self.closed = True
                break
            calls.append(call)
            self.at = self.last_end = end
        return tuple(calls)

    @property
    def called_tools(self) -> bool:
        """Whole calls and nothing after them but a repetition (not half a call)."""
        return self.count > 0 and (self.repeated or not self.text[self.last_end :].strip())


def _held_back(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
