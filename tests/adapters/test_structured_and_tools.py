"""``ParrotChatModel.with_structured_output`` and ``.bind_tools`` against a real
``parrot serve`` (builtin engine, bundled model): pydantic, dict and TypedDict schemas,
``include_raw``, tool calls in ``AIMessage.tool_calls``, a tool-calling agent loop written
with plain langchain-core, and ``compile_chain`` with a structured step."""

from __future__ import annotations

import json
import uuid
from operator import attrgetter, itemgetter
from typing import TypedDict

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.tools import tool
from pydantic import BaseModel, ConfigDict, Field

from parrot.adapters.langchain import CompileError, ParrotChatModel, compile_chain
from parrot.sdk import Var

from .conftest import submitted_before_any_finished


class City(BaseModel):
    """A city and its country."""

    model_config = ConfigDict(extra="forbid")  # no keys but these: the answer stays short

    name: str = Field(max_length=16)
    country: str = Field(max_length=16)


class Weather(TypedDict):
    city: str
    celsius: int


DICT_SCHEMA = {
    "title": "Answer",
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def get_weather(city: str) -> str:
    """The weather in a city today."""
    return f"Sunny and 21 degrees in {city}."


@pytest.fixture
def model(parrot_url) -> ParrotChatModel:
    return ParrotChatModel(base_url=parrot_url, max_tokens=48, temperature=0)


def test_structured_output_pydantic_dict_and_typeddict(model):
    question = [HumanMessage("What is the capital of France? Answer in JSON.")]
    city = model.with_structured_output(City).invoke(question)
    assert isinstance(city, City) and city.name
    answer = model.with_structured_output(DICT_SCHEMA).invoke(question)
    assert set(answer) == {"answer", "sure"} and isinstance(answer["sure"], bool)
    weather = model.with_structured_output(Weather, strict=True).invoke("How warm is it in Rome? In JSON.")
    assert set(weather) == {"city", "celsius"} and isinstance(weather["celsius"], int)


def test_structured_output_include_raw_and_json_mode(model):
    result = model.with_structured_output(City, include_raw=True).invoke("Name a city in Peru, as JSON.")
    assert set(result) == {"raw", "parsed", "parsing_error"}
    assert isinstance(result["raw"], AIMessage) and result["parsing_error"] is None
    assert City.model_validate_json(result["raw"].content) == result["parsed"]
    assert result["raw"].response_metadata["parrot_call_id"]  # a semantic call with a typed output
    anything = model.with_structured_output(method="json_mode").invoke("Give a cat's name and age as JSON.")
    assert isinstance(anything, dict)


async def test_structured_output_async_and_batch(model):
    structured = model.with_structured_output(City)
    got = await structured.ainvoke("Name a city in Chile, as JSON.")
    assert isinstance(got, City)
    both = structured.batch(["Name a city in Kenya, as JSON.", "Name a city in Egypt, as JSON."])
    assert all(isinstance(c, City) for c in both)


def test_bind_tools_fills_tool_calls(model):
    # strict: the arguments are closed objects (no keys but the tool's own), as in OpenAI
    forced = model.bind_tools([add, get_weather], tool_choice="add", strict=True)
    reply = forced.invoke("What is 2 plus 3?")
    assert isinstance(reply, AIMessage) and len(reply.tool_calls) >= 1
    call = reply.tool_calls[0]
    assert call["name"] == "add" and call["id"] and call["type"] == "tool_call"
    assert isinstance(call["args"]["a"], int) and isinstance(call["args"]["b"], int)
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    assert reply.invalid_tool_calls == []
    any_tool = model.bind_tools([add, get_weather], tool_choice="any", strict=True).invoke("Weather in Oslo?")
    assert any_tool.tool_calls and any_tool.tool_calls[0]["name"] in ("add", "get_weather")
    chunks = list(forced.stream("What is 4 plus 5?"))  # the whole answer, then LangChain's last
    assert len(chunks) <= 2 and chunks[0].tool_call_chunks[0]["name"] == "add"
    merged = sum(chunks[1:], chunks[0])
    assert merged.tool_calls[0]["name"] == "add" and set(merged.tool_calls[0]["args"]) == {"a", "b"}


def test_required_tools_with_parallel_calls_do_not_run_away(model):
    # Issue 36: LangChain's defaults (parallel calls on) and a budget of 64 tokens: the
    # bundled model repeats its one call; the answer is that call, not the protocol's text.
    asked = model.model_copy(update={"max_tokens": 64}).bind_tools([get_weather], tool_choice="required")
    reply = asked.invoke("What is the weather in Oslo?")
    assert [c["name"] for c in reply.tool_calls] == ["get_weather"] and reply.content == ""
    assert reply.invalid_tool_calls == [] and reply.response_metadata["finish_reason"] == "tool_calls"
    chunks = list(asked.stream("What is the weather in Oslo?"))
    merged = sum(chunks[1:], chunks[0])
    assert merged.content == "" and [c["name"] for c in merged.tool_calls] == ["get_weather"]
    assert merged.tool_calls[0]["args"] == reply.tool_calls[0]["args"]


def test_a_labelled_models_tool_requests_are_found_on_the_requests_page(model, parrot_url):
    """Issue 38: calls with tools run on the OpenAI-compatible chat route, which opens no
    session; the model's ``session_label`` and ``session_tags`` name them there."""
    label = f"tide agent {uuid.uuid4().hex[:6]}"
    named = model.model_copy(update={"session_label": label, "session_tags": ["harbour", "shift=night"]})
    tools = named.bind_tools([get_weather], tool_choice="required")
    assert tools.invoke("What is the weather in Oslo?").tool_calls
    assert list(tools.stream("What is the weather in Bergen?"))
    page = httpx.get(f"{parrot_url}/requests", params={"q": label}, timeout=30)
    assert page.status_code == 200 and page.text.count("<tr data-request=") == 2
    assert "harbour" in page.text and "shift=night" in page.text and "get_weather" in page.text


def run_agent(model: ParrotChatModel, messages: list[BaseMessage], turns: int = 3) -> list[BaseMessage]:
    """A tool-calling agent loop, as langchain-core users write it: ask, run each tool the
    answer calls, send the results back as ToolMessages, until the model answers in text."""
    tools = {t.name: t for t in (add, get_weather)}
    first = model.bind_tools(list(tools.values()), tool_choice="any", strict=True)  # calls a tool
    then = model.bind_tools(list(tools.values()), strict=True)
    for turn in range(turns):
        reply = (first if turn == 0 else then).invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(tools[call["name"]].invoke(call))  # a ToolMessage
    return messages


def test_a_two_turn_agent_loop(model):
    messages = run_agent(
        model.model_copy(update={"max_tokens": 32}),
        [SystemMessage("You can call tools."), HumanMessage("What is the weather in Paris?")],
    )
    assert isinstance(messages[2], AIMessage) and messages[2].tool_calls
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert tool_messages and tool_messages[0].tool_call_id == messages[2].tool_calls[0]["id"]
    assert isinstance(messages[-1], AIMessage | ToolMessage)
    assert len(messages) >= 5  # the tool's result went back and the model answered again
    assert isinstance(messages[4], AIMessage)


def test_a_chat_with_tool_turns_but_no_tools_bound(model):
    """A conversation that holds tool calls and their results is accepted as it is."""
    history = [
        HumanMessage("What is 2 plus 3?"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 3}, "id": "call_1"}]),
        ToolMessage("5", tool_call_id="call_1"),
    ]
    reply = model.model_copy(update={"max_tokens": 8}).invoke(history)
    assert isinstance(reply, AIMessage) and reply.tool_calls == []
    assert reply.usage_metadata["input_tokens"] > 0


def test_bad_tool_and_schema_arguments_are_clear(model):
    with pytest.raises(ValueError, match="not a bound tool"):
        model.bind_tools([add], tool_choice="multiply")
    with pytest.raises(ValueError, match="unsupported arguments"):
        model.with_structured_output(City, mode="x")
    with pytest.raises(ValueError, match="method"):
        model.with_structured_output(City, method="xml")
    with pytest.raises(ValueError, match="needs a schema"):
        model.with_structured_output()


def test_compile_chain_maps_a_structured_step_onto_a_typed_variable(model, parrot):
    """The structured step is one semantic call whose output variable is typed on the
    server (its value comes back parsed to any reader); the parser runs on the client, so
    the compiled chain returns what the chain returns."""
    extract = ChatPromptTemplate.from_template("Name a city in {country}, as JSON.") | (
        model.with_structured_output(City)
    )
    chain = {"city": extract} | RunnableLambda(itemgetter("city")) | RunnableLambda(lambda c: c.name)
    with parrot.session() as session:
        got = compile_chain(chain).invoke({"country": "Japan"})
        (city,) = [v for v in session.info().vars if v.name == "city"]
        reader = Var(parrot.attach(session.session_id, session.session_auth), city.var_id, "city")
        assert reader.get() == {"name": got, "country": reader.get()["country"]}
    assert got == chain.invoke({"country": "Japan"})


def test_compile_chain_reads_a_structured_field_on_the_server(model, parrot):
    """A later step's prompt formats a field of the structured output (``itemgetter`` /
    ``attrgetter``): compiled, that is the placeholder ``{{city.name}}`` of a call submitted
    before the city exists, filled on the server; the chain returns what the uncompiled
    chain returns."""
    extract = ChatPromptTemplate.from_template("Name a city in {country}, as JSON.") | (
        model.with_structured_output(City)
    )
    describe = ChatPromptTemplate.from_template("Say one thing about {name}.") | model.bind(max_tokens=6)
    chain = (
        {"city": extract}
        | RunnablePassthrough.assign(name=itemgetter("city") | RunnableLambda(attrgetter("name")))
        | RunnablePassthrough.assign(note=describe | StrOutputParser())
    )
    with parrot.session() as session:
        compiled = compile_chain(chain).invoke({"country": "France"})
        calls = [session.call_info(c.call_id) for c in session.info().calls]
    assert len(calls) == 2 and submitted_before_any_finished(calls)
    assert calls[1].timings["started_at"] >= calls[0].timings["finished_at"]
    assert isinstance(compiled["city"], City) and compiled["name"] == compiled["city"].name
    assert compiled == chain.invoke({"country": "France"})


def test_compile_chain_refuses_a_model_with_tools(model):
    chain = ChatPromptTemplate.from_template("{q}") | model.bind_tools([add])
    with pytest.raises(CompileError, match="tools"):
        compile_chain(chain)


def test_tool_calls_round_trip_as_openai_messages(model):
    """What the adapter sends for tool turns is OpenAI's shape (checked without a server)."""
    from parrot.adapters.langchain.tool_calling import openai_messages

    sent = openai_messages(
        [
            AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}]),
            ToolMessage("3", tool_call_id="c1"),
        ]
    )
    assert sent[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}
    assert sent[1] == {"role": "tool", "tool_call_id": "c1", "content": "3"}
