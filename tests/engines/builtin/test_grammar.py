"""Output formats as llguidance grammars (engines/protocol/grammar.py), without an engine:
what each kind accepts, and the 4xx of each bad format."""

from __future__ import annotations

import llguidance
import llguidance.hf
import pytest
import transformers

from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder
from parrot.engines.protocol.errors import BadFormatError, FormatTooLargeError
from parrot.engines.protocol.grammar import check_format, escape_regex, to_grammar
from parrot.wire.formats import OutputFormat


@pytest.fixture(scope="module")
def hf():
    folder = resolve_model_folder(None, default_cache_dir())
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def lltok(hf):
    return llguidance.hf.from_tokenizer(hf, n_vocab=len(hf))


def accepts(lltok, hf, fmt: OutputFormat, text: str) -> bool:
    """Whether the format's grammar takes ``text`` whole and may end there."""
    matcher = llguidance.LLMatcher(lltok, to_grammar(fmt), log_level=0)
    return matcher.consume_tokens(hf.encode(text, add_special_tokens=False)) and matcher.is_accepting()


def test_choice_matches_exactly_its_strings_whatever_they_contain(lltok, hf):
    choices = ["a/b", "x\ny", "#&-~ ", 'é"\\', ".*", "[1]{2}", "(x|y)", "a b!"]
    fmt = OutputFormat(choice=choices)
    check_format(fmt)
    for choice in choices:
        assert accepts(lltok, hf, fmt, choice), choice
    for other in ["a/", "x", "a b", ".*.*", "1"]:
        assert not accepts(lltok, hf, fmt, other), other


def test_escape_regex_escapes_only_what_rust_regex_treats_as_syntax():
    assert escape_regex("a.b*c!d e") == "a\\.b\\*c!d e"
    assert escape_regex("#&-~") == "\\#\\&\\-\\~"


def test_json_schema_is_json_laid_out_as_models_write_it_that_matches(lltok, hf):
    """One space after each separator, none elsewhere: Python's ``json.dumps`` layout, the
    one models read and write most (compact JSON made Qwen2.5-Coder-0.5B loop to
    ``max_tokens`` on 24 of 80 JSONSchemaBench schemas, against 10 with this layout)."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "integer"}}},
        "required": ["name", "tags"],
        "additionalProperties": False,
    }
    fmt = OutputFormat(json_schema=schema)
    assert accepts(lltok, hf, fmt, '{"name": "Ada", "tags": [1, 2]}')
    assert not accepts(lltok, hf, fmt, '{"name":"Ada","tags":[1,2]}')  # one layout
    assert not accepts(lltok, hf, fmt, '{ "name": "Ada", "tags": [1, 2] }')  # no free whitespace
    assert not accepts(lltok, hf, fmt, '{"name": "Ada"}')  # a required key missing
    assert not accepts(lltok, hf, fmt, '{"name": "Ada", "tags": [1], "x": 1}')


def test_json_object_takes_any_object_only(lltok, hf):
    fmt = OutputFormat(json_object=True)
    assert accepts(lltok, hf, fmt, '{"a": [1, {"b": null}], "c": "d"}')
    assert not accepts(lltok, hf, fmt, "[1, 2]")
    assert not accepts(lltok, hf, fmt, '"text"')


def test_regex_and_lark_grammar(lltok, hf):
    date = OutputFormat(regex=r"\d{4}-\d{2}-\d{2}")
    assert accepts(lltok, hf, date, "2026-11-25")
    assert not accepts(lltok, hf, date, "2026-11-2")
    lark = OutputFormat(grammar='start: "The answer is " NUMBER "."\nNUMBER: /[0-9]+/')
    check_format(lark)
    assert accepts(lltok, hf, lark, "The answer is 42.")
    assert not accepts(lltok, hf, lark, "The answer is x.")


@pytest.mark.parametrize(
    ("fmt", "words"),
    [
        (OutputFormat(json_schema={"type": "foo"}), ["JSON schema", "foo"]),
        (OutputFormat(json_schema={"type": "string", "pattern": "(?<=a)b"}), ["JSON schema", "look-around"]),
        (OutputFormat(json_schema={"properties": {"a": {"$ref": "#/defs/x"}}}), ["/defs/x"]),
        (OutputFormat(json_schema={"type": "string", "minLength": 5, "maxLength": 2}), ["minLength"]),
        (OutputFormat(json_schema={"type": "string", "pattern": "(a"}), ["unclosed group"]),
        (OutputFormat(regex="(ab"), ["regex", "unclosed group"]),
        (OutputFormat(grammar="start: foo"), ["Lark grammar", "unknown name", "foo"]),
    ],
)
def test_each_bad_format_is_a_400_naming_the_problem(fmt, words):
    with pytest.raises(BadFormatError) as info:
        check_format(fmt)
    assert info.value.status_code == 400 and info.value.code == "bad_format"
    for word in words:
        assert word in str(info.value)


def test_a_format_over_the_size_limit_is_a_413_naming_the_limit_and_its_flag():
    fmt = OutputFormat(choice=["x" * 100, "y"])
    check_format(fmt, max_chars=200)
    with pytest.raises(FormatTooLargeError) as info:
        check_format(fmt, max_chars=50)
    assert info.value.status_code == 413 and info.value.code == "format_too_large"
    assert "50" in str(info.value) and "--max-format-chars" in str(info.value)
    with pytest.raises(FormatTooLargeError, match="--max-var-format"):
        check_format(fmt, max_chars=50, flag="--max-var-format")
