"""The ServeCore's HTTP engine client against the real engine server."""

from __future__ import annotations

import pytest
from conftest import free_port

from parrot.engines.protocol.errors import EngineUnavailableError, InvalidTokenError, UnknownContextError
from parrot.engines.protocol.schemas import StreamEnd
from parrot.platform.serve.engines.client import HttpEngine
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_fill_generate_stream_free_and_ping(engine_server, ids):
    client = HttpEngine(engine_server.url)
    try:
        cid, child, other = next(ids), next(ids), next(ids)
        filled = await client.fill(cid, text="<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
        assert filled.context_len == filled.filled_tokens > 3
        greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        result = await client.generate(other, greedy, parent_context_id=cid)
        assert len(result.token_ids) == 5
        events = [e async for e in client.generate_stream(child, greedy, parent_context_id=cid)]
        assert isinstance(events[-1], StreamEnd) and len(events) == 6
        assert events[-1].token_ids == result.token_ids  # two forks of one context, greedy
        assert (await client.ping())["num_contexts"] >= 3
        for c in (child, other, cid):
            assert await client.free_context(c) > 0
    finally:
        await client.aclose()


async def test_engine_errors_keep_their_class(engine_server, ids):
    client = HttpEngine(engine_server.url)
    try:
        with pytest.raises(UnknownContextError, match="does not exist"):
            await client.generate(next(ids), SamplingParams())
        with pytest.raises(InvalidTokenError, match="outside the vocabulary"):
            await client.fill(next(ids), token_ids=[10**9])
    finally:
        await client.aclose()


async def test_unreachable_engine():
    client = HttpEngine(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(EngineUnavailableError, match="unreachable"):
            await client.ping()
    finally:
        await client.aclose()


async def test_an_answer_longer_than_a_read_buffer_streams_whole(fake_engine):
    """The last event of a long answer carries all of it (here ~100 KiB on one line): the
    client splits the stream into lines itself, with no limit on a line's length."""
    fake_engine.engine.max_model_len = 30_000
    client = HttpEngine(fake_engine.url)
    try:
        sampling = SamplingParams(max_tokens=20_000, temperature=0.0, ignore_eos=True)
        events = [e async for e in client.generate_stream(1, sampling, text="a long answer")]
        end = events[-1]
        assert isinstance(end, StreamEnd) and len(end.token_ids) == 20_000
        assert "".join(e.text for e in events[:-1]) == end.text and len(end.text) > 16_000
    finally:
        await client.aclose()


@pytest.fixture
def http_server_answering_json():
    """A server that answers a generation with JSON (a proxy's page, another server)."""
    from litestar import Litestar, post
    from servers import ServerThread

    @post("/generate_stream", status_code=200)
    async def not_a_stream() -> dict:
        return {"hello": "world"}

    with ServerThread(Litestar([not_a_stream])) as server:
        yield server.url


async def test_an_engine_that_answers_no_event_stream_is_reported(http_server_answering_json):
    client = HttpEngine(http_server_answering_json)
    try:
        with pytest.raises(EngineUnavailableError, match=r"sent no event stream \(application/json\)"):
            async for _ in client.generate_stream(1, SamplingParams(max_tokens=2), text="x"):
                pass
    finally:
        await client.aclose()
