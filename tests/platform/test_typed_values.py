"""What the ServeCore checks of typed variables (issue 21), without a server: formats, values
against them, field paths against a JSON schema, and the text a field fills in."""

from __future__ import annotations

import pytest

from parrot.engines.protocol.errors import BadFormatError, FormatTooLargeError
from parrot.platform.serve.variables.formats import (
    FieldError,
    check_format,
    mismatch,
    read_field,
    unreachable,
)
from parrot.wire.formats import OutputFormat

PLAN = {
    "type": "object",
    "properties": {
        "goal": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "meta": {"$ref": "#/$defs/meta"},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "object"}], "items": False},
        "any": {},
    },
    "required": ["goal", "steps"],
    "additionalProperties": False,
    "$defs": {
        "meta": {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}
    },
}


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        (OutputFormat(json_schema={"type": "nope"}), "bad JSON schema: Invalid type: nope"),
        (OutputFormat(json_schema={"properties": {"a": {"pattern": "(("}}}), "bad JSON schema"),
        (OutputFormat(json_schema={"type": "string", "pattern": "(?<=a)b"}), "look-around.*not supported"),
        (OutputFormat(regex="(unclosed"), "bad regex.*unclosed group"),
        (OutputFormat(regex="a{2,1}"), "bad regex"),
        (OutputFormat(grammar="start: x"), 'bad Lark grammar.*unknown name: "x"'),
    ],
)
def test_formats_that_cannot_be_used_are_refused(fmt, message):
    with pytest.raises(BadFormatError, match=f"(?s){message}"):
        check_format(fmt, 65_536)


def test_a_format_over_the_limit_names_the_limit_and_its_flag():
    fmt = OutputFormat(choice=[f"option {i}" for i in range(100)])
    check_format(fmt, fmt.size())
    with pytest.raises(FormatTooLargeError, match=r"max_format_chars = 100 \(--max-format-chars\)"):
        check_format(fmt, 100)


@pytest.mark.parametrize(
    ("fmt", "value", "why"),
    [
        (OutputFormat(json_schema=PLAN), '{"goal": "tea", "steps": ["boil"]}', None),
        (OutputFormat(json_schema=PLAN), '{"goal": "tea"}', '"steps" is a required property'),
        (OutputFormat(json_schema=PLAN), '{"goal": "tea", "steps": [1]}', ".steps[0] does not match"),
        (OutputFormat(json_schema=PLAN), '{"goal": "tea", "steps": [], "x": 1}', "not allowed"),
        (OutputFormat(json_schema=PLAN), '{"goal": "tea", "steps": [', "is not JSON"),
        (OutputFormat(json_object=True), ' {"a": [1, 2]} ', None),
        (OutputFormat(json_object=True), "[1, 2]", "is not a JSON object"),
        (OutputFormat(json_object=True), "The answer is {}", "is not JSON"),
        (OutputFormat(regex=r"\d{4}-\d{2}-\d{2}"), "2026-11-25", None),
        (OutputFormat(regex=r"\d{4}-\d{2}-\d{2}"), "2026-11-25 ", "does not match the regex"),
        (OutputFormat(regex=r"\d{4}-\d{2}-\d{2}"), "on 2026-11-25", "does not match the regex"),
        (OutputFormat(choice=["yes", "no"]), "no", None),
        (OutputFormat(choice=["yes", "no"]), "No", "'No' is not one of the choices 'yes', 'no'"),
        # grammars are checked too (issue 37 (6)), by llguidance as the engine generates
        (OutputFormat(grammar='start: "a"+'), "aaa", None),
        (OutputFormat(grammar='start: "a"+'), "anything", "Lark grammar does not accept it"),
        (OutputFormat(grammar='start: "a" "b"'), "a", "ends before the Lark grammar accepts"),
        # ... and regexes in the engine's (Rust) dialect: && intersects classes
        (OutputFormat(regex="[a-z&&[^aeiou]]{3}"), "xts", None),
        (OutputFormat(regex="[a-z&&[^aeiou]]{3}"), "xta", "does not match the regex"),
    ],
)
def test_values_are_checked_against_their_format(fmt, value, why):
    got = mismatch(fmt, value)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got, got


def test_a_long_value_is_quoted_cut_in_the_reason():
    why = mismatch(OutputFormat(choice=["a"]), "x" * 10_000)
    assert why is not None and "(10000 characters)" in why and len(why) < 400


@pytest.mark.parametrize(
    ("value", "path", "text"),
    [
        ('{"steps": ["boil water", "add tea"]}', ("steps", 0), "boil water"),
        ('{"steps": ["boil water", "add tea"]}', ("steps",), '["boil water","add tea"]'),
        ('{"a": {"b": {"c": 1.5}}}', ("a", "b", "c"), "1.5"),
        ('[0, 1, {"y": null}]', (2, "y"), "null"),
        ('{"v": true, "u": "ü"}', ("v",), "true"),
        ('{"v": {"u": "ü"}}', ("v",), '{"u":"ü"}'),
        ('{"a key": "x"}', ("a key",), "x"),
    ],
)
def test_a_field_fills_in_as_text_strings_unquoted(value, path, text):
    assert read_field(value, path) == text


@pytest.mark.parametrize(
    ("value", "path", "message"),
    [
        ('{"steps": []}', ("steps", 0), ".steps has no [0]: it is an array of 0 items"),
        ('{"goal": "x"}', ("steps",), "the value has no .steps: it is an object with the fields 'goal'"),
        ('{"goal": "x"}', ("goal", "a"), ".goal has no .a: it is a string"),
        ('{"n": 1}', ("n", 0), ".n has no [0]: it is a number"),
        ("not json", ("a",), "its value is not JSON"),
    ],
)
def test_a_missing_field_says_where_the_path_stops(value, path, message):
    with pytest.raises(FieldError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        read_field(value, path)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (("goal",), None),
        (("steps", 0), None),
        (("steps", 2), None),
        (("meta", "n"), None),
        (("pair", 1, "anything"), None),
        (("any", 5, "x"), None),
        (("verdict",), "the schema allows no field 'verdict' at the top"),
        (("steps", 3), "at most 3 items at .steps"),
        (("steps", "first"), "the schema has array at .steps, not an object"),
        (("goal", 0), "the schema has string at .goal, not an array"),
        (("meta", "m"), "no field 'm' at .meta"),  # through the $ref
        (("pair", 2), "allows 2 items at .pair"),
        (("pair", 0, "x"), "integer at .pair[0]"),
    ],
)
def test_a_schema_rules_out_only_paths_it_cannot_have(path, why):
    got = unreachable(PLAN, path)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got, got


def test_any_of_allows_a_path_one_branch_allows():
    schema = {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"a": {}}}]}
    assert unreachable(schema, ("a",)) is None
    assert unreachable({"anyOf": [{"type": "string"}, {"type": "integer"}]}, ("a",)) is not None
    assert unreachable(True, ("a", 1)) is None
    assert unreachable({"type": "object", "properties": {"a": False}}, ("a", "b")) is not None


def test_a_value_nested_deeper_than_the_stack_is_a_mismatch_not_a_crash():
    deep = "[" * 100_000 + "]" * 100_000
    why = mismatch(OutputFormat(json_object=True), deep)
    assert why is not None and "is not JSON" in why
    with pytest.raises(FieldError, match="not JSON"):
        read_field(deep, (0,))


def test_checking_a_schema_never_fetches_a_url_it_names():
    """A client's ``$schema`` or remote ``$ref`` is never requested (jsonschema-rs fetches
    them by default): a local listener sees no request, and the format is refused."""
    import http.server
    import threading

    from parrot.platform.serve.variables.formats import check_format as check

    hits = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for schema in ({"$schema": f"{url}/meta", "type": "object"}, {"$ref": f"{url}/x"}):
            with pytest.raises(BadFormatError):
                check(OutputFormat(json_schema=schema), 65536)
        assert hits == []
    finally:
        server.shutdown()
