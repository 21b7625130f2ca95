"""Structured output and tool calling with the real ``openai`` client, for every server that
speaks the OpenAI API (the builtin engine's ``/v1`` and the ServeCore's front run the same
checks, each from its own test file): ``parse()`` with a Pydantic model, ``json_object``,
a 2-turn tool loop, streamed tool calls assembled by the client, and the bad inputs."""

from __future__ import annotations

import json
import re
from typing import Annotated

import httpx
import openai
from pydantic import BaseModel, Field

GREEDY = {"temperature": 0, "max_tokens": 80}


class City(BaseModel):
    name: Annotated[str, Field(max_length=24)]
    country: Annotated[str, Field(max_length=24)]
    population: Annotated[int, Field(ge=0, le=100_000_000)]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 32}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris?"}]


def model_of(oai: openai.OpenAI) -> str:
    return oai.models.list().data[0].id


def check_parse_returns_the_model(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.parse(
        model=model_of(oai),
        messages=[{"role": "user", "content": "Describe Paris as JSON: its name, country and population."}],
        response_format=City,
        **GREEDY,
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, City), message
    assert City.model_validate_json(message.content) == message.parsed
    assert completion.choices[0].finish_reason == "stop"


def check_json_object_and_streamed_schema(oai: openai.OpenAI) -> None:
    answer = oai.chat.completions.create(
        model=model_of(oai),
        messages=[{"role": "user", "content": "Give the color of the sky as a JSON object."}],
        response_format={"type": "json_object"},
        **GREEDY,
    )
    assert answer.choices[0].finish_reason == "stop", answer
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    strict = {**City.model_json_schema(), "additionalProperties": False}
    schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": strict, "strict": True}}
    ask = {"model": model_of(oai), "messages": QUESTION, "response_format": schema, **GREEDY}
    plain = oai.chat.completions.create(**ask).choices[0].message.content
    chunks = list(oai.chat.completions.create(**ask, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain and City.model_validate_json(plain)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # streamed, not at once


def check_tool_loop(oai: openai.OpenAI) -> None:
    """Turn 1 must call get_weather; its result goes back as a tool message; turn 2 answers."""
    model = model_of(oai)
    single = {"tools": [WEATHER_TOOL, TIME_TOOL], "parallel_tool_calls": False, **GREEDY}
    first = oai.chat.completions.create(model=model, messages=QUESTION, tool_choice="required", **single)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, first
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    messages = [
        *QUESTION,
        choice.message.model_dump(exclude_none=True),
        *(
            {"role": "tool", "tool_call_id": c.id, "content": "18 degrees and sunny"}
            for c in choice.message.tool_calls
        ),
    ]
    second = oai.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", **GREEDY
    )
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    assert second.choices[0].finish_reason in ("stop", "length")
    auto = oai.chat.completions.create(model=model, messages=messages, **single).choices[0]
    if auto.message.tool_calls:  # the model may call again; the call is then well formed
        assert auto.finish_reason == "tool_calls"
        (again,) = auto.message.tool_calls
        assert isinstance(json.loads(again.function.arguments), dict)
    else:
        assert auto.message.content and auto.finish_reason in ("stop", "length")


def check_streamed_tool_calls(oai: openai.OpenAI) -> None:
    ask = {
        "model": model_of(oai),
        "messages": QUESTION,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        **GREEDY,
    }
    plain = oai.chat.completions.create(**ask).choices[0].message.tool_calls
    with oai.chat.completions.stream(**ask) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and call.function.arguments == plain[0].function.arguments
    chunks = list(oai.chat.completions.create(**ask, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert (
        deltas[0].id.startswith("call_") and deltas[0].index == 0 and deltas[0].function.name == "get_weather"
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def check_required_tools_do_not_run_away(oai: openai.OpenAI) -> None:
    """Issue 36: ``tool_choice: "required"`` with parallel calls on (the client's default)
    and a small ``max_tokens``: the bundled model would repeat one call until the budget
    ran out, and the cut list came back as protocol text in ``content``. Now a repeated
    call ends the list, the complete calls come back as ``tool_calls``, and no content
    carries the protocol, streamed or not; a budget too small for one whole call answers
    no calls and no content (``finish_reason: "length"``). The generation itself stops at
    the repeated call: no token is spent on the loop (with a large budget too)."""
    ask = {
        "model": model_of(oai),
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "temperature": 0,
    }
    for max_tokens in (64, 400, 1, 12):
        budget = {"max_tokens": max_tokens}
        answer = oai.chat.completions.create(**ask, **budget)
        choice = answer.choices[0]
        calls = choice.message.tool_calls or []
        assert not choice.message.content, choice  # never the protocol's text
        keys = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        assert all(name == "get_weather" for name, _ in keys), keys
        assert len({json.dumps(k) for k in keys}) == len(keys), keys  # no call twice
        if max_tokens in (64, 400):
            assert calls and choice.finish_reason == "tool_calls", choice
            # A call is ~20 tokens: the list ended once a call came again, not at the budget.
            assert answer.usage.completion_tokens <= 25 * (len(calls) + 1), answer.usage
        elif max_tokens == 1:
            assert not calls and choice.finish_reason == "length", choice
        chunks = list(oai.chat.completions.create(**ask, **budget, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
        assert streamed == "", streamed
        assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == keys
        assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def check_schemas_decoding_cannot_enforce(oai: openai.OpenAI) -> None:
    """Issue 36 §3: keywords the grammar library cannot enforce while decoding (``oneOf``,
    ``uniqueItems``, ``not``, unknown string formats: a third of JSONSchemaBench's GitHub-Hard
    refused before) are accepted; each whole answer is checked against the schema: a valid
    one comes back, one that breaks the schema fails with 422 ``schema_unmet`` saying where
    (the front: its call failed, 424 with that reason), never passed as valid. Streamed too:
    the stream ends with the error."""
    import jsonschema_rs

    def ask(schema: dict, stream: bool = False):
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        words = [{"role": "user", "content": "Answer in JSON about the harbour of Bergen."}]
        call = oai.chat.completions.create
        return call(model=model_of(oai), messages=words, response_format=fmt, stream=stream, **GREEDY)

    accepted = {
        "type": "object",
        "properties": {
            "name": {"oneOf": [{"type": "string", "maxLength": 12}, {"type": "integer"}]},
            "docks": {"type": "array", "items": {"type": "integer"}, "maxItems": 3, "uniqueItems": True},
            "path": {"type": "string", "format": "path", "maxLength": 12},
            "kind": {"not": {"const": "airport"}, "enum": ["port", "airport", "marina"]},
        },
        "required": ["name", "kind"],
        "additionalProperties": False,
    }
    answer = ask(accepted)
    assert answer.choices[0].finish_reason == "stop", answer
    jsonschema_rs.validate(accepted, json.loads(answer.choices[0].message.content))
    # Two items from a one-value enum repeat: the answer must break uniqueItems.
    broken = {"type": "array", "items": {"enum": ["tide"]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}
    try:
        ask(broken)
    except openai.APIStatusError as error:  # the engine's 422; the front's failed call (424)
        assert (error.status_code, error.body["code"]) in ((422, "schema_unmet"), (424, "producer_failed"))
        assert "non-unique" in error.body["message"], error.body
    else:
        raise AssertionError("an answer that breaks uniqueItems passed")
    try:
        list(ask(broken, stream=True))
    except openai.APIError as error:
        assert "non-unique" in str(error), error
    else:
        raise AssertionError("a streamed answer that breaks uniqueItems ended well")


LOOKBEHIND = {"type": "string", "pattern": "(?<=a)b"}  # a regex the grammar library cannot read


def deep_schema(depth: int) -> dict:
    """A JSON schema of arrays ``depth`` levels deep."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def bad_inputs() -> list[tuple[dict, int, str]]:
    """(fields added to a chat request, status, a fragment of the message)."""
    deep = {"name": "a", "schema": deep_schema(400)}
    user = [{"role": "user", "content": "x"}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    return [
        ({"response_format": {"type": "xml"}}, 400, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, 400, "json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}, 400, "schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "wat"}},
                }
            },
            400,
            "response_format.json_schema.schema is not a valid JSON schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": LOOKBEHIND}}},
            400,
            "response_format.json_schema.schema: bad JSON schema",
        ),
        (  # issue 37: a schema nested 400 deep was a 500
            {"response_format": {"type": "json_schema", "json_schema": deep}},
            400,
            "response_format.json_schema.schema is nested too deeply",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": deep_schema(400)}}]},
            400,
            "tools[0].function.parameters is nested too deeply",
        ),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            400,
            "'nope', which is not in tools",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "properties": 3}},
                    }
                ]
            },
            400,
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            400,
            "tools[0].function.parameters",
        ),
        ({"tool_choice": "auto"}, 400, "tool_choice needs tools"),
        ({"tool_choice": "sometimes"}, 400, "tool_choice"),
        ({"messages": [*user, {"role": "tool", "content": "18C"}]}, 400, "messages[1]"),
        (  # issue 37 (9): a result of no call was a 200
            {"messages": [*user, {"role": "tool", "tool_call_id": "call_9", "content": "18C"}]},
            400,
            "messages[1]: tool_call_id 'call_9' answers no tool call",
        ),
        ({"messages": [*user, {"role": "user", "content": "x", "tool_calls": [call]}]}, 400, "messages[1]"),
        ({"structured_outputs": {}}, 400, "structured_outputs: a format sets exactly one"),
        ({"structured_outputs": {"regex": "(?<=a)b"}}, 400, "structured_outputs.regex: bad regex"),
        ({"structured_outputs": {"choice": ["a"], "nope": 1}}, 400, "structured_outputs"),
        (
            {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
            400,
            "structured_outputs cannot be combined",
        ),
        (
            {"tools": [WEATHER_TOOL], "response_format": {"type": "json_object"}},
            400,
            "response_format cannot be combined with tools",
        ),
    ]


def check_bad_inputs(base_url: str) -> None:
    for fields, status, fragment in bad_inputs():
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **fields}
        r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == status, (fields, r.text)
        error = r.json()["error"]
        assert fragment in error["message"], (fields, error)


def check_completion_format(oai: openai.OpenAI) -> None:
    """``/v1/completions`` takes a ``response_format`` too (as vLLM's does)."""
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "maxLength": 12}},
        "required": ["color"],
        "additionalProperties": False,
    }
    answer = oai.completions.create(
        model=model_of(oai),
        prompt="The color of the sky, as JSON:",
        extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}
        },
        **GREEDY,
    )
    assert answer.choices[0].finish_reason == "stop"
    assert list(json.loads(answer.choices[0].text)) == ["color"]


def check_structured_outputs(oai: openai.OpenAI) -> None:
    """vLLM's ``structured_outputs``: a choice on chat, a regex on completions."""
    chat = oai.chat.completions.create(
        model=model_of(oai),
        messages=[{"role": "user", "content": "Is the sky green?"}],
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        **GREEDY,
    )
    assert chat.choices[0].message.content in ("yes", "no") and chat.choices[0].finish_reason == "stop"
    text = oai.completions.create(
        model=model_of(oai),
        prompt="The year the Eiffel Tower was built:",
        extra_body={"structured_outputs": {"regex": "1[0-9]{3}"}},
        **GREEDY,
    ).choices[0]
    assert re.fullmatch("1[0-9]{3}", text.text) and text.finish_reason == "stop"


def check_oversized_format(base_url: str) -> None:
    """A format over the engine's size limit is a 4xx naming the limit's flag, streaming or
    not (a stream's error comes before its first event, not as a broken stream)."""
    big = {
        "type": "object",
        "properties": {f"k{i}": {"type": "string", "description": "x" * 100} for i in range(800)},
    }
    for stream in (False, True):
        body = {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": big}},
        }
        r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
        assert 400 <= r.status_code < 500 and "--max-format-chars" in r.json()["error"]["message"], r.text
