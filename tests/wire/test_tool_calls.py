"""The generic tool format (parrot.wire.tool_calls, tool_stream): rendering, the answer's
schema (checked with jsonschema-rs against answers it must accept and refuse), parsing,
and the streamed reading of an answer."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest

from parrot.wire.chat import ChatTurn
from parrot.wire.openai_schemas import (
    ChosenFunction,
    FunctionCall,
    FunctionDefinition,
    NamedToolChoice,
    ToolCall,
)
from parrot.wire.tool_calls import ToolAnswer, parse_answer, plan_tools, render_turns
from parrot.wire.tool_stream import AnswerStream, read_answer

WEATHER = FunctionDefinition(
    name="get_weather",
    description="The weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"],
    },
)
TIME = FunctionDefinition(name="get_time", description="The time now")
NESTED = FunctionDefinition(
    name="book",
    parameters={
        "type": "object",
        "$defs": {
            "Seat": {"type": "object", "properties": {"row": {"type": "integer"}}, "required": ["row"]}
        },
        "properties": {"seat": {"$ref": "#/$defs/Seat"}},
        "required": ["seat"],
    },
)
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


def valid(schema: dict, answer: dict) -> bool:
    return jsonschema_rs.validator_for(schema).is_valid(answer)


def test_auto_allows_calls_or_a_response():
    plan = plan_tools([WEATHER, TIME], "auto")
    schema = plan.answer_schema()
    assert valid(schema, {"tool_calls": [CALL]})
    assert valid(schema, {"tool_calls": [CALL, {"name": "get_time", "arguments": {}}]})
    assert valid(schema, {"response": "It is sunny."})
    assert not valid(schema, {"tool_calls": []})
    assert not valid(schema, {"tool_calls": [{"name": "get_weather", "arguments": {}}]})  # city missing
    assert not valid(schema, {"tool_calls": [{"name": "rm_rf", "arguments": {}}]})
    assert not valid(schema, {"response": "x", "tool_calls": [CALL]})
    assert not valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]})
    assert not valid(schema, {"tool_calls": [{"name": "get_weather", "arguments": {"city": "P", "x": 1}}]})
    assert plan_tools([WEATHER, TIME], None) == plan  # no tool_choice: auto


def test_required_named_and_single_calls():
    required = plan_tools([WEATHER, TIME], "required").answer_schema()
    assert valid(required, {"tool_calls": [CALL]}) and not valid(required, {"response": "x"})
    named = plan_tools(
        [WEATHER, TIME], NamedToolChoice(type="function", function=ChosenFunction(name="get_time"))
    )
    schema = named.answer_schema()
    assert valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {}}]})
    assert not valid(schema, {"tool_calls": [CALL]})
    assert not valid(schema, {"tool_calls": [{"name": "get_time", "arguments": {}}] * 2})
    single = plan_tools([WEATHER], "auto", parallel=False).answer_schema()
    assert valid(single, {"tool_calls": [CALL]}) and not valid(single, {"tool_calls": [CALL, CALL]})
    assert plan_tools([WEATHER], "none") is None and plan_tools(None, None) is None


def test_parameter_schemas_with_references_move_to_the_root():
    schema = plan_tools([NESTED, WEATHER], "required").answer_schema()
    assert valid(schema, {"tool_calls": [{"name": "book", "arguments": {"seat": {"row": 3}}}]})
    assert not valid(schema, {"tool_calls": [{"name": "book", "arguments": {"seat": {"row": "x"}}}]})
    assert NESTED.parameters["properties"]["seat"] == {"$ref": "#/$defs/Seat"}  # the tool is untouched


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        (None, "auto", "tool_choice needs tools"),
        ([WEATHER], NamedToolChoice(type="function", function=ChosenFunction(name="nope")), "'nope'"),
        ([WEATHER, WEATHER], "auto", "unique"),
        (
            [FunctionDefinition(name="f", parameters={"type": "string"})],
            "auto",
            "tools[0].function.parameters",
        ),
    ],
)
def test_bad_plans_name_the_field(tools, choice, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_tools(tools, choice)


def test_render_lists_tools_and_rewrites_the_history():
    plan = plan_tools([WEATHER], "auto")
    call = ToolCall(id="call_1", function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}'))
    turns = [
        ChatTurn(role="system", content="Be brief."),
        ChatTurn(role="user", content="Weather in Paris?"),
        ChatTurn(role="assistant", content="", tool_calls=[call]),
        ChatTurn(role="tool", content="18C", tool_call_id="call_1"),
        ChatTurn(role="tool", content="late", tool_call_id="call_9", name="get_time"),
    ]
    system, user, assistant, results = render_turns(turns, plan)
    assert system.role == "system" and system.content.startswith("Be brief.\n\n")
    assert '"name":"get_weather"' in system.content and '{"response":"<your answer>"}' in system.content
    assert user == turns[1]
    assert json.loads(assistant.content) == {"tool_calls": [CALL]} and assistant.tool_calls is None
    lines = [json.loads(line)["tool_response"] for line in results.content.splitlines()]
    assert results.role == "user" and lines == [
        {"name": "get_weather", "id": "call_1", "content": "18C"},
        {"name": "get_time", "id": "call_9", "content": "late"},
    ]
    # Without a system message one is added; without a plan the tools are not listed.
    first, *_ = render_turns(turns[1:], plan)
    assert first.role == "system" and "get_weather" in first.content
    assert [t.role for t in render_turns(turns[1:], None)] == ["user", "assistant", "user"]
    assert (
        "Answer with this JSON object, which calls the tool get_weather"
        in (
            plan_tools(
                [WEATHER], NamedToolChoice(type="function", function=ChosenFunction(name="get_weather"))
            )
        ).instructions()
    )


def test_parse_answers():
    calls = parse_answer(json.dumps({"tool_calls": [CALL, {"name": "get_time", "arguments": {}}]}))
    assert [c.function.name for c in calls.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(calls.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert calls.tool_calls[0].id.startswith("call_") and calls.tool_calls[0].id != calls.tool_calls[1].id
    assert calls.content is None
    assert (
        parse_answer('{"response": "Hi"}').content == "Hi"
        and not parse_answer('{"response": "Hi"}').tool_calls
    )
    for text in ('{"tool_calls": [{"name": "f"', "plain words", "[1]", '{"other": 1}', '{"tool_calls": []}'):
        assert parse_answer(text) is None


def fed(text: str, size: int) -> tuple[str, list, AnswerStream]:
    """The content and the calls the stream gives while ``text`` comes in pieces of ``size``."""
    stream = AnswerStream()
    content, calls = "", []
    for i in range(0, len(text), size):
        answer = stream.feed(text[i : i + size])
        content += answer.content or ""
        calls += answer.tool_calls
    return content, calls, stream


@pytest.mark.parametrize("size", [1, 3, 100])
def test_a_streamed_response_comes_out_as_its_text(size):
    text = 'Sun \u00e9t\u00e9 \\"quoted\\" \\n tab\\t \\u00e9 \\ud83d\\ude00 end'
    answer = '{ "response" : "' + text + '" }'
    out, calls, stream = fed(answer, size)
    rest = stream.finish()
    assert out + rest.content == json.loads(answer)["response"] and not calls and not rest.tool_calls
    assert len(out) >= len(json.loads(answer)["response"]) - 1  # sent as it came, not at the end
    assert not stream.called_tools


@pytest.mark.parametrize("size", [1, 7])
def test_each_streamed_call_comes_once_complete(size):
    second = {"name": "get_time", "arguments": {}}
    text = json.dumps({"tool_calls": [CALL, second]})
    cut = text.index("get_time")
    out, calls, stream = fed(text[:cut], size)  # the first call is complete, the second is not
    assert out == "" and [c.function.name for c in calls] == ["get_weather"] and not stream.called_tools
    answer = stream.feed(text[cut:])
    rest = stream.finish()
    assert [c.function.name for c in (*answer.tool_calls, *rest.tool_calls)] == ["get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"} and stream.called_tools
    assert rest.content is None or rest.content == ""


@pytest.mark.parametrize("size", [1, 7])
def test_cut_off_answers(size):
    out, calls, stream = fed('{"tool_calls": [{"name": "get_wea', size)  # before any call is whole
    assert out == "" and not calls and stream.finish() == ToolAnswer(None)  # not the format's text
    assert not stream.called_tools
    for start in ('{"', '{ "tool_', '{"response"'):  # cut before the first key is whole
        out, calls, stream = fed(start, size)
        assert out == "" and not calls and stream.finish() == ToolAnswer(None), start
    other = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    text = json.dumps({"tool_calls": [CALL, other]})
    out, calls, stream = fed(text[:-8], size)  # the first call went out; the second is lost
    assert len(calls) == 1 and stream.finish() == ToolAnswer(None) and not stream.called_tools
    out, calls, stream = fed('{"response": "cut of', size)
    assert out + stream.finish().content == "cut of"


@pytest.mark.parametrize("size", [1, 7])
def test_a_call_made_again_ends_the_list(size):
    again = {"name": CALL["name"], "arguments": dict(reversed(list(CALL["arguments"].items())))}
    text = json.dumps({"tool_calls": [CALL, {"name": "get_time", "arguments": {}}, again, CALL]})
    out, calls, stream = fed(text[: len(text) * 3 // 4], size)
    rest = stream.finish()
    assert [c.function.name for c in (*calls, *rest.tool_calls)] == ["get_weather", "get_time"]
    assert stream.called_tools and stream.repeated and out == ""
    whole, called = read_answer(text)  # the same, read at once
    assert [c.function.name for c in whole.tool_calls] == ["get_weather", "get_time"] and called
