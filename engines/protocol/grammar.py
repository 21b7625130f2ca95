"""Output formats as llguidance grammars, and the check of a format at the edge (issue 21).

Free of engine state, so both the builtin engine (before it compiles a format for its
tokenizer) and the ServeCore (when a call is submitted) check a format the same way and
answer a bad one with the same 4xx.

What each kind becomes (:func:`to_grammar`):

- ``json_schema``: llguidance's JSON-schema grammar in one fixed layout, Python's
  ``json.dumps``: ``", "`` and ``": "`` as separators, no other whitespace outside strings
  (``{"a": 1, "b": [true]}``). Free whitespace would let a small model pad its answer with
  newlines forever; a fixed layout makes every key and separator forced text, which
  jump-forward fills without decode steps; and this one is the layout models write (the
  compact one made a 0.5B model loop: see ``JSON_OPTIONS``).
  What llguidance cannot enforce while decoding (``oneOf`` as such, ``uniqueItems``,
  ``not``, ``dependencies``, ``if``/``then``, ``propertyNames``, string formats it does not
  know, ...: a third of JSONSchemaBench's GitHub-Hard schemas, issue 36) is not refused:
  such a schema compiles leniently (those keywords skipped, ``oneOf`` taken as ``anyOf``)
  and every whole answer is checked against the schema itself (:func:`check_answer`,
  ``jsonschema_rs`` with format checks): one that breaks it fails its call with a 422
  that says where, never passes as valid.
- ``json_object``: the same for the schema ``{"type": "object"}``: any object.
- ``regex``: the whole text matches it (Rust ``regex`` syntax, as llguidance reads it).
- ``choice``: a regex alternation of the strings, each escaped, so exactly one of them.
- ``grammar``: a Lark grammar in llguidance's dialect (``start`` is the text).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import OrderedDict
from typing import Any, Final

import jsonschema_rs
import llguidance
import msgspec

from parrot.engines.protocol.errors import BadFormatError, FormatTooLargeError, SchemaUnmetError
from parrot.wire.formats import OutputFormat

DEFAULT_MAX_FORMAT_CHARS: Final = 65_536
MAX_FORMAT_FLAG: Final = "--max-format-chars"

# How llguidance compiles JSON schemas here (see the module's docstring): compact JSON
# (llguidance's default separators) made Qwen2.5-Coder-0.5B loop to max_tokens on 24 of 80
# JSONSchemaBench schemas, against 16 in this layout (docs/benchmarks.md).
JSON_OPTIONS: Final = {
    "whitespace_flexible": False,
    "lenient": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# A schema the strict options refuse for what cannot be enforced while decoding.
RELAXED_OPTIONS: Final = {**JSON_OPTIONS, "lenient": True, "coerce_one_of": True}
ANY_OBJECT: Final = {"type": "object"}

PROBE_WALK_BYTES: Final = 32  # bytes of a text the probe walks after the first mask
# The characters Rust's ``regex_syntax::escape`` escapes (Python's ``re.escape`` escapes
# others, e.g. ``!``, that Rust's syntax refuses to see escaped).
_REGEX_META: Final = frozenset("\\.+*?()|[]{}^$#&-~")


def escape_regex(text: str) -> str:
    """``text`` as a regex that matches exactly it (llguidance's Rust syntax)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def to_grammar(fmt: OutputFormat) -> str:
    """The llguidance grammar of a format (not yet checked: see :func:`check_grammar`)."""
    M = llguidance.LLMatcher
    if fmt.json_schema is not None:
        return _schema_grammar(fmt.json_schema)[0]
    if fmt.json_object:
        return M.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_OPTIONS)
    if fmt.regex is not None:
        return M.grammar_from_regex(fmt.regex)
    if fmt.choice is not None:
        return M.grammar_from_regex("|".join(f"({escape_regex(c)})" for c in fmt.choice))
    if fmt.grammar is not None:
        return M.grammar_from_lark(fmt.grammar)
    raise BadFormatError("the format sets none of json_schema, json_object, regex, choice, grammar")


def _compile_schema(schema: dict) -> tuple[str, jsonschema_rs.Validator | None]:
    """The grammar of a JSON schema, and (where that grammar is the lenient one) the
    validator every answer must pass: see the module's docstring."""
    M = llguidance.LLMatcher
    try:
        strict = M.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as error:  # not a JSON object
        raise BadFormatError(f"invalid JSON schema: {error}") from error
    if not M.validate_grammar(strict, None):
        return strict, None
    relaxed = M.grammar_from_json_schema(schema, defaults=RELAXED_OPTIONS)
    try:  # an answer can be checked only where the schema can be read whole, offline
        answers = jsonschema_rs.validator_for(schema, validate_formats=True, registry=offline_registry())
    except (ValueError, jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError):
        return strict, None  # (the strict grammar's error is the 400)
    if M.validate_grammar(relaxed, None):
        return strict, None  # relaxing does not help: the strict error says why
    return relaxed, answers


SCHEMAS_KEPT: Final = 256
_schemas: OrderedDict[bytes, tuple[str, jsonschema_rs.Validator | None]] = OrderedDict()
_schemas_lock = threading.Lock()


def _schema_grammar(schema: Any) -> tuple[str, jsonschema_rs.Validator | None]:
    """:func:`_compile_schema`, the latest ``SCHEMAS_KEPT`` kept (keyed by the schema's JSON as
    given: its properties' order is the answer's), compiled outside the lock."""
    if not isinstance(schema, dict):
        try:  # llguidance's own answer to what is not a schema object
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS), None
        except ValueError as error:
            raise BadFormatError(f"invalid JSON schema: {error}") from error
    key = msgspec.json.encode(schema)
    with _schemas_lock:
        if (kept := _schemas.get(key)) is not None:
            _schemas.move_to_end(key)
            return kept
    compiled = _compile_schema(schema)
    with _schemas_lock:
        _schemas[key] = compiled
        while len(_schemas) > SCHEMAS_KEPT:
            _schemas.popitem(last=False)
    return compiled


async def check_whole_answer(fmt: OutputFormat | None, text: str, finish_reason: str) -> None:
    """:func:`check_answer` off the event loop (a schema evicted from the cache compiles
    again), for answers of JSON schemas only."""
    if fmt is not None and fmt.json_schema is not None and finish_reason == "stop":
        await asyncio.to_thread(check_answer, fmt, text, finish_reason)


def check_answer(fmt: OutputFormat | None, text: str, finish_reason: str) -> None:
    """Raise :class:`SchemaUnmetError` (422) when a whole answer of a JSON schema that was
    compiled leniently breaks the schema (what decoding could not enforce)."""
    if fmt is None or fmt.json_schema is None or finish_reason != "stop":
        return
    answers = _schema_grammar(fmt.json_schema)[1]
    if answers is None:
        return  # the grammar enforced the whole schema
    try:
        problem = next(answers.iter_errors(msgspec.json.decode(text)), None)
    except msgspec.DecodeError as error:
        problem = error
    if problem is not None:
        what = getattr(problem, "message", str(problem))
        raise SchemaUnmetError(
            f"the answer breaks its JSON schema where decoding cannot enforce it (oneOf, "
            f"uniqueItems, not, ... are checked on the whole answer): {what}"
        )


def check_size(fmt: OutputFormat, max_chars: int, flag: str = MAX_FORMAT_FLAG) -> None:
    """413 when the format's JSON is longer than ``max_chars`` (the message names ``flag``)."""
    size = fmt.size()
    if size > max_chars:
        raise FormatTooLargeError(
            f"the output format has {size} characters, over the limit of {max_chars} ({flag})"
        )


def check_grammar(fmt: OutputFormat, grammar: str, tokenizer: llguidance.LLTokenizer | None = None) -> None:
    """400 naming the problem when llguidance rejects the grammar (with ``tokenizer``, also
    what only a tokenizer reveals, e.g. a lexer too complex for its vocabulary)."""
    message = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if message:
        raise BadFormatError(f"bad {_WHAT[fmt.kind]}: {message.strip()}")


def check_format(
    fmt: OutputFormat, max_chars: int = DEFAULT_MAX_FORMAT_CHARS, flag: str = MAX_FORMAT_FLAG
) -> None:
    """Raise :class:`FormatTooLargeError` (413) for a format over the size limit, and
    :class:`BadFormatError` (400, code ``bad_format``) with llguidance's own message for one
    it cannot compile: an invalid schema, an unimplemented keyword, a bad regex or Lark
    grammar. Cheap (no tokenizer): the engine still compiles the format for its vocabulary."""
    check_size(fmt, max_chars, flag)
    check_grammar(fmt, to_grammar(fmt))


_WHAT: Final = {
    "json_schema": "JSON schema",
    "json_object": "JSON object format",
    "regex": "regex",
    "choice": "choice",
    "grammar": "Lark grammar",
}


class _Bytes:
    """A tokenizer of one token a byte (and an end token), for llguidance to match text."""

    tokens: Final = [bytes([b]) for b in range(256)] + [b"<end>"]
    eos_token_id: Final = 256
    bos_token_id: Final = None
    special_token_ids: Final = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


@functools.cache
def _byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), slices=[])


_compiled_lock = threading.Lock()


@functools.lru_cache(maxsize=256)
def _compiled(grammar: str) -> llguidance.LLMatcher:
    """A fresh matcher of ``grammar`` over bytes, compiled once (callers take a copy)."""
    return llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)


def text_mismatch(fmt: OutputFormat, value: str) -> str | None:
    """Why ``value`` is not a text of ``fmt`` (a regex or a Lark grammar), decided by the
    library and dialect the engine generates with (None: it is). llguidance's lexer is
    linear in the text: no pattern backtracks (a Python regex like ``(a|aa)+$`` on 5,000
    ``a`` then ``b`` took seconds; here 2 ms). A text cut by ``max_tokens`` before the grammar
    accepts is not one of its texts."""
    with _compiled_lock:  # (the cache and the copy from several worker threads)
        matcher = _compiled(to_grammar(fmt)).deep_copy()
    if matcher.is_error():
        return f"the {_WHAT[fmt.kind]} cannot be matched: {matcher.get_error().splitlines()[0]}"
    if not matcher.consume_tokens(list(value.encode())):
        return f"{_WHAT[fmt.kind]} does not accept it"
    if not matcher.is_accepting():
        return f"it ends before the {_WHAT[fmt.kind]} accepts (cut short?)"
    return None


def probe(fmt: OutputFormat) -> None:
    """Raise :class:`BadFormatError` naming the problem in words when the format compiles
    but no text can start it (a schema that is only a ``$ref`` cycle, such as ``{"$ref":
    "#"}``), or llguidance fails preparing its first token. It compiles the format over
    bytes and computes the first mask, as the engine will for its vocabulary: milliseconds
    for an ordinary format, unbounded for a hostile one, so callers run it in a worker
    thread with a time budget (platform/serve/variables/formats.py)."""
    matcher = llguidance.LLMatcher(_byte_tokenizer(), to_grammar(fmt), log_level=0)
    walked = bytearray()
    # The first mask, then a short walk along the lowest byte each step allows (with the
    # forced bytes llguidance computes for jump-forward): what blows up the parser on the
    # first bytes of a text (1,000 optional properties, a required property that is the
    # root again, (a{1000}){1000}) blows up there, as it would in the engine's first steps.
    for _ in range(PROBE_WALK_BYTES):
        if not matcher.is_error():
            mask = matcher.compute_bitmask()
            matcher.compute_ff_bytes()
        if matcher.is_error():
            raise matcher_error(fmt, matcher, bytes(walked))
        allowed = next((b for b in range(256) if mask[b // 8] >> (b % 8) & 1), None)
        if allowed is None:
            return  # only the end may come: the text is whole
        matcher.consume_token(allowed)
        walked.append(allowed)
    if matcher.is_error():
        raise matcher_error(fmt, matcher, bytes(walked))


def matcher_error(fmt: OutputFormat, matcher: llguidance.LLMatcher, after: bytes = b"") -> BadFormatError:
    """The 400 of a matcher in error, in words: the first line of llguidance's message (the
    rest is its parser's internal state), the cases clients meet explained; ``after``: the
    text it had taken."""
    reason = matcher.get_error().strip().splitlines()[0]
    if reason == "NoExtensionBias":
        reason = 'no text can start it (a $ref cycle that never reaches a value, such as {"$ref": "#"})'
    where = f" (after the text {after.decode(errors='replace')!r})" if after else ""
    return BadFormatError(f"bad {_WHAT[fmt.kind]}: {reason}{where}")


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"{uri} is not fetched: Parrot reads only the schema it is given")


def offline_registry() -> jsonschema_rs.Registry:
    """For jsonschema-rs checks of a client's schema: by default the library GETs an unknown
    ``$schema`` or a remote ``$ref`` (a request to any URL a client names); this refuses."""
    return jsonschema_rs.Registry([], retriever=_no_fetch)
