"""Checks of an OpenAI request's schemas (engines/protocol/openai_requests): a bad schema is
a 400 naming its field, and no check fetches a URL the schema names (jsonschema-rs would)."""

from __future__ import annotations

import http.server
import threading

import msgspec
import pytest

from parrot.engines.protocol.errors import BadFormatError, BadRequestError
from parrot.engines.protocol.openai_requests import check_schema, read_chat, sampling_params
from parrot.wire.openai_schemas import ChatCompletionRequest
from parrot.wire.tool_syntax import SYNTAXES


@pytest.fixture
def listener():
    """A local HTTP server that records the paths it is asked for."""
    hits: list[str] = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def test_schemas_naming_urls_are_refused_without_a_fetch(listener):
    url, hits = listener
    for schema in (
        {"$schema": f"{url}/meta", "type": "object"},
        {"type": "object", "properties": {"a": {"$ref": f"{url}/ref"}}},
        {"$id": f"{url}/root", "properties": {"a": {"$ref": "other"}}},
    ):
        with pytest.raises(BadRequestError, match=r"response_format\.json_schema\.schema"):
            check_schema(schema, "response_format.json_schema.schema")
    assert hits == []


def nested(depth: int) -> dict:
    """An array schema ``depth`` levels deep."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    ("schema", "error", "message"),
    [
        ([1], BadRequestError, "f must be a JSON schema"),
        ({"type": "wat"}, BadRequestError, "f is not a valid JSON schema"),
        ({"type": "string", "pattern": "(?<=a)b"}, BadFormatError, "f: bad JSON schema"),
        ({"type": "string", "pattern": "["}, BadFormatError, "f: bad JSON schema"),
        # issue 37: 300-500 deep was a 500 (the validator's ValueError)
        (nested(400), BadRequestError, "f is nested too deeply to be checked"),
        (nested(3000), BadRequestError, "f is nested too deeply to be checked"),
    ],
)
def test_bad_schemas_name_the_field(schema, error, message):
    with pytest.raises(error, match=message):
        check_schema(schema, "f")
    check_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {}}}, "f")


def test_tools_too_large_for_a_grammar_of_the_models_syntax_are_a_400_that_says_so():
    """A model's own tool syntax is a grammar with every tool's schema inside; past the
    wire's bound on a grammar the request is refused, naming the cause (the generic format's
    schema is bounded by ``--max-format-chars`` in the engine)."""
    properties = {f"field_{i}": {"type": "string", "description": "x" * 200} for i in range(40)}
    parameters = {"type": "object", "properties": properties}
    tools = [
        {"type": "function", "function": {"name": f"tool_{n}", "parameters": parameters}} for n in range(10)
    ]
    asked = msgspec.convert(
        {"messages": [{"role": "user", "content": "Hi"}], "tools": tools}, ChatCompletionRequest
    )
    chat = read_chat(asked)
    too_large = r"tools: their schemas make a grammar of \d+ characters .*\(hermes\)"
    with pytest.raises(BadRequestError, match=too_large):
        sampling_params(asked, 16, chat.tools, SYNTAXES["hermes"])
    assert sampling_params(asked, 16, chat.tools).format.json_schema is not None  # generic: a schema
