"""The fake engine of the logic tests (tests/fake_engine) keeps the engine protocol: checked
through the ServeCore's own HTTP client, and against the real engine where both must answer
alike (the context rules a ServeCore relies on)."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from parrot.engines.protocol.errors import (
    AbortedError,
    BadRequestError,
    ContextConflictError,
    EngineUnavailableError,
    InvalidTokenError,
    UnknownContextError,
)
from parrot.engines.protocol.schemas import RenderChatRequest, StreamEnd, TokenStreamEvent
from parrot.platform.serve.engines.client import HttpEngine
from parrot.wire.chat import ChatTurn
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest_asyncio.fixture(loop_scope="function")
async def http(fake_engine):
    """The ServeCore's own HTTP client of the engine (``HttpEngine``), on the fake engine."""
    client = HttpEngine(fake_engine.url)
    yield client
    await client.aclose()


async def test_generations_depend_on_the_prompt_and_on_nothing_else(http, fake_engine):
    a = await http.generate(1, GREEDY, text="The keeper of the lighthouse")
    again = await http.generate(2, GREEDY, text="The keeper of the lighthouse")
    other = await http.generate(3, GREEDY, text="The tide tables of the harbour")
    assert a.text == again.text != other.text and len(a.token_ids) == 12 and a.finish_reason == "length"
    assert a.prompt_tokens == len(b"The keeper of the lighthouse")
    # A fork in the middle of a generation continues it exactly.
    await http.fill(4, text="The keeper of the lighthouse")
    half = await http.generate(4, SamplingParams(max_tokens=5, ignore_eos=True))
    rest = await http.generate(5, SamplingParams(max_tokens=7, ignore_eos=True), parent_context_id=4)
    assert half.text + rest.text == a.text and rest.cached_tokens == a.prompt_tokens + 5
    assert fake_engine.engine.text_of(5) == "The keeper of the lighthouse" + a.text


async def test_streams_stop_strings_stop_tokens_and_end_of_sequence(http, fake_engine):
    events = [e async for e in http.generate_stream(1, GREEDY, text="Log of the tender")]
    *tokens, end = events
    assert isinstance(end, StreamEnd) and all(isinstance(e, TokenStreamEvent) for e in tokens)
    assert "".join(e.text for e in tokens) == end.text and len(tokens) == 12
    stop = end.text[4:6]
    cut = await http.generate(2, SamplingParams(max_tokens=12, stop=[stop]), text="Log of the tender")
    assert (cut.text, cut.finish_reason, cut.stop_string) == (end.text[: end.text.index(stop)], "stop", True)
    streamed = [
        e
        async for e in http.generate_stream(
            3, SamplingParams(max_tokens=12, stop=[stop]), text="Log of the tender"
        )
    ]
    assert "".join(e.text for e in streamed[:-1]) == cut.text  # the stop string was held back
    by_id = await http.generate(
        4, SamplingParams(max_tokens=12, stop_token_ids=[end.token_ids[3]]), text="Log of the tender"
    )
    assert by_id.token_ids == end.token_ids[:3] and by_id.finish_reason == "stop"
    fake_engine.engine.eos_after = 2
    ended = await http.generate(5, SamplingParams(), text="x")
    assert len(ended.token_ids) == 2 and ended.finish_reason == "stop"
    assert len((await http.generate(6, GREEDY, text="x")).token_ids) == 12  # ignore_eos
    assert len(fake_engine.engine.contexts[5].tokens) == 1 + 2  # the end token is not kept


async def test_jobs_wait_for_room_the_highest_priority_first(http, fake_engine):
    fake = fake_engine.engine
    fake.max_running, fake.step_s = 1, 0.002
    first = asyncio.create_task(http.generate(1, GREEDY, text="first"))
    while fake.stats_now()["num_running"] < 1:
        await asyncio.sleep(0.001)
    low = asyncio.create_task(http.generate(2, GREEDY, text="low", priority=0))
    high = asyncio.create_task(http.generate(3, GREEDY, text="high", priority=5))
    while fake.stats_now()["num_waiting"] < 2:
        await asyncio.sleep(0.001)
    done_order = []
    for task in asyncio.as_completed([first, low, high]):
        done_order.append((await task).context_id)
    assert done_order == [1, 3, 2]


async def test_abort_stops_a_running_job_and_frees_its_context(http, fake_engine):
    fake_engine.engine.step_s = 0.01
    job = asyncio.create_task(http.generate(1, SamplingParams(max_tokens=1000, ignore_eos=True), text="long"))
    while not fake_engine.engine.contexts:
        await asyncio.sleep(0.005)
    aborted = await http.abort([1, 99])
    assert (aborted.aborted_jobs, aborted.freed_contexts) == (1, 1)
    with pytest.raises(AbortedError):
        await job
    assert fake_engine.engine.stats_now()["num_contexts"] == 0


async def test_failures_and_hangs_on_demand(http, fake_engine):
    fake_engine.engine.fail_next("generate", EngineUnavailableError("overloaded"))
    with pytest.raises(EngineUnavailableError, match="overloaded"):
        await http.generate(1, GREEDY, text="x")
    assert (await http.generate(1, GREEDY, text="x")).text  # once only
    fake_engine.engine.hang = True
    with pytest.raises(EngineUnavailableError, match="unreachable"):
        await http.ping(0.2)
    fake_engine.engine.hang = False
    assert (await http.ping())["model"] == "fake-model"


async def test_the_tokenizer_it_serves_gives_the_tokens_it_takes(http):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(await http.tokenizer_json())
    text = "Hé, {{x}} → 灯台"
    assert (
        tokenizer.encode(text, add_special_tokens=False).ids
        == await http.tokenize(text)
        == list(text.encode())
    )
    turns = [ChatTurn(role="system", content="Be brief."), ChatTurn(role="user", content="Hi")]
    pieces = (await http.render_chat(RenderChatRequest(messages=turns))).pieces
    assert len(pieces) == 2 and pieces[-1].endswith("<|assistant|>")


@pytest.mark.parametrize("engine_url", ["fake", "real"], indirect=True)
async def test_context_rules_are_the_real_engines(engine_url, ids):
    client = HttpEngine(engine_url)
    a, b, c, d = (next(ids) for _ in range(4))
    try:
        with pytest.raises(UnknownContextError):
            await client.fill(a, text="x", parent_context_id=b)
        filled = await client.fill(a, text="Lamp oil")
        assert filled.context_len == filled.filled_tokens > 0
        with pytest.raises(BadRequestError):  # more than the parent holds
            await client.fill(b, text="y", parent_context_id=a, parent_len=filled.context_len + 5)
        await client.fill(b, text="y", parent_context_id=a, parent_len=2)
        with pytest.raises(ContextConflictError):  # b exists with another parent length
            await client.fill(b, text="y", parent_context_id=a, parent_len=1)
        with pytest.raises(InvalidTokenError):
            await client.fill(c, token_ids=[10**9])
        # A fork that names its parent's length waits for a parent on its way.
        late = asyncio.create_task(
            client.generate(
                d,
                SamplingParams(max_tokens=2, ignore_eos=True),
                parent_context_id=c,
                parent_len=3,
                parent_timeout_ms=5000,
            )
        )
        await asyncio.sleep(0.05)
        await client.fill(c, text="Tide table", checkpoints=[(next(ids), 2)])
        assert len((await late).token_ids) == 2
        assert await client.free_context(b) > 0 and await client.free_context(b) == 0
        freed = (await client.abort([a, c, d, next(ids)])).freed_contexts
        assert freed == 3
    finally:
        await client.aclose()
