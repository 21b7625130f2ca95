"""``compile_chain`` against a Parrot server (the API on the fake engine: ``server_url``; the
real ``parrot serve`` runs compiled chains in test_langchain_examples.py and
test_structured_and_tools.py): a compiled chain returns what the chain returns, submits its
whole DAG before reading anything, reads only its final outputs, shares input variables,
and runs client steps between server stages."""

from __future__ import annotations

import logging

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from parrot.adapters.langchain import compile_chain

from .chains import (
    chat_chain,
    chatml,
    map_reduce,
    name_step,
    slogan_step,
    two_step_dict,
    two_step_text,
)
from .conftest import gets, submitted_before_any_finished

BAKERY = {"thing": "seaside bakery"}


def in_session(server, run):
    """``run()`` inside an SDK session; returns its result and the session's calls."""
    with server.session() as session:
        result = run()
        return result, session.info()


def test_compiled_chain_returns_the_same_structure(llm, chat):
    chain = two_step_dict(llm)
    step_by_step, compiled = chain.invoke(BAKERY), compile_chain(chain).invoke(BAKERY)
    assert set(compiled) == set(step_by_step) == {"name", "slogan"}
    assert all(isinstance(v, str) and v.strip() for v in compiled.values())
    history = [HumanMessage("Hi."), AIMessage("Hello.")]
    chat_input = {"topic": "the tide", "history": history}
    chain = chat_chain(chat)
    reply, compiled_reply = chain.invoke(chat_input), compile_chain(chain).invoke(chat_input)
    assert type(compiled_reply) is type(reply) is AIMessage and compiled_reply.content.strip()
    assert compiled_reply.usage_metadata["output_tokens"] <= 8
    assert compiled_reply.response_metadata["model_name"] == reply.response_metadata["model_name"]


def test_compiled_chain_generates_the_same_greedy_text(llm, chat):
    """The server tokenizes a call's whole rendered prompt, so the compiled prompt (constant
    text and variables) is the same tokens as the prompt LangChain formats."""
    chain = two_step_dict(llm)
    assert compile_chain(chain).invoke(BAKERY) == chain.invoke(BAKERY)
    chat_input = {"topic": "the tide", "history": []}
    chain = chat_chain(chat)
    assert compile_chain(chain).invoke(chat_input).content == chain.invoke(chat_input).content


def test_compiled_chain_submits_everything_before_reading_its_output(llm, server, server_url):
    chain = two_step_text(llm)
    before = gets(server_url)
    slogan, info = in_session(server, lambda: compile_chain(chain).invoke(BAKERY))
    assert isinstance(slogan, str) and slogan.strip()
    # One read: the chain's output. The name was never fetched by the client.
    assert gets(server_url) - before == 1
    name, second = info.calls
    assert all(c.state == "done" for c in info.calls)
    # On the server before the name existed, and run by the server once it did.
    assert second.timings["submitted_at"] <= name.timings["finished_at"] <= second.timings["started_at"]
    names = [v.name for v in info.vars]
    assert names.count("thing") == 1 and "name" in names  # the LangChain variables, as semantic variables

    # The same chain step by step reads the name, then submits the slogan call.
    before = gets(server_url)
    _, info = in_session(server, lambda: chain.invoke(BAKERY))
    assert gets(server_url) - before == 2
    name, second = info.calls
    assert second.timings["submitted_at"] >= name.timings["finished_at"]


def test_compiled_map_reduce_runs_its_maps_as_one_group(llm, server, server_url):
    stories = ["a fox and grapes", "a crow and a jug", "a hare", "ants"]
    parts = {f"part{i}": text for i, text in enumerate(stories)}
    chain = map_reduce(llm, 4)
    before = gets(server_url)
    moral, info = in_session(server, lambda: compile_chain(chain).invoke(parts))
    assert isinstance(moral, str) and gets(server_url) - before == 1
    *maps, reduce = info.calls
    assert len(maps) == 4 and all(c.state == "done" for c in info.calls)
    assert max(c.timings["submitted_at"] for c in info.calls) <= min(m.timings["finished_at"] for m in maps)
    # The maps ran together (each started before any finished), the reduce after all of them.
    assert max(m.timings["started_at"] for m in maps) <= min(m.timings["finished_at"] for m in maps)
    assert reduce.timings["started_at"] >= max(m.timings["finished_at"] for m in maps)


def test_parallel_branches_share_their_input_variable(llm, server):
    fact = PromptTemplate.from_template("A fact about {topic}:") | llm
    joke = PromptTemplate.from_template("A joke about {topic}:") | llm
    compiled = compile_chain({"fact": fact, "joke": joke})  # the dict shorthand
    out, info = in_session(server, lambda: compiled.invoke({"topic": "tides"}))
    assert set(out) == {"fact", "joke"}
    assert len(info.calls) == 2 and [v.name for v in info.vars].count("topic") == 1


def test_client_steps_run_between_server_stages(llm, server):
    seen: list[str] = []

    def shout(name: str) -> str:
        seen.append(name)
        return name.strip().upper()

    chain = name_step(llm) | RunnableLambda(shout) | {"name": RunnablePassthrough()} | slogan_step(llm)
    compiled = compile_chain(chain)
    slogan, info = in_session(server, lambda: compiled.invoke({"thing": "boat"}))
    assert isinstance(slogan, str) and len(seen) == 1 and "⟦" not in seen[0]  # the real text
    name, second = info.calls
    assert second.timings["submitted_at"] >= name.timings["finished_at"]  # a stage boundary


def test_compiled_batch_runs_all_inputs_in_one_session(llm, server):
    compiled = compile_chain(two_step_dict(llm))
    inputs = [{"thing": "boat"}, {"thing": "kite"}, {"thing": "lamp"}]
    outputs, info = in_session(server, lambda: compiled.batch(inputs))
    assert [set(o) for o in outputs] == [{"name", "slogan"}] * 3
    assert len(info.calls) == 6
    assert submitted_before_any_finished(info.calls)


async def test_compiled_ainvoke_and_abatch(llm):
    compiled = compile_chain(two_step_text(llm))
    assert (await compiled.ainvoke(BAKERY)).strip()
    first, second = await compiled.abatch([BAKERY, {"thing": 3}])
    assert isinstance(first, str) and isinstance(second, str)


def test_compiled_criteria_come_from_the_run_metadata(llm, caplog):
    compiled = compile_chain(chatml("Hi {q}") | llm.bind(max_tokens=2))
    with caplog.at_level(logging.INFO, logger="httpx"):
        compiled.invoke({"q": "there"}, config={"metadata": {"parrot_criteria": "throughput"}})
    gets = [m for m in (r.getMessage() for r in caplog.records) if "GET" in m and "semantic_var" in m]
    assert len(gets) == 1 and "criteria=throughput" in gets[0]


def test_braces_in_templates_and_values_are_text(llm):
    prompt = PromptTemplate.from_template('Complete the JSON {{"name": "{name}", "kind":')
    chain = {"name": RunnablePassthrough()} | prompt | llm
    assert isinstance(compile_chain(chain).invoke("a}}b{{c"), str)


def test_chain_errors_are_the_chains_errors(llm):
    compiled = compile_chain(two_step_text(llm))
    with pytest.raises(KeyError, match="missing variables"):
        compiled.invoke({"object": "boat"})
    outputs = compiled.batch([BAKERY, {"object": "boat"}], return_exceptions=True)
    assert isinstance(outputs[0], str) and isinstance(outputs[1], KeyError)
