"""Issue 36 §3: what the grammar library cannot enforce while decoding is accepted, skipped
while decoding, and checked on the whole answer (``grammar.check_answer``): an answer that
breaks it is a 422 ``schema_unmet`` naming where; what it can enforce is never checked twice;
what it cannot read at all stays a 400. The keywords are the most frequent refusals of
JSONSchemaBench's real schemas (benchmarks/schemabench.py coverage)."""

from __future__ import annotations

import json

import pytest

from parrot.engines.protocol import grammar
from parrot.engines.protocol.errors import BadFormatError, SchemaUnmetError
from parrot.wire.formats import OutputFormat

# (schema, an answer that keeps it, an answer that breaks it, a word of the 422's reason)
SKIPPED_WHILE_DECODING = [
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, '"harbour"', '"bay"', "oneOf"),
    ({"type": "array", "uniqueItems": True}, "[1,2]", "[1,1]", "non-unique"),
    ({"type": "string", "not": {"const": "x"}}, '"y"', '"x"', "not"),
    ({"type": "object", "dependencies": {"a": ["b"]}}, '{"a":1,"b":2}', '{"a":1}', '"b"'),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, '{"b":1}', '{"a":1}', '"b"'),
    ({"type": "object", "propertyNames": {"maxLength": 2}}, '{"ab":1}', '{"abc":1}', "abc"),
    ({"type": "string", "format": "uri-reference"}, '"a/b"', '"a b"', "uri-reference"),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 2}, '{"a":1,"b":2}', '{"a":1}', "than 2"),
]


@pytest.mark.parametrize(("schema", "keeps", "breaks", "word"), SKIPPED_WHILE_DECODING)
def test_a_keyword_decoding_skips_is_accepted_and_checked_on_the_whole_answer(schema, keeps, breaks, word):
    fmt = OutputFormat(json_schema=schema)
    grammar.check_format(fmt)  # no 400
    grammar.probe(fmt)
    grammar.check_answer(fmt, keeps, "stop")
    with pytest.raises(SchemaUnmetError, match=word) as raised:
        grammar.check_answer(fmt, breaks, "stop")
    assert raised.value.status_code == 422 and raised.value.code == "schema_unmet"
    grammar.check_answer(fmt, breaks[:-1], "length")  # a cut answer is not judged (its end says so)


def test_a_schema_decoding_enforces_whole_is_not_checked_again():
    fmt = OutputFormat(json_schema={"type": "array", "maxItems": 1})
    grammar.check_answer(fmt, "[1,2]", "stop")  # the grammar could not have made it: no second look


def test_what_the_library_cannot_read_stays_a_400_naming_it():
    for schema, words in [
        ({"type": "string", "pattern": "(?<=a)b"}, "look-around"),
        ({"$ref": "https://example.com/s.json"}, "example.com"),
    ]:
        with pytest.raises(BadFormatError, match=words):
            grammar.check_format(OutputFormat(json_schema=schema))


def test_the_properties_keep_the_order_they_were_given_in():
    """Compiled schemas are kept by their JSON as given (not sorted): two schemas with the same
    properties in another order make other grammars (the answer follows the order given)."""
    first = {"type": "object", "properties": {"b": {"const": 1}, "a": {"const": 2}}, "required": ["b", "a"]}
    second = json.loads(json.dumps({**first, "properties": dict(reversed(first["properties"].items()))}))
    grammars = [grammar.to_grammar(OutputFormat(json_schema=s)) for s in (first, second)]
    assert grammars[0] != grammars[1]
