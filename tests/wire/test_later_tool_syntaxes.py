"""The later models' own tool syntaxes (parrot.wire.tool_syntax; issue 36 §2): Qwen3-Coder's
and Qwen3.5's XML calls (``qwen3_xml``) and Mistral Small 3.1+ / Devstral / Ministral 3's
``[TOOL_CALLS]name[ARGS]{...}`` (``mistral_v11``): each grammar over bytes with llguidance, as
the engine's constraint is, and the readers of an answer as it streams. The helpers and the
two tools are test_tool_syntax.py's; the real engine: tests/engines/builtin/test_tool_families.py."""

from __future__ import annotations

import json

import pytest
from test_tool_syntax import ADD, WEATHER, accepts, pieces
from tool_models import ASSETS, FAMILIES, missing_assets

from parrot.engines.protocol.grammar import text_mismatch
from parrot.wire.openai_schemas import FunctionDefinition
from parrot.wire.tool_calls import ToolAnswer, plan_tools
from parrot.wire.tool_syntax import SYNTAXES

XML, NAMED = SYNTAXES["qwen3_xml"], SYNTAXES["mistral_v11"]


X_OSLO = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
)
X_SUM = (
    "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
    "</function>\n</tool_call>"
)


@pytest.mark.parametrize(
    ("choice", "text", "accepted"),
    [
        (None, "The weather is fine.", True),
        (None, X_OSLO, True),
        (None, f"Let me look.\n{X_OSLO}\n{X_SUM}", True),  # text, then calls
        (None, X_OSLO.replace("get_weather", "get_time"), False),  # not a tool
        (None, X_SUM.replace("\n2\n", "\ntwo\n"), False),  # an integer is an integer
        (None, X_SUM.replace("<parameter=b>\n2\n</parameter>\n", ""), False),  # b is required
        (None, X_OSLO.replace("Oslo", "New\nYork, <b>NY</b>"), True),  # a string is any text
        ("required", X_OSLO, True),
        ("required", "The weather is fine.", False),
        ("required", f"Let me look.\n{X_OSLO}", False),
        ("add", X_SUM, True),
        ("add", X_OSLO, False),
        ("add", f"{X_SUM}\n{X_SUM}", False),  # a named tool: one call
    ],
)
def test_the_qwen3_xml_grammar(choice, text, accepted):
    assert accepts(XML, choice, text) is accepted


CITY = {"city": {"type": "string", "minLength": 2, "maxLength": 4}}


def test_a_qwen3_xml_string_keeps_its_length_bounds():
    short = FunctionDefinition(
        name="get_weather",
        parameters={"type": "object", "properties": CITY},
    )
    grammar = XML.output_format(plan_tools([short], "required"))
    assert text_mismatch(grammar, X_OSLO) is None
    assert text_mismatch(grammar, X_OSLO.replace("Oslo", "Paris")) is not None
    assert text_mismatch(grammar, X_OSLO.replace("Oslo", "O")) is not None


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_qwen3_xml_answer_streams_its_text_and_whole_calls_read_by_type(size):
    config = FunctionDefinition(
        name="configure",
        parameters={
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "on": {"type": "boolean"},
                "ratio": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        },
    )
    syntax = XML.bound(plan_tools([WEATHER, ADD, config], None))
    odd = (
        "<tool_call>\n<function=configure>\n<parameter=label>\n42\n</parameter>\n"
        "<parameter=on>\nTrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
        '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>'
    )
    reader = syntax.reader()
    said, calls = [], []
    for piece in pieces(f"Let me look.\n{X_OSLO}\n{X_SUM}\n{odd}", size):
        answer = reader.feed(piece)
        said.append(answer.content or "")
        calls += answer.tool_calls
        assert "<" not in "".join(said)  # the tags never come out as text
    said.append(reader.finish().content or "")
    assert "".join(said) == "Let me look.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("add", {"a": 1, "b": 2}),
        ("configure", {"label": "42", "on": True, "ratio": 0.5, "tags": ["a", "b"]}),  # "42": a string
    ]
    content, called = syntax.read(f"{X_OSLO}\n{X_OSLO}\n{X_SUM}")
    assert [c.function.name for c in content.tool_calls] == ["get_weather"] and called  # a repetition ends it
    content, called = syntax.read(f"{X_OSLO}\n<tool_call>\n<function=add>\n<parameter=a>\n1")
    assert [c.function.name for c in content.tool_calls] == ["get_weather"] and not called  # half a call


def test_a_qwen3_xml_grammar_writes_what_the_template_writes():
    """The template's own rendering of a call (its history) is an answer the grammar takes."""
    if missing_assets():
        pytest.skip(missing_assets())
    import jinja2

    template = (ASSETS / "templates" / FAMILIES["qwen3-coder"].template).read_text()
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    turns = [
        {"role": "user", "content": "1 + 2?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    text = env.from_string(template).render(messages=turns, tools=None, add_generation_prompt=False)
    written = text.split("<|im_start|>assistant")[-1].removesuffix("<|im_end|>\n").strip("\n")
    assert written == X_SUM
    assert accepts(XML, "required", written)


N_OSLO, N_SUM = '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}', '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'


@pytest.mark.parametrize(
    ("choice", "text", "accepted"),
    [
        (None, "The weather is fine.", True),
        (None, N_OSLO, True),
        (None, N_OSLO + N_SUM, True),
        (None, "Let me look." + N_OSLO, False),  # text or calls, never the marker in text
        (None, N_OSLO.replace("get_weather", "get_time"), False),  # not a tool
        (None, N_SUM.replace(", ", ","), False),  # spacing as the template writes JSON
        ("required", N_OSLO, True),
        ("required", "The weather is fine.", False),
        ("add", N_SUM, True),
        ("add", N_OSLO, False),
        ("add", N_SUM + N_SUM, False),  # a named tool: one call
    ],
)
def test_the_mistral_v11_grammar(choice, text, accepted):
    assert accepts(NAMED, choice, text) is accepted


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_mistral_v11_answer_streams_whole_calls(size):
    reader = NAMED.reader()
    calls = []
    small_3_2 = N_SUM.replace("[ARGS]", "[CALL_ID]a1b2c3d4e[ARGS]")  # Small 3.2's past calls carry an id
    for piece in pieces(N_OSLO + small_3_2, size):
        answer = reader.feed(piece)
        assert not answer.content
        calls += answer.tool_calls
    assert not reader.finish().content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert reader.called_tools
    content, called = NAMED.read(N_OSLO + N_OSLO + N_SUM)
    assert [c.function.name for c in content.tool_calls] == ["get_weather"] and called  # a repetition ends it
    content, called = NAMED.read(N_OSLO + '[TOOL_CALLS]add[ARGS]{"a": 1')
    assert [c.function.name for c in content.tool_calls] == ["get_weather"] and not called  # half a call
    assert NAMED.read("Just words [TOOL_CALLS] here")[0].content == "Just words [TOOL_CALLS] here"
    assert NAMED.read("[TOOL_CA") == (type(content)(None), False)


# Hermes answers as small Qwen models write them without the tags (Qwen2.5-Coder-0.5B, asked
# the weather with tools: {"name": "get_weather", ...} and nothing else).
BARE_OSLO = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'


@pytest.mark.parametrize(
    ("choice", "text", "accepted"),
    [
        (None, BARE_OSLO, True),  # auto: one call, untagged, as the whole answer
        (None, "  \n" + BARE_OSLO, False),  # a call starts the answer (as llguidance's JSON does)
        (None, BARE_OSLO.replace("get_weather", "get_time"), False),  # not a tool
        (None, '{"weather": "fine"}', False),  # an answer that starts as JSON is a call
        (None, f"{BARE_OSLO}\n{BARE_OSLO}", False),  # one, untagged
        (None, "It is {mild} today.", True),  # braces further in are text
        ("required", BARE_OSLO, False),  # required: the model's tags (its token, or spelled)
    ],
)
def test_the_hermes_grammar_takes_one_untagged_call_in_auto(choice, text, accepted):
    assert accepts(SYNTAXES["hermes"], choice, text) is accepted


FENCED_OSLO = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```'


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        (FENCED_OSLO, True),  # in a JSON code fence, laid out as the model likes
        (FENCED_OSLO.replace("```json", "```"), True),
        (FENCED_OSLO.replace("get_weather", "get_time"), False),  # a fenced call is a call
        ("```python\nprint('hi')\n```", True),  # other code is text
    ],
)
def test_the_hermes_grammar_takes_one_fenced_call_in_auto(text, accepted):
    assert accepts(SYNTAXES["hermes"], None, text) is accepted


@pytest.mark.parametrize("size", [1, 4, 1000])
@pytest.mark.parametrize("text", ["\n" + BARE_OSLO, FENCED_OSLO])
def test_a_hermes_answer_may_be_one_untagged_or_fenced_call(text, size):
    reader = SYNTAXES["hermes"].reader()
    said, calls = [], []
    for piece in pieces(text, size):
        answer = reader.feed(piece)
        said.append(answer.content or "")
        calls += answer.tool_calls
    said.append(reader.finish().content or "")
    assert "".join(said) == "" and reader.called_tools
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]


def test_a_hermes_answer_that_only_looks_like_a_call_is_text():
    for text in ("It is {mild} today.", "```python\nprint('hi')\n```", "``"):
        assert SYNTAXES["hermes"].read(text) == (ToolAnswer(text), False)
    content, called = SYNTAXES["hermes"].read(BARE_OSLO[:20])  # cut: no half call, no text
    assert not content.content and not content.tool_calls and not called
