"""Retries and failures of the OpenAI engine against a scripted local endpoint (real HTTP):
429 and Retry-After, 500s until the retries run out, x-should-retry, timeouts, 400s,
context-length errors, an unreachable endpoint, streams that break before or after text."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import ServerThread, free_port
from scripted_endpoint import (
    KEY,
    MODEL,
    SAMPLING,
    Reply,
    ScriptedEndpoint,
    config_for,
    engine_with_context,
    error,
)

from parrot.engines.openai.config import OpenAIEngineConfig
from parrot.engines.protocol.errors import BadRequestError, EngineUnavailableError, PromptTooLongError
from parrot.engines.protocol.schemas import StreamEnd

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_429_with_retry_after_then_500_then_success():
    endpoint = ScriptedEndpoint(
        Reply(429, error("slow down"), {"Retry-After": "2"}), Reply(500, error("oops")), Reply()
    )
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server))
        started = time.monotonic()
        result = await engine.generate(2, SAMPLING, parent_context_id=1)
        elapsed = time.monotonic() - started
        info = await engine.ping()
        await engine.aclose()
    assert (result.text, result.finish_reason, result.prompt_tokens, result.cached_tokens) == (
        "ok",
        "length",
        7,
        3,
    )
    assert len(endpoint.requests) == 3
    first_gap, second_gap = endpoint.gaps()
    assert first_gap >= 1.9  # the Retry-After of the 429 was honoured (by the openai client)
    assert second_gap < 1.5  # the 500 had none: the client's exponential backoff (0.75-1 s)
    assert elapsed >= 1.9
    assert info["retries"] == 2 and info["requests_done"] == 1 and info["healthy"] is True
    # the request went out with the key, the model and the mapped sampling, once each time
    _, path, body, headers = endpoint.requests[-1]
    assert path == "/v1/completions" and headers["authorization"] == f"Bearer {KEY}"
    assert body["model"] == MODEL and body["prompt"] == "Say hi." and body["max_tokens"] == 4


async def test_retry_after_ms_and_http_date_are_honoured():
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 2))
    endpoint = ScriptedEndpoint(
        Reply(503, error("busy"), {"retry-after-ms": "400"}),
        Reply(429, error("busy"), {"Retry-After": date}),
        Reply(),
    )
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server))
        assert (await engine.generate(2, SAMPLING, parent_context_id=1)).text == "ok"
        await engine.aclose()
    first_gap, second_gap = endpoint.gaps()
    assert 0.35 <= first_gap < 1.0
    assert second_gap >= 0.5  # a date 1-2 s ahead (whole seconds)


async def test_always_500_exhausts_the_retries_and_marks_the_engine_unhealthy():
    endpoint = ScriptedEndpoint(Reply(500, error("the model crashed")))
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server, max_retries=2, cooldown_s=0.5))
        with pytest.raises(EngineUnavailableError, match="answered 500: the model crashed"):
            await engine.generate(2, SAMPLING, parent_context_id=1)
        assert len(endpoint.requests) == 3
        assert not engine.healthy
        assert engine._contexts.get(2) is None  # the failed generation's fresh context is gone
        with pytest.raises(EngineUnavailableError, match="unhealthy"):
            await engine.ping()  # /models still answers, but the engine is cooling down
        await asyncio.sleep(0.6)
        info = await engine.ping()  # after the cool-down the probe succeeds: healthy again
        assert info["healthy"] is True and info["requests_failed"] == 1 and info["retries"] == 2
        await engine.aclose()


async def test_x_should_retry_false_is_obeyed():
    endpoint = ScriptedEndpoint(Reply(500, error("do not retry this"), {"x-should-retry": "false"}))
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server))
        with pytest.raises(EngineUnavailableError, match="do not retry this"):
            await engine.generate(2, SAMPLING, parent_context_id=1)
        await engine.aclose()
    assert len(endpoint.requests) == 1


async def test_a_slow_endpoint_times_out_retries_then_fails():
    endpoint = ScriptedEndpoint(Reply(delay_s=1.5))
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server, timeout_s=0.3, max_retries=1))
        started = time.monotonic()
        with pytest.raises(EngineUnavailableError, match=r"did not answer within 0\.3 s"):
            await engine.generate(2, SAMPLING, parent_context_id=1)
        assert time.monotonic() - started < 1.5
        assert not engine.healthy and engine.stats()["retries"] == 1
        await engine.aclose()
    assert len(endpoint.requests) == 2


async def test_a_400_is_a_bad_request_with_the_servers_message_and_no_retry():
    endpoint = ScriptedEndpoint(Reply(400, error("'temperature' is out of range")))
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server))
        with pytest.raises(BadRequestError, match="answered 400: 'temperature' is out of range") as raised:
            await engine.generate(2, SAMPLING, parent_context_id=1)
        assert not isinstance(raised.value, EngineUnavailableError)
        assert engine.healthy and (await engine.ping())["healthy"] is True
        await engine.aclose()
    assert len(endpoint.requests) == 1


async def test_a_context_length_error_is_prompt_too_long():
    endpoint = ScriptedEndpoint(
        Reply(400, error("This model's maximum context length is 8", "context_length_exceeded"))
    )
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server))
        with pytest.raises(PromptTooLongError, match="maximum context length"):
            await engine.generate(2, SAMPLING, parent_context_id=1)
        await engine.aclose()


async def test_an_unreachable_endpoint_is_unavailable_and_ping_says_so():
    config = OpenAIEngineConfig(
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        model=MODEL,
        max_retries=1,
        cooldown_s=0,
    )
    engine = await engine_with_context(config)
    with pytest.raises(EngineUnavailableError, match="unreachable"):
        await engine.generate(2, SAMPLING, parent_context_id=1)
    assert not engine.healthy
    with pytest.raises(EngineUnavailableError, match="unreachable"):
        await engine.ping()
    await engine.aclose()


async def test_streaming_retries_before_the_first_text_and_not_after():
    endpoint = ScriptedEndpoint(Reply(503, error("warming up")), Reply())
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server, api="chat"))
        events = [e async for e in engine.generate_stream(2, SAMPLING, parent_context_id=1)]
        assert "".join(e.text for e in events[:-1]) == "Hello!"
        assert isinstance(events[-1], StreamEnd) and events[-1].text == "Hello!"
        assert events[-1].finish_reason == "stop" and events[-1].prompt_tokens == 5
        assert len(endpoint.requests) == 2 and endpoint.requests[-1][2]["stream"] is True

        endpoint.replies = [Reply(break_stream=True)]
        seen = []
        with pytest.raises(EngineUnavailableError, match="mid-stream"):
            async for event in engine.generate_stream(3, SAMPLING, parent_context_id=1):
                seen.append(event.text)
        assert seen == ["Hel"] and len(endpoint.requests) == 3  # no retry once text went out
        assert engine._contexts.get(3) is None
        await engine.aclose()
