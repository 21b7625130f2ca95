"""Output formats: what a generation's text must be (issue 21).

One format per generation: a JSON schema, a JSON object of any shape, a regular
expression, a choice among strings, or a grammar (Lark syntax, as llguidance reads it).
Part of the wire contract (the SDK builds these; engines and the ServeCore read them), so
this module checks only the shape; whether a schema, regex or grammar compiles is the
engine's grammar library's call (a 400 that names the problem).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

# Bounds on a format's size on the wire. A schema is bounded by its JSON text
# (``OutputFormat.size``), checked by the engine and the ServeCore against their limit.
MAX_CHOICES: Final = 1024
MAX_PATTERN_CHARS: Final = 65_536

Choice = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PATTERN_CHARS)]
Pattern = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PATTERN_CHARS)]

KINDS: Final = ("json_schema", "json_object", "regex", "choice", "grammar")


class OutputFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Exactly one of the fields is set:

    - ``json_schema``: the value is JSON matching this schema;
    - ``json_object: true``: the value is a JSON object (any keys);
    - ``regex``: the whole value matches this regular expression;
    - ``choice``: the value is one of these strings;
    - ``grammar``: the value is in the language of this Lark grammar (llguidance's dialect).
    """

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: Pattern | None = None
    choice: Annotated[list[Choice], msgspec.Meta(min_length=1, max_length=MAX_CHOICES)] | None = None
    grammar: Pattern | None = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                "a format sets exactly one of json_schema, json_object (true), regex, choice, grammar"
                + (f"; got {', '.join(given)}" if given else "; got none")
            )
        if self.choice is not None and len(set(self.choice)) != len(self.choice):
            raise ValueError("the choices of a format must be distinct")

    @property
    def kind(self) -> str:
        """Which of the five kinds this format is."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def is_json(self) -> bool:
        """True when the value is JSON (a schema or any object): its fields can be read."""
        return self.json_schema is not None or self.json_object

    def size(self) -> int:
        """Characters of the format's JSON: what the size limits bound."""
        return len(msgspec.json.encode(self))

    def key(self) -> bytes:
        """A canonical encoding (sorted keys): equal formats have equal keys (a cache key)."""
        return msgspec.json.encode(msgspec.to_builtins(self), order="sorted")
