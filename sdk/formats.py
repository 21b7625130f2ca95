"""Typed outputs: the :class:`OutputFormat` an ``Output(...)`` asks for, and how a value of
that format is read back.

``Output(schema=Model)`` takes any class with pydantic's two class methods,
``model_json_schema()`` (what the server constrains the generation to) and
``model_validate_json(text)`` (what ``var.get()`` returns), so the SDK needs no pydantic
of its own; a dict is taken as the JSON schema itself, and its values are read as plain
JSON. Everything wrong with a format is a :class:`DefinitionError` here, before anything
is sent; whether the server's grammar library can compile it is the server's 400.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from parrot.sdk.errors import DefinitionError
from parrot.wire.formats import OutputFormat

# The keyword arguments of Output that pick a format, as the user writes them.
FORMAT_ARGS = ("schema", "json_object", "regex", "choice", "grammar", "format")


@dataclass(frozen=True)
class ValueType:
    """What an output's value is: its wire format, and the class that reads a JSON value
    (a pydantic model; None: read as plain JSON). Values of a regex, choice or grammar
    format are texts."""

    format: OutputFormat
    model: Any = None

    def parse(self, text: str) -> Any:
        """The value of ``text``: an instance of :attr:`model`, parsed JSON, or the text."""
        if self.model is not None:
            return self.model.model_validate_json(text)
        if self.format.is_json:
            return json.loads(text)
        return text

    @classmethod
    def untyped_json(cls, format: OutputFormat | Mapping[str, Any] | None) -> ValueType | None:
        """How a variable that this client did not type is read, from the format the
        server reports for it: JSON as plain JSON, anything else as text (None)."""
        if isinstance(format, Mapping):
            format = msgspec.convert(format, OutputFormat)
        return cls(format) if format is not None and format.is_json else None


def value_type(given: Mapping[str, Any]) -> ValueType | None:
    """The value type of ``Output``'s format arguments (those of :data:`FORMAT_ARGS` that
    are set); None when none is. Raises :class:`DefinitionError` for two formats at once,
    a schema of the wrong kind, or a format the wire contract refuses."""
    chosen = {k: v for k, v in given.items() if v is not None and v is not False}
    if not chosen:
        return None
    shown = ", ".join(f"{k}={_short(v)}" for k, v in chosen.items())
    if len(chosen) > 1:
        raise DefinitionError(
            f"Output({shown}): an output has one format; give one of schema, json_object, regex, "
            "choice, grammar or format"
        )
    (kind, value), model = next(iter(chosen.items())), None
    if kind == "format":
        return ValueType(_convert(value, shown))
    if kind == "schema":
        value, model = _schema(value, shown)
        kind = "json_schema"
    if kind == "choice" and (isinstance(value, str) or not isinstance(value, list | tuple)):
        raise DefinitionError(f"Output({shown}): choice takes a list of strings")
    return ValueType(_convert({kind: list(value) if kind == "choice" else value}, shown), model)


def _schema(schema: Any, shown: str) -> tuple[dict[str, Any], Any]:
    """A JSON schema and its model class, from a pydantic-like class or a dict."""
    if isinstance(schema, Mapping):
        return dict(schema), None
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        if not callable(getattr(schema, "model_validate_json", None)):
            raise DefinitionError(f"Output({shown}): {schema.__name__} has no model_validate_json")
        return schema.model_json_schema(), schema
    raise DefinitionError(
        f"Output({shown}): schema takes a pydantic model class (anything with model_json_schema "
        f"and model_validate_json) or a JSON schema dict, not {type(schema).__name__}"
    )


def _convert(value: Any, shown: str) -> OutputFormat:
    if isinstance(value, OutputFormat):
        return value
    try:
        return msgspec.convert(value, OutputFormat)
    except (msgspec.ValidationError, ValueError) as error:
        raise DefinitionError(f"Output({shown}): {error}") from None


def _short(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
