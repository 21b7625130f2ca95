"""``ParrotLLM`` and ``ParrotChatModel`` against a Parrot server (the API on the fake
engine: ``server_url``; on the real ``parrot serve`` in test_structured_and_tools.py,
test_langchain_examples.py and test_texts.py): invoke, batch, stream (with callbacks), stop
strings, usage, criteria, chat templates, bad settings."""

from __future__ import annotations

import logging

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from pydantic import ValidationError

from parrot.adapters.langchain import ParrotChatModel, ParrotLLM
from parrot.sdk import ParrotError

from .conftest import metric, submitted_before_any_finished

PROMPT = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
FORKED = 'parrot:prompt_tokens_total{source="forked"}'  # prompt tokens found on an engine


class Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)


def test_llm_invoke_honours_stop_and_fills_usage(llm):
    result = llm.generate([PROMPT])
    text = result.generations[0][0].text
    info = result.generations[0][0].generation_info
    usage = result.llm_output["token_usage"]
    assert text.strip() and info["finish_reason"] in ("stop", "length") and info["parrot_call_id"]
    assert 0 < usage["completion_tokens"] <= 8 and usage["prompt_tokens"] > 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # A stop string taken from the greedy text cuts the same generation before it.
    stop = text.strip().split()[-1]
    cut = llm.invoke(PROMPT, stop=[stop])
    assert cut == text[: text.index(stop)]
    assert llm.invoke(PROMPT, max_tokens=2) == llm.bind(max_tokens=2).invoke(PROMPT)


def test_llm_batch_of_16_reaches_the_server_as_16_concurrent_calls(llm, server):
    prompts = [f"<|im_start|>user\nCount to {n}.<|im_end|>\n<|im_start|>assistant\n" for n in range(16)]
    with server.session() as session:  # the model's calls go into the enclosing session
        texts = llm.batch(prompts)
        calls = session.info().calls
    assert len(texts) == 16 and all(t.strip() for t in texts)
    assert len(calls) == 16 and all(c.state == "done" for c in calls)
    assert submitted_before_any_finished(calls)  # server clock


def test_a_batch_without_an_enclosing_session_shares_one_of_its_own(llm, chat):
    result = llm.generate(["One,", "Red,", "Up,"])
    sessions = {g[0].generation_info["parrot_session_id"] for g in result.generations}
    assert len(sessions) == 1 and len(result.generations) == 3
    replies = chat.batch(["Hi.", "Hello."])
    assert len({r.response_metadata["parrot_session_id"] for r in replies}) == 1


async def test_sync_invoke_inside_a_running_event_loop(llm):
    """A synchronous call from async code (a notebook, an async app) runs beside the loop."""
    assert llm.invoke(PROMPT, max_tokens=2) == await llm.ainvoke(PROMPT, max_tokens=2)


def test_llm_one_at_a_time_waits_between_calls(llm, server):
    """The contrast: invoke in a loop reaches the server one call after the other."""
    with server.session() as session:
        for n in range(2):
            llm.invoke(f"Count to {n}:")
        first, second = session.info().calls
    assert second.timings["submitted_at"] >= first.timings["finished_at"]


def test_llm_stream_yields_tokens_with_callbacks(llm):
    handler = Tokens()
    chunks = list(llm.stream(PROMPT, config={"callbacks": [handler]}))
    assert len([c for c in chunks if c]) > 1
    assert "".join(chunks) == llm.invoke(PROMPT)
    assert [t for t in handler.tokens if t] == [c for c in chunks if c]


async def test_llm_ainvoke_abatch_astream(llm):
    text = await llm.ainvoke(PROMPT)
    assert await llm.abatch([PROMPT, PROMPT]) == [text, text]
    chunks = [c async for c in llm.astream(PROMPT)]
    assert len([c for c in chunks if c]) > 1 and "".join(chunks) == text


def test_chat_renders_the_models_template_and_fills_usage(chat):
    reply = chat.invoke([("system", "Answer briefly."), ("human", "What does {x} mean in Python?")])
    assert isinstance(reply, AIMessage) and reply.content.strip()
    assert reply.usage_metadata["output_tokens"] <= 8 and reply.usage_metadata["input_tokens"] > 10
    assert reply.response_metadata["model_name"] and reply.response_metadata["finish_reason"]
    # The same chat as the server's /v1/chat/completions renders it, streamed.
    chunks = list(chat.stream([("system", "Answer briefly."), ("human", "Say hello.")]))
    assert len([c for c in chunks if c.content]) > 1
    assert sum(c.usage_metadata["output_tokens"] for c in chunks if c.usage_metadata) <= 8


async def test_chat_astream_calls_back_per_token(chat):
    handler = Tokens()
    chunks = [c async for c in chat.astream("Say hello.", config={"callbacks": [handler]})]
    texts = [c.content for c in chunks if c.content]
    assert len(texts) > 1 and [t for t in handler.tokens if t] == texts


def test_chat_batch_shares_one_system_prompt_prefix(chat, server_url, server):
    system = "You are the terse assistant of a test that counts shared prefixes. " * 4
    chats = [[("system", system), ("human", q)] for q in ("Hi.", "Open today?", "Any bread?")]
    forked = metric(server_url, FORKED)
    with server.session() as session:
        replies = chat.batch(chats)
        calls = session.info().calls
    assert len(replies) == 3 and all(isinstance(r, AIMessage) for r in replies)
    assert len(calls) == 3
    assert submitted_before_any_finished(calls)
    # The system message (some 60 tokens) is constant text at the start of every call: the
    # calls after the first forked it from the engine's context instead of computing it.
    assert metric(server_url, FORKED) - forked >= 2 * 50


def test_criteria_come_from_the_run_metadata(llm, caplog):
    with caplog.at_level(logging.INFO, logger="httpx"):
        llm.invoke("Hi", config={"metadata": {"parrot_criteria": "throughput"}})
        llm.invoke("Hi")
    gets = [m for m in (r.getMessage() for r in caplog.records) if "GET" in m and "semantic_var" in m]
    assert len(gets) == 2
    assert "criteria=throughput" in gets[0] and "criteria=latency" in gets[1]
    with pytest.raises(ValueError, match="parrot_criteria"):
        llm.invoke("Hi", config={"metadata": {"parrot_criteria": "fast"}})


def test_bad_settings_are_clear_errors(server_url):
    with pytest.raises(ValidationError, match="temperature"):
        ParrotLLM(base_url=server_url, temperature=-1)
    with pytest.raises(ValidationError, match="base_url must start with http"):
        ParrotChatModel(base_url="localhost:9000")
    llm = ParrotLLM(base_url=server_url, max_tokens=4)
    with pytest.raises(ValueError, match="unknown arguments \\['top_q'\\]"):
        llm.invoke("Hi", top_q=0.5)
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.invoke("")
    with pytest.raises(ParrotError, match="no registered engine serves"):
        ParrotLLM(base_url=server_url, model="no-such-model").invoke("Hi")


def test_the_models_label_the_sessions_they_open(fake_server):
    """Issue 38: ``session_label`` and ``session_tags`` name the sessions a model opens, so
    the dashboard finds them (a batch's one session too)."""
    url, core = fake_server
    llm = ParrotLLM(base_url=url, max_tokens=2, temperature=0, session_label="lc run", session_tags=["chain"])
    assert llm.invoke("Say yes:")
    (closed,) = core.views.session_summaries("lc run")  # deleted at the end of the run, still listed
    assert (closed.live, closed.tags) == (False, ("chain",))
    chat = ParrotChatModel(base_url=url, max_tokens=2, temperature=0, session_label="lc batch")
    assert len(chat.batch(["Say yes.", "Say no."])) == 2
    assert [s.calls for s in core.views.session_summaries("lc batch")] == [2]  # one session for both
    # Streams go to the OpenAI-compatible routes, which open no session: the requests page
    # finds them by the same label and tags.
    assert "".join(llm.stream("Say yes:"))
    assert [c.content for c in chat.stream("Say no.")]
    (streamed,) = core.views.recent_requests("lc run")
    asked = streamed.asked
    assert (asked.route, asked.label, asked.tags) == ("/v1/completions", "lc run", ("chain",))
    (chatted,) = core.views.recent_requests("lc batch")
    assert (chatted.asked.route, chatted.asked.tags) == ("/v1/chat/completions", ())
    with pytest.raises(ValidationError, match="session_label"):
        ParrotLLM(base_url=url, session_label="")
