"""LCEL chains the adapter tests compile: built from real langchain-core parts."""

from __future__ import annotations

from operator import itemgetter

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableParallel, RunnablePassthrough


def chatml(user: str) -> PromptTemplate:
    """A prompt in the default model's chat format, with f-string placeholders."""
    return PromptTemplate.from_template(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def name_step(llm) -> Runnable:
    return chatml("Give one name for a {thing}.") | llm | StrOutputParser()


def slogan_step(llm) -> Runnable:
    return chatml("Write a slogan for {name}.") | llm | StrOutputParser()


def two_step_dict(llm) -> Runnable:
    """{"name", "slogan"}: the name, and a slogan written from it."""
    return {"name": name_step(llm)} | RunnablePassthrough.assign(slogan=slogan_step(llm))


def two_step_text(llm) -> Runnable:
    """Only the slogan: the name is an intermediate output."""
    return {"name": name_step(llm)} | slogan_step(llm)


def map_reduce(llm, parts: int) -> Runnable:
    """Each part summarized on its own (a branch per part), then one reduce over all."""
    summarize = chatml("Summarize in a few words: {part}") | llm | StrOutputParser()
    branches = {f"summary{i}": {"part": itemgetter(f"part{i}")} | summarize for i in range(parts)}
    maps = RunnableParallel(branches)
    lines = "\n".join(f"- {{summary{i}}}" for i in range(parts))
    reduce = chatml(f"What do these have in common?\n{lines}") | llm | StrOutputParser()
    return maps | reduce


def chat_chain(chat) -> Runnable:
    messages = [("system", "Answer in one short sentence."), ("placeholder", "{history}")]
    prompt = ChatPromptTemplate.from_messages([*messages, ("human", "What is {topic}?")])
    return prompt | chat
