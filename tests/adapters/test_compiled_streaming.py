"""``compile_chain(chain).stream()`` / ``.astream()`` against a Parrot server (the API on
the fake engine: ``server_url``) (issue 22): the chain's final output streams from its
semantic variable while every step runs on the server in one session's DAG; the chunks
join to what ``invoke`` returns."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessageChunk

from parrot.adapters.langchain import ParrotChatModel, ParrotLLM, compile_chain
from parrot.sdk import AsyncSession, NotFoundError

from .chains import chat_chain, two_step_dict, two_step_text
from .conftest import gets

BAKERY = {"thing": "seaside bakery"}
LONGER = {"max_tokens": 24, "temperature": 0}


@pytest.fixture
def long_llm(server_url) -> ParrotLLM:
    return ParrotLLM(base_url=server_url, **LONGER)


def test_stream_hands_out_the_final_text_while_the_dag_runs_on_the_server(long_llm, server, server_url):
    compiled = compile_chain(two_step_text(long_llm))
    before = gets(server_url)
    with server.session() as session:
        chunks = list(compiled.stream(BAKERY))
        info = session.info()
    assert gets(server_url) == before  # nothing was waited for with a get: the slogan streamed
    assert len(chunks) >= 2 and all(isinstance(c, str) for c in chunks)
    assert "".join(chunks) == compiled.invoke(BAKERY)
    # Both steps ran in the one session, the slogan's call submitted before the name existed.
    name, slogan = info.calls
    assert all(c.state == "done" for c in info.calls)
    assert slogan.timings["submitted_at"] <= name.timings["finished_at"] <= slogan.timings["started_at"]


async def test_astream(long_llm):
    compiled = compile_chain(two_step_text(long_llm))
    chunks = [chunk async for chunk in compiled.astream(BAKERY)]
    assert len(chunks) >= 2 and "".join(chunks) == await compiled.ainvoke(BAKERY)


def test_a_chat_models_output_streams_as_message_chunks(server_url):
    chat = ParrotChatModel(base_url=server_url, **LONGER)
    compiled = compile_chain(chat_chain(chat))
    chat_input = {"topic": "the tide", "history": []}
    chunks = list(compiled.stream(chat_input))
    assert len(chunks) >= 3 and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    reply = compiled.invoke(chat_input)
    assert whole.content == reply.content
    # The same counts, but for the prompt's tokens read from the prefix cache: the second
    # run of a prompt finds at least what the first found (how much depends on what other
    # tests left cached on the shared server).
    streamed, invoked = dict(whole.usage_metadata), dict(reply.usage_metadata)
    cached = [usage.pop("input_token_details", {}).get("cache_read", 0) for usage in (streamed, invoked)]
    assert streamed == invoked
    assert cached[0] <= cached[1]
    assert whole.response_metadata["model_name"] == reply.response_metadata["model_name"]
    assert whole.response_metadata["finish_reason"] == reply.response_metadata["finish_reason"]


def test_an_output_that_is_not_a_text_comes_whole(llm):
    """As LangChain's own ``Runnable.stream`` yields such an output: in one chunk."""
    compiled = compile_chain(two_step_dict(llm))
    assert list(compiled.stream(BAKERY)) == [compiled.invoke(BAKERY)]


def test_a_stream_closed_early_deletes_its_session(long_llm, server, monkeypatch):
    deleted: list[str] = []
    delete = AsyncSession.delete

    async def recorded(session: AsyncSession) -> None:
        deleted.append(session.session_id)
        await delete(session)

    monkeypatch.setattr(AsyncSession, "delete", recorded)
    stream = compile_chain(two_step_text(long_llm)).stream(BAKERY)
    assert next(stream)
    stream.close()  # at once, not when the run's generation ends or the server expires it
    assert len(deleted) == 1
    with pytest.raises(NotFoundError):
        server.attach(deleted[0], "any").info()
