"""Chains that ``compile_chain`` refuses, at compile time (nothing is sent): each error
says which step, and what to change."""

from __future__ import annotations

import re

import pytest
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.output_parsers import JsonOutputParser, StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableBranch, RunnableLambda, RunnablePassthrough

from parrot.adapters.langchain import CompiledChain, CompileError, ParrotLLM, compile_chain

from .chains import chatml, name_step

UNREACHABLE = "http://127.0.0.1:9"  # compiling sends nothing


@pytest.fixture
def llm() -> ParrotLLM:
    return ParrotLLM(base_url=UNREACHABLE, max_tokens=8)


def refused(chain, *phrases: str) -> str:
    with pytest.raises(CompileError) as error:
        compile_chain(chain)
    message = str(error.value)
    for phrase in phrases:
        assert phrase in message, message
    return message


def test_models_that_are_not_parrots_are_refused(llm):
    other = FakeListLLM(responses=["x"])
    refused(chatml("{q}") | other, "step 2 of the chain is FakeListLLM, not a Parrot model", "ParrotLLM")
    refused({"a": name_step(llm), "b": chatml("{q}") | other}, "step 2 of branch 'b' of the chain")


def test_templates_that_look_into_their_values_are_refused(llm):
    jinja = PromptTemplate.from_template("Hi {{ name | upper }}", template_format="jinja2")
    refused(jinja | llm, "jinja2 PromptTemplate", "f-string")
    refused(PromptTemplate.from_template("Hi {name!r}") | llm, "{name!r}", "plain {name} placeholders")
    refused(PromptTemplate.from_template("Hi {name:>10}") | llm, "{name:>10}")
    chat = ChatPromptTemplate.from_messages([("system", "Be {mood!s}."), ("human", "{q}")])
    refused(chat | llm, "message 1 of step 1 of the chain", "{mood!s}")
    image = ChatPromptTemplate.from_messages(
        [("human", [{"type": "image_url", "image_url": "data:image/png;base64,{img}"}])]
    )
    refused(image | llm, "ImagePromptTemplate part", "text only")


def test_runnables_it_does_not_map_are_refused(llm):
    branch = RunnableBranch((lambda x: len(x) > 3, chatml("{q}") | llm), chatml("{q}") | llm)
    message = refused(branch, "the chain is a RunnableBranch", "RunnableLambda(lambda x: step.invoke(x))")
    assert "Compile the parts before and after it separately" in message
    refused(name_step(llm).with_fallbacks([name_step(llm)]), "RunnableWithFallbacks")
    refused(name_step(llm).with_retry(), "RunnableRetry")
    refused(chatml("{q}").bind(foo=1) | llm, "binds arguments ['foo']")


def test_bad_sampling_in_a_binding_is_refused(llm):
    refused(chatml("{q}") | llm.bind(temperature=-1), "step 2 of the chain", "temperature")
    refused(chatml("{q}") | llm.bind(top_q=0.5), "unknown arguments ['top_q']")


def test_chains_without_parrot_models_or_on_two_servers_are_refused(llm):
    refused(chatml("{q}") | StrOutputParser(), "no ParrotLLM or ParrotChatModel")
    other = ParrotLLM(base_url="http://127.0.0.1:10", max_tokens=8)
    refused({"a": chatml("{q}") | llm, "b": chatml("{q}") | other}, "different servers", "same base_url")


def test_functions_retrievers_and_parsers_compile_to_client_steps(llm):
    chain = (
        RunnableLambda(lambda q: {"q": q.strip()})
        | RunnablePassthrough(lambda x: None)
        | chatml("{q}")
        | llm
        | JsonOutputParser()
    )
    compiled = compile_chain(chain)
    assert isinstance(compiled, CompiledChain) and compiled.InputType is chain.InputType
    assert re.fullmatch(r"Compiled\w+", compiled.get_name())
