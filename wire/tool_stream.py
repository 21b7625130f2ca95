"""An answer in the generic tool format (:mod:`parrot.wire.tool_calls`) read as it streams.

A ``{"response": "..."}`` answer streams as content: the JSON string's text is decoded as
its characters arrive (an escape sequence is held back until it is whole). A
``{"tool_calls": [...]}`` answer is parsed when it is complete, and each call comes out
whole (OpenAI clients assemble the same calls from one fragment as from many). Text that
is not in the format (a generation cut off before its first key) comes out as content.
"""

from __future__ import annotations

import json
import re

from parrot.wire.tool_calls import ToolAnswer, parse_answer

_FIRST_KEY = re.compile(r'\s*\{\s*"(tool_calls|response)"\s*:\s*(\S)')  # and the value's first character
_HEX = frozenset("0123456789abcdefABCDEF")


class AnswerStream:
    """The text of one generation, fed piece by piece: :meth:`feed` gives the content to
    send now; :meth:`finish` the rest of it and the tool calls (if the answer has any)."""

    def __init__(self) -> None:
        self.text = ""
        self.kind: str | None = None  # "tool_calls" or "response", once the first key is read
        self.body_start = 0  # where the response's string starts (after its quote)
        self.sent = ""  # the response's text sent so far
        self.closed = False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.kind is None:
            match = _FIRST_KEY.match(self.text)
            if match is None:
                return ""
            self.kind = match.group(1)
            if self.kind == "response" and match.group(2) != '"':
                self.kind = "other"  # a response that is not a string: it comes out at the end
            self.body_start = match.end()
        if self.kind != "response" or self.closed:
            return ""
        return self._response_delta()

    def _response_delta(self) -> str:
        body = self.text[self.body_start :]
        end = _safe_end(body)
        if end < len(body) and body[end] == '"':
            self.closed = True
        decoded = json.loads(f'"{body[:end]}"')
        delta = decoded[len(self.sent) :]
        self.sent = decoded
        return delta

    def finish(self) -> ToolAnswer:
        """The rest of the content (what was not sent yet) and the tool calls."""
        answer = parse_answer(self.text)
        if self.kind == "response":  # its text went out as it came (a cut-off one ends there)
            whole = answer.content if answer is not None and answer.content is not None else self.sent
            return ToolAnswer(whole[len(self.sent) :])
        if answer is None:
            return ToolAnswer(self.text)
        return answer


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
