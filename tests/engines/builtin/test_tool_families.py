"""Tool calls in a model's own syntax (issue 36 §2), on the real engine with the real
tokenizers and chat templates of Qwen2.5 (Hermes: ``<tool_call>`` tags), Llama 3.1 (JSON
with ``parameters``) and Mistral Nemo (``[TOOL_CALLS]`` and a list; Llama 2's tokenizer stands
in for its own) and random weights (tests/tool_models.py): the template renders the
tools and the tool turns, the answer is constrained to the model's syntax, and greedy output
parses back into OpenAI ``tool_calls`` whose arguments validate, streamed and not, on the
engine's ``/v1`` and the ServeCore's front (the official ``openai`` client), through
LangChain's ``bind_tools``, and in a two-turn agent loop. ``--tool-format generic`` keeps
Parrot's own format."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema_rs
import openai
import pytest
from servers import ServerThread
from tool_models import FAMILIES, missing_assets, write_tool_model

from parrot.adapters.langchain import ParrotChatModel
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.server.app import create_app as create_engine_app
from parrot.platform.api.app import create_app as create_serve_app
from parrot.platform.serve.core import ServeCore

pytestmark = pytest.mark.skipif(missing_assets() is not None, reason=missing_assets() or "")

# Bounded arguments: random weights write the longest value a schema allows.
ADD = {
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["a", "b"],
    },
}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city today.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8}},
        "required": ["city"],
    },
}
TOOLS = [{"type": "function", "function": f} for f in (WEATHER, ADD)]
SCHEMAS = {f["name"]: f["parameters"] for f in (WEATHER, ADD)}
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]
# What each template writes for the tools, and for a tool's result.
TOOL_BLOCK = {
    "qwen2.5": "<tools>",
    "llama3.1": "Given the following functions",
    "mistral-nemo": "[AVAILABLE_TOOLS]",
    "qwen3-coder": "<tools>\n<function>\n<name>get_weather</name>",
    "devstral": "[AVAILABLE_TOOLS]",
}
RESULT_TURN = {
    "qwen2.5": "<tool_response>\nsunny, 21 C\n</tool_response>",
    "llama3.1": "ipython<|end_header_id|>",
    "mistral-nemo": '[TOOL_RESULTS]{"content": sunny, 21 C, "call_id": "',
    "qwen3-coder": "<tool_response>\nsunny, 21 C\n</tool_response>",
    "devstral": "[TOOL_RESULTS]sunny, 21 C[/TOOL_RESULTS]",
}


class Family:
    def __init__(self, name: str, engine_url: str, front_url: str, model: str) -> None:
        self.name, self.engine_url, self.front_url, self.model = name, engine_url, front_url, model

    def client(self, front: bool) -> openai.OpenAI:
        url = self.front_url if front else self.engine_url
        return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(self, oai: openai.OpenAI, messages: list[dict] = QUESTION, **asked):
        """A greedy chat with the two tools."""
        return oai.chat.completions.create(
            model=self.model, messages=messages, tools=TOOLS, temperature=0, **asked
        )

    def render(self, messages: list[dict], **tools) -> tuple[str, str]:
        """The engine's rendering of a chat: the prompt, and the syntax it names."""
        body = {"messages": messages, **tools}
        answer = httpx.post(f"{self.engine_url}/render_chat", json=body, timeout=60).json()
        return "".join(answer["pieces"]), answer["tool_syntax"]


def serve(folder, model_cache_dir, tool_format: str = "auto") -> Iterator[tuple[BuiltinEngine, str]]:
    config = EngineConfig(
        model=str(folder),
        weights="exact",
        kv_cache_bytes=64 * 2**20,
        cache_dir=str(model_cache_dir),
        tool_format=tool_format,
    )
    engine = BuiltinEngine(config)
    engine.check_running()
    try:
        with ServerThread(create_engine_app(engine, manage_engine=False)) as server:
            yield engine, server.url
    finally:
        engine.stop()


@pytest.fixture(scope="module", params=["qwen2.5", "llama3.1", "mistral-nemo", "qwen3-coder", "devstral"])
def family(request, tmp_path_factory, model_cache_dir) -> Iterator[Family]:
    folder = write_tool_model(tmp_path_factory.mktemp("tool-models") / request.param, request.param)
    for engine, url in serve(folder, model_cache_dir):
        core = ServeCore()
        with ServerThread(create_serve_app(core, engine_urls=(url,))) as front:
            yield Family(request.param, url, front.url, engine.model_name)


def check_calls(message, finish_reason: str, names: set[str]) -> None:
    """Calls of offered tools whose arguments validate against their schemas."""
    assert finish_reason == "tool_calls" and message.tool_calls
    for call in message.tool_calls:
        assert call.function.name in names and call.id.startswith("call_")
        jsonschema_rs.validate(SCHEMAS[call.function.name], json.loads(call.function.arguments))


def test_the_template_renders_the_tools(family):
    prompt, syntax = family.render(QUESTION, tools=TOOLS)
    assert syntax == FAMILIES[family.name].syntax
    assert TOOL_BLOCK[family.name] in prompt and "get_weather" in prompt
    assert "You can call these tools" not in prompt  # not Parrot's generic block
    plain, _ = family.render(QUESTION)
    assert TOOL_BLOCK[family.name] not in plain


@pytest.mark.parametrize("front", [False, True], ids=["engine", "front"])
@pytest.mark.parametrize("choice", ["required", "add"])
def test_greedy_calls_parse_and_validate(family, front, choice):
    tool_choice = {"type": "function", "function": {"name": "add"}} if choice == "add" else choice
    names = {"add"} if choice == "add" else set(SCHEMAS)
    with family.client(front) as oai:
        whole = family.ask(oai, tool_choice=tool_choice, max_tokens=200)
        check_calls(whole.choices[0].message, whole.choices[0].finish_reason, names)
        assert len({c.function.arguments for c in whole.choices[0].message.tool_calls}) == len(
            whole.choices[0].message.tool_calls
        )  # no call twice: a repetition ends the list
        chunks = list(family.ask(oai, tool_choice=tool_choice, max_tokens=200, stream=True))
    deltas = [d for c in chunks for ch in c.choices for d in (ch.delta.tool_calls or ())]
    finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finish == ["tool_calls"] and not any(ch.delta.content for c in chunks for ch in c.choices)
    streamed = [(d.function.name, d.function.arguments) for d in deltas]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]


def test_a_call_cut_by_max_tokens_is_never_half_given(family):
    with family.client(front=True) as oai:
        cut = family.ask(oai, tool_choice="required", max_tokens=3)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert not choice.message.content  # the syntax's text never comes out as content


def test_an_agent_loop_in_the_models_own_syntax(family):
    """Ask, run the tool, send its result back: the second turn's prompt has the call and
    the result as the template writes them, and the model answers."""
    with family.client(front=True) as oai:
        first = family.ask(oai, tool_choice="required", max_tokens=200)
        call = first.choices[0].message.tool_calls[0]
        turns = [
            *QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ]
        second = family.ask(oai, turns, max_tokens=8)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    rendered_turns = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    prompt, _ = family.render(rendered_turns, tools=TOOLS)
    assert RESULT_TURN[family.name] in prompt
    assert call.function.name in prompt.split(QUESTION[0]["content"])[-1]  # the call, after the question


def test_langchain_bind_tools_gets_calls_in_the_models_syntax(family):
    model = ParrotChatModel(base_url=family.front_url, max_tokens=200, temperature=0)
    reply = model.bind_tools([ADD], tool_choice="add").invoke("What is 2 plus 3?")
    assert [c["name"] for c in reply.tool_calls] == ["add"] and reply.invalid_tool_calls == []
    jsonschema_rs.validate(SCHEMAS["add"], reply.tool_calls[0]["args"])


def test_tool_format_generic_keeps_parrots_format(tmp_path, model_cache_dir):
    folder = write_tool_model(tmp_path / "qwen2.5", "qwen2.5")
    for engine, url in serve(folder, model_cache_dir, tool_format="generic"):
        generic = Family("qwen2.5", url, url, engine.model_name)
        prompt, syntax = generic.render(QUESTION, tools=TOOLS)
        assert syntax == "generic" and "You can call these tools" in prompt
        with generic.client(front=False) as oai:
            answer = generic.ask(oai, tool_choice="required", max_tokens=200)
        check_calls(answer.choices[0].message, answer.choices[0].finish_reason, set(SCHEMAS))
