"""An answer in the generic tool format (:mod:`parrot.wire.tool_calls`) read as it streams.

A ``{"response": "..."}`` answer streams as content: the JSON string's text is decoded as
its characters arrive (an escape sequence is held back until it is whole). Each item of a
``{"tool_calls": [...]}`` answer comes out as a whole call once its JSON is complete
(OpenAI clients assemble a call from one fragment as from many). A call the list already
holds (same name, same arguments) ends it: a small model, asked for calls with parallel
calls on, repeats its one call until ``max_tokens`` (issue 36). The format's own text never
comes out as content: a list cut by ``max_tokens`` gives the calls that are whole, an
answer cut before its first key gives nothing. Text that is not in the format at all (a
model not held to it) comes out as content at the end.
"""

from __future__ import annotations

import json
import re

from parrot.wire.tool_calls import ToolAnswer, call_of, parse_answer
from parrot.wire.tool_readers import LIST_END, CallList, whole_items

_FIRST_KEY = re.compile(r'\s*\{\s*"(tool_calls|response)"\s*:\s*(\S)')  # and the value's first character
_HEX = frozenset("0123456789abcdefABCDEF")
_STARTS = ('{"tool_calls":[', '{"response":"')


class AnswerStream(CallList):
    """The text of one generation, fed piece by piece: :meth:`feed` gives what to send now
    (content, complete calls); :meth:`finish` the rest. ``given_calls`` counts the calls
    its reader has sent (their ``index``)."""

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.kind: str | None = None  # "tool_calls" or "response", once the first key is read
        self.body_start = 0  # where the value's body starts (after its quote or bracket)
        self.sent = ""  # the response's text sent so far
        self.closed = False  # the response's string, or the list of calls, has ended

    def feed(self, piece: str) -> ToolAnswer:
        self.text += piece
        if self.kind is None:
            match = _FIRST_KEY.match(self.text)
            if match is None:
                return ToolAnswer("")
            self.kind = match.group(1)
            if match.group(2) != {"response": '"', "tool_calls": "["}[self.kind]:
                self.kind = "other"  # a value of another type: the answer comes out at the end
            self.body_start = match.end()
        if self.closed:
            return ToolAnswer("")
        if self.kind == "response":
            return ToolAnswer(self._response_delta())
        if self.kind == "tool_calls":
            return ToolAnswer(None, self._complete_calls())
        return ToolAnswer("")

    def _response_delta(self) -> str:
        body = self.text[self.body_start :]
        end = _safe_end(body)
        if end < len(body) and body[end] == '"':
            self.closed = True
        decoded = json.loads(f'"{body[:end]}"')
        delta = decoded[len(self.sent) :]
        self.sent = decoded
        return delta

    def _complete_calls(self) -> tuple:
        calls = []
        for item, end in whole_items(self.text, self.body_start):
            if item is LIST_END:
                self.closed = True
                break
            call = call_of(item)
            if call is None:
                break  # not a call: the constraint was not this format; nothing more is read
            if not self.take(call):  # the model loops: the list ends with the calls before
                self.closed = True
                break
            calls.append(call)
            self.body_start = end
        return tuple(calls)

    @property
    def cut_at(self) -> int | None:
        """Where the text ends once a call came again (its list closes there)."""
        return self.body_start if self.repeated else None

    @property
    def pending_from(self) -> int | None:
        """Where the call being written starts, within the list (its text may yet be cut)."""
        return self.body_start if self.kind == "tool_calls" and not self.closed else None

    @property
    def called_tools(self) -> bool:
        """The answer is a complete list of calls (``finish_reason: "tool_calls"``)."""
        return self.kind == "tool_calls" and self.closed and self.count > 0

    def finish(self) -> ToolAnswer:
        """The rest: content not sent yet, calls not given yet."""
        if self.kind == "response":  # its text went out as it came (a cut-off one ends there)
            answer = parse_answer(self.text)
            whole = answer.content if answer is not None and answer.content is not None else self.sent
            return ToolAnswer(whole[len(self.sent) :])
        if self.kind == "tool_calls":  # the whole calls; never the list's text
            return ToolAnswer(None, () if self.closed else self._complete_calls())
        answer = parse_answer(self.text)
        if answer is not None:
            return answer
        if self.kind is None and _format_start(self.text):
            return ToolAnswer(None)  # cut before its first key: nothing to say yet
        return ToolAnswer(self.text)


def read_answer(text: str) -> tuple[ToolAnswer, bool]:
    """A whole generation read as a tool answer (what a stream of it gives in all), and
    whether it is a complete list of calls (``finish_reason: "tool_calls"``)."""
    stream = AnswerStream()
    first, rest = stream.feed(text), stream.finish()
    calls = (*first.tool_calls, *rest.tool_calls)
    if calls or stream.kind == "tool_calls":
        return ToolAnswer(None, calls), stream.called_tools
    content = (first.content or "") + (rest.content or "")
    return ToolAnswer(content if content or stream.kind == "response" else None), False


def _format_start(text: str) -> bool:
    """``text`` is the start of an answer in the format, before its first key is whole."""
    compact = "".join(text.split())
    return any(start.startswith(compact) for start in _STARTS)


def _safe_end(body: str) -> int:
    """The end of the longest prefix of a JSON string's body that decodes whole: up to its
    closing quote, before an unfinished escape (or a high surrogate waiting for its pair)."""
    i = 0
    while i < len(body):
        char = body[i]
        if char == '"':
            return i
        if char != "\\":
            i += 1
            continue
        if i + 1 >= len(body):
            return i
        if body[i + 1] != "u":
            i += 2
            continue
        digits = body[i + 2 : i + 6]
        if len(digits) < 4 or not set(digits) <= _HEX:
            return i
        if 0xD800 <= int(digits, 16) <= 0xDBFF and len(body) < i + 12:
            return i  # a high surrogate: its low half is the next escape
        i += 6
    return i
