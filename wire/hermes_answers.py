"""The reader of a Hermes answer (Qwen2.5, Qwen3, Hermes 2 Pro / 3: issue 36 §2): calls in
``<tool_call>`` tags after text or none (:class:`~parrot.wire.tool_readers.TaggedCallReader`),
or one call as the whole answer, untagged or in a JSON code fence
(:class:`~parrot.wire.tool_readers.JsonCallReader`)."""

from __future__ import annotations

import re

from parrot.wire.tool_calls import ToolAnswer
from parrot.wire.tool_readers import JsonCallReader, TaggedCallReader


class TaggedOrBareReader:
    """Hermes answers: calls in tags after text or none, or one call object as the whole
    answer, untagged or in a JSON code fence, which is what small Qwen models often write
    instead (llama.cpp's server takes both too). Decided once the answer's start shows it."""

    def __init__(self, open_tag: str, close_tag: str, arguments_key: str = "arguments") -> None:
        self._tagged = TaggedCallReader(open_tag, close_tag, arguments_key)
        self._bare = JsonCallReader(arguments_key)
        self._reader: TaggedCallReader | JsonCallReader | None = None
        self._start = ""  # the answer's start, until it shows which it is
        self.given_calls = 0  # the calls the reader's user has sent (as CallList's)

    def feed(self, piece: str) -> ToolAnswer:
        if self._reader is None:
            self._start += piece
            head = self._start.lstrip()
            fence = _FENCED_CALL.match(head)
            if not head or (fence is None and any(f.startswith(head) for f in _FENCES)):
                return ToolAnswer("")  # blanks, or what may yet open a fenced call
            self._reader = self._bare if head.startswith("{") or fence else self._tagged
            piece = head[fence.end() - 1 :] if fence else self._start
        return self._reader.feed(piece)

    def finish(self) -> ToolAnswer:
        return self._reader.finish() if self._reader else ToolAnswer(self._start)

    @property
    def called_tools(self) -> bool:
        return self._reader is not None and self._reader.called_tools

    @property
    def cut_at(self) -> int | None:
        return self._reader.cut_at if self._reader else None

    @property
    def pending_from(self) -> int | None:
        return self._reader.pending_from if self._reader else None


_FENCES = ("```json\n{", "```\n{")
_FENCED_CALL = re.compile(r"```(?:json)?\n\s*\{")
