"""An answer in the generic tool format (:mod:`parrot.wire.tool_calls`) read as it streams.

A ``{"response": "..."}`` answer streams as content: the JSON string's text is decoded as
its characters arrive (an escape sequence is held back until it is whole). Each item of a
``{"tool_calls": [...]}`` answer comes out as a whole call once its JSON is complete
(OpenAI clients assemble a call from one fragment as from many). Text that is not in the
format (a generation cut off before its first key) comes out as content at the end.
"""

from __future__ import annotations

import json
import re

from parrot.wire.tool_calls import ToolAnswer, call_of, parse_answer

_FIRST_KEY = re.compile(r'\s*\{\s*"(tool_calls|response)"\s*:\s*(\S)')  # and the value's first character
_BETWEEN_ITEMS = re.compile(r"[\s,]*")
_HEX = frozenset("0123456789abcdefABCDEF")
_DECODER = json.JSONDecoder()


class AnswerStream:
    """The text of one generation, fed piece by piece: :meth:`feed` gives what to send now
    (content, complete calls); :meth:`finish` the rest. ``given_calls`` counts the calls
    its reader has sent (their ``index``)."""

    def __init__(self) -> None:
        self.text = ""
        self.kind: str | None = None  # "tool_calls" or "response", once the first key is read
        self.body_start = 0  # where the value's body starts (after its quote or bracket)
        self.sent = ""  # the response's text sent so far
        self.closed = False  # the response's string, or the list of calls, has ended
        self.called = 0  # calls read from a tool_calls list
        self.given_calls = 0

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
        while True:
            start = _BETWEEN_ITEMS.match(self.text, self.body_start).end()
            if self.text.startswith("]", start):
                self.closed = True
                break
            try:
                item, end = _DECODER.raw_decode(self.text, start)
            except json.JSONDecodeError:
                break  # not complete yet
            call = call_of(item)
            if call is None:
                break  # not a call: the constraint was not this format; nothing more is read
            calls.append(call)
            self.body_start = end
        self.called += len(calls)
        return tuple(calls)

    @property
    def called_tools(self) -> bool:
        """The answer is a complete list of calls (``finish_reason: "tool_calls"``)."""
        return self.kind == "tool_calls" and self.closed and self.called > 0

    def finish(self) -> ToolAnswer:
        """The rest: content not sent yet, calls not given yet."""
        if self.kind == "response":  # its text went out as it came (a cut-off one ends there)
            answer = parse_answer(self.text)
            whole = answer.content if answer is not None and answer.content is not None else self.sent
            return ToolAnswer(whole[len(self.sent) :])
        if self.kind == "tool_calls" and self.called:
            return ToolAnswer(None, () if self.closed else self._complete_calls())
        answer = parse_answer(self.text)
        return ToolAnswer(self.text) if answer is None else answer


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
