"""The OpenAI engine against a real OpenAI-compatible server: the builtin engine's /v1 routes."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import openai
import pytest
import pytest_asyncio

from parrot.engines.openai.config import OpenAIEngineConfig
from parrot.engines.openai.engine import OpenAIEngine
from parrot.engines.protocol.schemas import StreamEnd, TokenStreamEvent
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")

GREEDY = SamplingParams(max_tokens=12, temperature=0)
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def model_name(engine_server) -> str:
    models = httpx.get(f"{engine_server.url}/v1/models", timeout=30).json()
    return models["data"][0]["id"]


@pytest_asyncio.fixture(loop_scope="function", params=["chat", "completions"])
async def text_engine(request, engine_server, model_name):
    config = OpenAIEngineConfig(
        base_url=f"{engine_server.url}/v1", model=model_name, api=request.param, api_key="sk-live-test-key"
    )
    eng = OpenAIEngine(config)
    yield eng
    await eng.aclose()


@pytest_asyncio.fixture(loop_scope="function")
async def completions_engine(engine_server, model_name):
    eng = OpenAIEngine(
        OpenAIEngineConfig(base_url=f"{engine_server.url}/v1", model=model_name, api="completions")
    )
    yield eng
    await eng.aclose()


async def test_ping_reports_the_model_and_load(text_engine, model_name):
    info = await text_engine.ping()
    assert info["model"] == model_name and info["model_listed"] is True
    assert info["healthy"] is True and info["num_running"] == 0 and info["num_contexts"] == 0
    assert {"requests_done", "requests_failed", "retries", "capacity"} <= info.keys()


async def test_fill_fork_generate(text_engine):
    root, child = next(_ids), next(_ids)
    filled = await text_engine.fill(root, text="The capital of France is")
    assert (filled.filled_tokens, filled.context_len) == (24, 24)
    forked = await text_engine.fill(child, text=" Paris, and the capital of Italy is", parent_context_id=root)
    assert forked.context_len == 24 + 35
    out = next(_ids)
    result = await text_engine.generate(out, GREEDY, parent_context_id=child)
    assert result.context_id == out and result.text.strip() and result.token_ids == []
    assert result.finish_reason in {"stop", "length"} and result.prompt_tokens > 0
    info = await text_engine.ping()
    assert info["num_contexts"] == 3 and info["requests_done"] >= 1
    # the output context holds the prompt and the answer; freeing frees only its own text
    assert await text_engine.free_context(out) == len(result.text)
    assert await text_engine.free_context(out) == 0
    # a freed parent's forks keep working
    assert await text_engine.free_context(root) == 24
    again = await text_engine.generate(next(_ids), GREEDY, parent_context_id=child)
    assert again.text == result.text  # greedy: the same prompt, the same answer


async def test_completions_match_the_servers_own_greedy_output(completions_engine, engine_server, model_name):
    prompt = "The three primary colors are"
    root, leaf = next(_ids), next(_ids)
    await completions_engine.fill(root, text="The three primary")
    await completions_engine.fill(leaf, text=" colors are", parent_context_id=root)
    ours = await completions_engine.generate(next(_ids), GREEDY, parent_context_id=leaf)
    async with openai.AsyncOpenAI(base_url=f"{engine_server.url}/v1", api_key="x", max_retries=0) as client:
        theirs = await client.completions.create(
            model=model_name, prompt=prompt, max_tokens=12, temperature=0
        )
    assert ours.text == theirs.choices[0].text and ours.text
    assert ours.finish_reason == theirs.choices[0].finish_reason
    assert ours.prompt_tokens == theirs.usage.prompt_tokens


async def test_chat_answers_a_chatml_context(engine_server, model_name):
    config = OpenAIEngineConfig(base_url=f"{engine_server.url}/v1", model=model_name, api="chat")
    eng = OpenAIEngine(config)
    try:
        system = next(_ids)
        await eng.fill(system, text="<|im_start|>system\nAnswer in one word.<|im_end|>\n")
        question = next(_ids)
        await eng.fill(
            question,
            text="<|im_start|>user\nName a planet.<|im_end|>\n<|im_start|>assistant\n",
            parent_context_id=system,
        )
        result = await eng.generate(next(_ids), SamplingParams(max_tokens=16), parent_context_id=question)
        # the same messages sent directly give the same greedy answer
        async with openai.AsyncOpenAI(
            base_url=f"{engine_server.url}/v1", api_key="x", max_retries=0
        ) as client:
            direct = await client.chat.completions.create(
                model=model_name,
                messages=[
                    {"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": "Name a planet."},
                ],
                max_tokens=16,
                temperature=0,
            )
        assert result.text.strip() and result.text == direct.choices[0].message.content
    finally:
        await eng.aclose()


async def test_streaming_matches_the_plain_answer(text_engine):
    root = next(_ids)
    await text_engine.fill(root, text="Write a short greeting for a lighthouse keeper:")
    plain = await text_engine.generate(next(_ids), GREEDY, parent_context_id=root)
    events = [e async for e in text_engine.generate_stream(next(_ids), GREEDY, parent_context_id=root)]
    *deltas, end = events
    assert isinstance(end, StreamEnd) and all(isinstance(e, TokenStreamEvent) for e in deltas)
    assert len(deltas) > 1 and all(e.token_id == -1 for e in deltas)
    assert "".join(e.text for e in deltas) == end.text == plain.text
    assert end.finish_reason == plain.finish_reason and end.prompt_tokens == plain.prompt_tokens


async def test_a_dag_of_forks_generates_in_each_branch_concurrently(text_engine):
    """A shared prefix, two branches filled from it, both generating at once, then a
    consumer whose prompt includes both answers (what a ServeCore DAG does)."""
    shared = next(_ids)
    await text_engine.fill(shared, text="Facts about the ocean.\n")
    branches = []
    for topic in ("Tides:", "Waves:"):
        cid = next(_ids)
        await text_engine.fill(cid, text=topic, parent_context_id=shared)
        branches.append(cid)
    outs = [next(_ids) for _ in branches]
    results = await asyncio.gather(
        *(text_engine.generate(o, GREEDY, parent_context_id=b) for o, b in zip(outs, branches, strict=True))
    )
    assert all(r.text.strip() for r in results)
    for out in outs:
        await text_engine.free_context(out)
    consumer = next(_ids)
    await text_engine.fill(
        consumer, text=f"Summary of: {results[0].text} {results[1].text}\nIn short:", parent_context_id=shared
    )
    final = await text_engine.generate(next(_ids), GREEDY, parent_context_id=consumer)
    assert final.text.strip()
    assert (await text_engine.ping())["requests_done"] == 3
