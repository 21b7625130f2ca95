"""Typed semantic variables: what the ServeCore checks of a format and of a value, and how
a placeholder reads a field of a JSON value (issue 21).

- :func:`check_format`: a format given by a client (400 ``bad_format``, 413
  ``format_too_large`` over the ``max_format_chars`` limit), before anything is created:
  what the engines' grammar library accepts (:mod:`parrot.engines.protocol.grammar`, the
  same check the builtin engine makes) and what the ServeCore's JSON-schema validator
  can check values against; :class:`FormatProbe` then compiles it and prepares its first
  token (off the event loop, with a time budget), so that a format no text can start, or
  one too costly to prepare, is a 400 at submit and not a failed call later.
- :func:`mismatch`: why a value does not match its variable's format (None: it does). Every
  value a typed variable gets passes here, whatever produced it (the builtin engine, whose
  decoding the format constrains; an OpenAI endpoint, which may ignore the request; a
  client's set), so an invalid value is never stored as valid. Regex and Lark-grammar
  values are matched by llguidance, the engine's own library (one dialect, no backtracking).
- :func:`unreachable`: why a JSON schema cannot have a field path (None: it may have it),
  for a ``{{plan.steps[0]}}`` checked at submit time.
- :func:`read_field`: the text a field path fills in: a string as it is, other JSON as
  compact JSON.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import jsonschema_rs
import msgspec
import regex

from parrot.engines.protocol import grammar
from parrot.engines.protocol.errors import BadFormatError, FormatTooLargeError
from parrot.platform.serve.limits.settings import describe
from parrot.wire.formats import OutputFormat
from parrot.wire.template import PathStep, field_text, format_path

MAX_REF_DEPTH: Final = 32  # $ref hops followed while walking a schema for a path


class FieldError(Exception):
    """A field path is not in a value (the message says where it stops)."""


def check_format(fmt: OutputFormat, max_chars: int) -> None:
    """Raise 413 when ``fmt`` is over ``max_format_chars``, 400 when it cannot be used."""
    size = fmt.size()
    if size > max_chars:
        raise FormatTooLargeError(
            f"the format has {size} characters, over the limit {describe('max_format_chars', max_chars)}"
        )
    grammar.check_format(fmt, max_chars)
    if fmt.json_schema is not None:
        try:
            jsonschema_rs.meta.validate(fmt.json_schema, registry=grammar.offline_registry())
            jsonschema_rs.validator_for(fmt.json_schema, offline=True)
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as error:
            raise BadFormatError(f"invalid json_schema: {_first_line(error)}") from None


class FormatProbe:
    """The deep check of a client's format (:func:`grammar.probe`), which may take as long as
    a hostile format makes it: in worker threads, at most ``at_once`` at a time (a probe over
    its budget answers 400 but keeps its thread until it ends, so a flood of costly formats
    waits here instead of piling up threads), each format's success remembered."""

    def __init__(self, budget_s: float = 2.0, at_once: int = 2, remembered: int = 1024) -> None:
        self.budget_s = budget_s
        self._pool = ThreadPoolExecutor(at_once, thread_name_prefix="format-probe")
        self._slots = asyncio.Semaphore(at_once)
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._remembered = remembered

    def passed(self, fmt: OutputFormat) -> bool:
        """``fmt`` passed a probe (and every check before it) lately."""
        key = msgspec.json.encode(fmt)
        if key in self._passed:
            self._passed.move_to_end(key)
            return True
        return False

    async def check(self, fmt: OutputFormat) -> None:
        key = msgspec.json.encode(fmt)
        if key in self._passed:
            return
        await self._slots.acquire()
        future = asyncio.get_running_loop().run_in_executor(self._pool, grammar.probe, fmt)
        future.add_done_callback(lambda _: self._slots.release())
        try:
            await asyncio.wait_for(asyncio.shield(future), self.budget_s)
        except TimeoutError:
            limit = describe("max_format_probe_ms", round(self.budget_s * 1000))
            raise BadFormatError(
                f"the format took over {self.budget_s:g} s to compile and prepare its first tokens "
                f"(the engine would spend that on every call of it), the limit {limit}: simplify it"
            ) from None
        self._passed[key] = None
        if len(self._passed) > self._remembered:
            self._passed.popitem(last=False)


def mismatch(fmt: OutputFormat, value: str) -> str | None:
    """Why ``value`` does not match ``fmt`` (None when it does)."""
    if fmt.choice is not None:
        if value in fmt.choice:
            return None
        shown = ", ".join(repr(c) for c in fmt.choice[:8]) + (", ..." if len(fmt.choice) > 8 else "")
        return f"{_quote(value)} is not one of the choices {shown}"
    if fmt.regex is not None or fmt.grammar is not None:
        # llguidance, as the engine generates: one regex dialect (Rust's), Lark grammars
        # checked too, and no backtracking whatever the pattern
        why = grammar.text_mismatch(fmt, value)
        shown = f"the regex {fmt.regex[:200]!r}" if fmt.regex is not None else "the grammar"
        return None if why is None else f"{_quote(value)} does not match {shown}: {why}"
    if fmt.is_json:
        try:
            data = json.loads(value)
        except (ValueError, RecursionError) as error:  # nesting deeper than Python's stack
            return f"{_quote(value)} is not JSON ({error})"
        if fmt.json_object:
            return None if isinstance(data, dict) else f"{_quote(value)} is not a JSON object"
        try:
            jsonschema_rs.validator_for(fmt.json_schema, offline=True).validate(data)
        except jsonschema_rs.ValidationError as error:
            where = format_path(list(error.instance_path)) or "the value"
            return f"{where} does not match the json_schema: {error.message}"
        except (ValueError, RecursionError) as error:  # a value too deep to convert
            return f"the value could not be checked against the json_schema: {error}"
    return None


def read_field(value: str, path: Sequence[PathStep]) -> str:
    """The text ``{{name<path>}}`` fills in for a variable holding ``value``. Raises
    :class:`FieldError` when the value is not JSON or has no such field."""
    try:
        data: Any = json.loads(value)
    except (ValueError, RecursionError):
        raise FieldError(f"its value is not JSON: {_quote(value)}") from None
    for n, step in enumerate(path):
        in_list = isinstance(step, int) and isinstance(data, list) and step < len(data)
        if in_list or (isinstance(step, str) and isinstance(data, dict) and step in data):
            data = data[step]
        else:
            at = format_path(path[:n]) or "the value"
            raise FieldError(f"{at} has no {format_path([step])}: it is {_describe(data)}")
    return field_text(data)


def unreachable(schema: Any, path: Sequence[PathStep]) -> str | None:
    """Why no value valid under ``schema`` can have ``path`` (None: some value may). Only
    what the schema rules out for sure: a field it does not allow (``additionalProperties:
    false``), an index past ``maxItems``, a step into a type that has no fields."""
    return _walk(schema, schema, tuple(path), 0, 0)


def _walk(root: Any, schema: Any, path: tuple[PathStep, ...], at: int, refs: int) -> str | None:
    if at == len(path) or schema is True or not isinstance(schema, dict):
        return (
            None
            if schema is not False
            else f"the schema allows nothing at {format_path(path[:at]) or 'the top'}"
        )
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and refs < MAX_REF_DEPTH:
        target = _resolve(root, ref)
        if target is not None:
            why = _walk(root, target, path, at, refs + 1)
            if why is not None:
                return why
    for branch in schema.get("allOf", []):
        why = _walk(root, branch, path, at, refs)
        if why is not None:
            return why
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            reasons = [_walk(root, b, path, at, refs) for b in branches]
            if all(reasons):
                return reasons[0]
    return _step(root, schema, path, at, refs)


def _step(root: Any, schema: dict, path: tuple[PathStep, ...], at: int, refs: int) -> str | None:
    step, here = path[at], format_path(path[:at]) or "the top"
    want = "object" if isinstance(step, str) else "array"
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    if isinstance(types, list) and want not in types:
        has = " or ".join(map(str, types))
        return f"the schema has {has} at {here}, not an {want}: no {format_path([step])}"
    if isinstance(step, str):
        props = schema.get("properties")
        if isinstance(props, dict) and step in props:
            return _walk(root, props[step], path, at + 1, refs)
        for pattern, sub in (schema.get("patternProperties") or {}).items():
            if regex.search(pattern, step):
                return _walk(root, sub, path, at + 1, refs)
        extra = schema.get("additionalProperties", True)
        if extra is False:
            return f"the schema allows no field {step!r} at {here}"
        return _walk(root, extra, path, at + 1, refs) if isinstance(extra, dict) else None
    limit = schema.get("maxItems")
    if isinstance(limit, int) and step >= limit:
        return f"the schema allows at most {limit} items at {here}: no [{step}]"
    prefix = schema.get("prefixItems")
    items = schema.get("items")
    if isinstance(items, list):  # draft 7 tuples
        prefix, items = items, schema.get("additionalItems", True)
    if isinstance(prefix, list):
        if step < len(prefix):
            return _walk(root, prefix[step], path, at + 1, refs)
        if items is False:
            return f"the schema allows {len(prefix)} items at {here}: no [{step}]"
    return _walk(root, items, path, at + 1, refs) if isinstance(items, dict) else None


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.lstrip("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _describe(data: Any) -> str:
    if isinstance(data, list):
        return f"an array of {len(data)} items"
    if isinstance(data, dict):
        keys = ", ".join(repr(k) for k in list(data)[:8]) + (", ..." if len(data) > 8 else "")
        return f"an object with the fields {keys}" if data else "an empty object"
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "a boolean"
    return "a number" if isinstance(data, int | float) else "a string"


def _quote(value: str, limit: int = 200) -> str:
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"


def _first_line(error: Exception) -> str:
    return str(getattr(error, "message", None) or error).splitlines()[0][:500]
