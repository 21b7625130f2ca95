"""The steps of a native string transform (``POST /v1/semantic_transform``), as data: the
client sends them, the ServeCore validates them with these types and applies them
(:mod:`parrot.platform.serve.calls.transforms`). Never code from a request.

``strip``/``lower``/``upper``/``regex``/``json_field``/``split_take`` apply to each value,
``join`` and ``format`` combine all values into one; each step is an object whose ``type``
names it (``{"type": "regex", "pattern": "[0-9]+"}``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_PATTERN = 512


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
