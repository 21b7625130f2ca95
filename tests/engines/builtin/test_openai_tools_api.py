"""The builtin engine's own ``/v1`` with the real ``openai`` client: ``response_format``
(``parse()`` with a Pydantic model, ``json_object``), tool calling (a 2-turn loop, streamed
calls) and bad inputs; the checks are shared with the ServeCore's front."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai_tool_checks import (
    check_bad_inputs,
    check_completion_format,
    check_json_object_and_streamed_schema,
    check_oversized_format,
    check_parse_returns_the_model,
    check_required_tools_do_not_run_away,
    check_schemas_decoding_cannot_enforce,
    check_streamed_tool_calls,
    check_structured_outputs,
    check_tool_loop,
)


@pytest.fixture
def oai(engine_server):
    with openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_parse_returns_the_model(oai):
    check_parse_returns_the_model(oai)


def test_json_object_and_streamed_schema(oai):
    check_json_object_and_streamed_schema(oai)


def test_tool_loop(oai):
    check_tool_loop(oai)


def test_streamed_tool_calls(oai):
    check_streamed_tool_calls(oai)


def test_required_tools_do_not_run_away(oai):
    check_required_tools_do_not_run_away(oai)


def test_schemas_decoding_cannot_enforce_are_checked_whole(oai):
    check_schemas_decoding_cannot_enforce(oai)


def test_bad_inputs_get_400_naming_the_field(engine_server):
    check_bad_inputs(engine_server.url)


def test_completions_take_a_response_format(oai):
    check_completion_format(oai)


def test_an_oversized_format_is_a_4xx_streaming_or_not(engine_server):
    check_oversized_format(engine_server.url)


def test_structured_outputs_of_vllm(oai):
    check_structured_outputs(oai)


def test_a_schema_100_deep_answers_as_response_format_and_as_a_tool(engine_server):
    """Issue 37 (4): a format nested 100 deep (arrays of arrays) with ``max_tokens`` 1 did not
    answer within 60 s. It compiles in milliseconds and answers its one token."""
    schema: dict = {"type": "string"}
    for _ in range(100):
        schema = {"type": "array", "items": schema}
    ask = {"messages": [{"role": "user", "content": "Nested data, please."}], "max_tokens": 1}
    parameters = {"type": "object", "properties": {"x": schema}}
    tools = [{"type": "function", "function": {"name": "nest", "parameters": parameters}}]
    response_format = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
    with httpx.Client(base_url=engine_server.url, timeout=60) as client:
        for extra in ({"response_format": response_format}, {"tools": tools}):
            r = client.post("/v1/chat/completions", json={**ask, **extra})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] == "length"
