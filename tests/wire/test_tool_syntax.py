"""Models' own tool syntaxes (parrot.wire.tool_syntax, tool_readers; issue 36 §2): which
template writes which, the grammar of an answer (matched by llguidance over bytes, as the
engine's constraint is), the rendering of tools and tool turns for a template, and the
readers of an answer as it streams. The real templates and tokenizers: the engine tests in
tests/engines/builtin/test_tool_families.py."""

from __future__ import annotations

import json

import pytest
from tool_models import ASSETS, FAMILIES, missing_assets

from parrot.engines.protocol.grammar import text_mismatch
from parrot.wire.chat import ChatTurn
from parrot.wire.openai_schemas import (
    ChosenFunction,
    FunctionCall,
    FunctionDefinition,
    NamedToolChoice,
    ToolCall,
)
from parrot.wire.tool_calls import plan_tools
from parrot.wire.tool_syntax import GENERIC, SYNTAXES, syntax_of_template

HERMES, LLAMA, MISTRAL = SYNTAXES["hermes"], SYNTAXES["llama3_json"], SYNTAXES["mistral"]
XML = SYNTAXES["qwen3_xml"]
WEATHER = FunctionDefinition(
    name="get_weather",
    description="The weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ADD = FunctionDefinition(
    name="add",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
OSLO = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
SUM = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
LLAMA_OSLO = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
M_OSLO, M_SUM = (
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
)


def test_each_template_is_read_for_the_syntax_it_writes():
    if missing_assets():
        pytest.skip(missing_assets())
    for family in FAMILIES.values():
        template = (ASSETS / "templates" / family.template).read_text()
        assert syntax_of_template(template).name == family.syntax
        assert syntax_of_template(template, "generic") is GENERIC  # --tool-format generic
    assert syntax_of_template(None) is GENERIC and syntax_of_template("{{ messages }}") is GENERIC
    # <tool_call> with XML inside (Qwen3-Coder's, Qwen3.5's) is not Hermes' JSON
    assert syntax_of_template("{{ tools }}<tool_call><function={{ name }}>") is GENERIC
    assert syntax_of_template('{{ tools }}"arguments<tool_call><function={{ n }}><parameter={{ k }}>') is XML


@pytest.mark.parametrize(
    ("choice", "text", "accepted"),
    [
        (None, "The weather is fine.", True),
        (None, OSLO, True),
        (None, f"Let me look.\n{OSLO}\n{SUM}", True),  # text, then calls
        (None, 'Hi <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', False),  # not a tool
        (
            None,
            '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>',
            False,
        ),  # spacing
        ("required", OSLO, True),
        ("required", "The weather is fine.", False),
        ("required", f"Let me look.\n{OSLO}", False),
        ("add", SUM, True),
        ("add", OSLO, False),
        ("add", f"{SUM}\n{SUM}", False),  # a named tool: one call
    ],
)
def test_the_hermes_grammar(choice, text, accepted):
    assert accepts(HERMES, choice, text) is accepted


def accepts(syntax, choice: str | None, text: str) -> bool:
    """Whether the grammar of ``syntax`` for the two tools and ``choice`` (``add``: that
    tool by name) accepts ``text``, as the engine's constraint would."""
    named = NamedToolChoice(type="function", function=ChosenFunction(name="add")) if choice == "add" else None
    return text_mismatch(syntax.output_format(plan_tools([WEATHER, ADD], named or choice)), text) is None


@pytest.mark.parametrize(
    ("choice", "text", "accepted"),
    [
        (None, "It is sunny.", True),
        (None, LLAMA_OSLO, True),
        (None, '{"name": "get_weather", "arguments": {"city": "Oslo"}}', False),  # Llama says parameters
        ("required", LLAMA_OSLO, True),
        ("required", "It is sunny.", False),
        ("required", f"{LLAMA_OSLO}{LLAMA_OSLO}", False),
    ],
)
def test_the_llama3_json_grammar(choice, text, accepted):
    assert accepts(LLAMA, choice, text) is accepted


def test_parallel_calls_off_allow_one_call():
    plan = plan_tools([WEATHER, ADD], "required", parallel=False)
    assert text_mismatch(HERMES.output_format(plan), OSLO) is None
    assert text_mismatch(HERMES.output_format(plan), f"{OSLO}\n{SUM}") is not None


def test_a_template_gets_the_tools_and_tool_turns_as_they_are():
    call = ToolCall(id="call_1", function=FunctionCall(name="get_weather", arguments='{"city": "Oslo"}'))
    turns = [
        ChatTurn(role="user", content="Weather in Oslo?"),
        ChatTurn(role="assistant", content="", tool_calls=[call]),
        ChatTurn(role="tool", content="sunny", tool_call_id="call_1"),
    ]
    rendering = HERMES.render(turns, plan_tools([WEATHER], None))
    assert rendering.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER.description,
                "parameters": WEATHER.parameters,
            },
        }
    ]
    user, assistant, tool = rendering.messages
    assert user == {"role": "user", "content": "Weather in Oslo?"}
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}
    generic = GENERIC.render(turns, plan_tools([WEATHER], None))
    assert generic.tools is None and "get_weather" in generic.messages[0]["content"]  # Parrot's own block
    assert all(set(m) == {"role", "content"} for m in generic.messages)


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_hermes_answer_streams_its_text_and_whole_calls(size):
    reader = HERMES.reader()
    said, calls = [], []
    for piece in pieces(f"Let me look.\n{OSLO}\n{SUM}", size):
        answer = reader.feed(piece)
        said.append(answer.content or "")
        calls += answer.tool_calls
        assert "<" not in "".join(said)  # the tags never come out as text
    rest = reader.finish()
    said.append(rest.content or "")
    assert "".join(said) == "Let me look.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert reader.called_tools


def test_a_hermes_answer_cut_or_looping():
    content, called = HERMES.read(f'{OSLO}\n<tool_call>\n{{"name": "add", "argu')
    assert [c.function.name for c in content.tool_calls] == [
        "get_weather"
    ] and not called  # half a call: dropped
    content, called = HERMES.read(f"{OSLO}\n{OSLO}\n{SUM}")
    assert [c.function.name for c in content.tool_calls] == ["get_weather"] and called  # a repetition ends it
    reader = HERMES.reader()
    reader.feed(f"{OSLO}\n{OSLO}")
    assert reader.cut_at == len(OSLO)  # where the engine ends the text
    content, called = HERMES.read("Just words, <tool")  # cut as a call began
    assert content.content == "Just words, " and not content.tool_calls and not called
    assert HERMES.read("<tool_cal") == (type(content)(None), False)
    assert HERMES.read("a < b")[0].content == "a < b"


def test_a_llama3_json_answer():
    answer, called = LLAMA.read(LLAMA_OSLO)
    assert called and answer.content is None
    assert [(c.function.name, c.function.arguments) for c in answer.tool_calls] == [
        ("get_weather", '{"city":"Oslo"}')
    ]
    reader = LLAMA.reader()
    streamed = [reader.feed(p) for p in pieces(LLAMA_OSLO, 4)]
    assert sum(len(a.tool_calls) for a in streamed) == 1 and not any(a.content for a in streamed)
    assert LLAMA.read("It is sunny.") == (type(answer)("It is sunny."), False)
    cut, called = LLAMA.read('{"name": "get_weather", "param')
    assert cut.content is None and not cut.tool_calls and not called


@pytest.mark.parametrize(
    ("choice", "text", "accepted"),
    [
        (None, "It is sunny.", True),
        (None, f"[TOOL_CALLS][{M_OSLO}, {M_SUM}]", True),
        (None, f"[TOOL_CALLS][{M_OSLO}]", True),
        (None, "[TOOL_CALLS] and then words", False),
        (None, f"Let me look. [TOOL_CALLS][{M_OSLO}]", False),  # the marker never in text (content)
        (None, f"[TOOL_CALLS][{M_OSLO},{M_SUM}]", False),  # spaced as the template writes
        ("required", "It is sunny.", False),
        ("required", f"[TOOL_CALLS][{M_SUM}]", True),
        ("add", f"[TOOL_CALLS][{M_SUM}, {M_SUM}]", False),  # a named tool: one call
    ],
)
def test_the_mistral_grammar(choice, text, accepted):
    assert accepts(MISTRAL, choice, text) is accepted


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_a_mistral_answer_streams_whole_calls(size):
    reader = MISTRAL.reader()
    got = [reader.feed(p) for p in pieces(f"[TOOL_CALLS][{M_OSLO}, {M_SUM}]", size)] + [reader.finish()]
    assert not any(a.content for a in got) and reader.called_tools
    assert [c.function.name for a in got for c in a.tool_calls] == ["get_weather", "add"]
    answer, called = MISTRAL.read(f"[TOOL_CALLS][{M_OSLO}, {M_OSLO}, {M_SUM}")
    assert called and [c.function.name for c in answer.tool_calls] == ["get_weather"]  # a repetition ends it
    reader = MISTRAL.reader()
    reader.feed(f"[TOOL_CALLS][{M_OSLO}, {M_OSLO}")
    assert reader.cut_at == len(f"[TOOL_CALLS][{M_OSLO}")  # where the engine ends it, then "]"
    cut, called = MISTRAL.read(f'[TOOL_CALLS][{M_OSLO}, {{"name": "ad')
    assert not called and cut.content is None and [c.function.name for c in cut.tool_calls] == ["get_weather"]
    assert MISTRAL.read("[TOOL_CA") == (type(answer)(None), False)
    assert MISTRAL.read("Sunny.") == (type(answer)("Sunny."), False)


def test_mistral_templates_get_call_ids_of_nine_characters():
    call = ToolCall(
        id="call_0123456789abcdef", function=FunctionCall(name="add", arguments='{"a": 1, "b": 2}')
    )
    turns = [
        ChatTurn(role="user", content="1 + 2?"),
        ChatTurn(role="assistant", content="", tool_calls=[call]),
        ChatTurn(role="tool", content="3", tool_call_id=call.id),
    ]
    _, assistant, tool = MISTRAL.render(turns, None).messages
    short = assistant["tool_calls"][0]["id"]
    assert len(short) == 9 and short.isalnum() and tool["tool_call_id"] == short


def test_every_syntax_can_be_named_in_a_generation_request():
    """The engine's request names the syntax of its answer: each one Parrot knows is a value
    the request takes (a new syntax missing there was a 424 on the front)."""
    from typing import get_args, get_type_hints

    from parrot.wire.sampling import SamplingParams

    assert set(get_args(get_type_hints(SamplingParams)["tool_syntax"])) == set(SYNTAXES)
