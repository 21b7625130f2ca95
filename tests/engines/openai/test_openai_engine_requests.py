"""What the OpenAI engine sends a scripted local endpoint (real HTTP): chat messages and
sampling mapped, the API key in no message or log line, requests in flight bounded by the
capacity, a ping that needs no models route."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from conftest import ServerThread
from scripted_endpoint import (
    KEY,
    MODEL,
    SAMPLING,
    Reply,
    ScriptedEndpoint,
    chain,
    config_for,
    engine_with_context,
    error,
    no_key_anywhere,
)

from parrot.engines.openai.engine import OpenAIEngine
from parrot.engines.protocol.errors import EngineUnavailableError
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_chat_requests_carry_mapped_messages_and_sampling():
    endpoint = ScriptedEndpoint(Reply())
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server, api="chat", api_key=None))
        await engine.fill(1, text="<|im_start|>system\nBe brief.<|im_end|>\n")
        await engine.fill(
            2, text="<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", parent_context_id=1
        )
        sampling = SamplingParams(
            max_tokens=9, temperature=0.5, top_p=0.9, stop=["\n"], seed=3, presence_penalty=0.5, top_k=5
        )
        result = await engine.generate(3, sampling, parent_context_id=2)
        await engine.aclose()
    assert result.text == "ok" and result.cached_tokens == 3
    _, path, body, headers = endpoint.requests[0]
    assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer none"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = {"max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "seed": 3, "top_k": 5}
    assert {k: body[k] for k in expected} == expected and body["presence_penalty"] == 0.5
    assert not {"n", "frequency_penalty", "repetition_penalty", "ignore_eos", "stream"} & body.keys()


async def test_the_api_key_never_shows(caplog):
    caplog.set_level(logging.DEBUG)
    endpoint = ScriptedEndpoint(Reply(500, error(f"internal error near {KEY}")), Reply(401))
    with ServerThread(endpoint) as server:
        config = config_for(server, max_retries=1)
        engine = await engine_with_context(config)
        texts = [
            repr(config),
            str(config),
            repr(engine),
            str(engine),
            repr(config.describe()),
            repr(engine.stats()),
        ]
        with pytest.raises(EngineUnavailableError) as first:
            await engine.generate(2, SAMPLING, parent_context_id=1)  # 500 (echoing the key), then 401
        assert "rejected the credentials (401)" in str(first.value)
        endpoint.replies = [Reply(500, error(f"internal error near {KEY}"))]
        with pytest.raises(EngineUnavailableError) as second:
            await engine.generate(2, SAMPLING, parent_context_id=1)
        endpoint.models_status = 401
        await asyncio.sleep(0)
        engine._down_until = 0.0  # skip the cool-down: probe /models, which now rejects the key
        with pytest.raises(EngineUnavailableError) as third:
            await engine.ping()
        await engine.aclose()
    assert endpoint.requests[0][3]["authorization"] == f"Bearer {KEY}"  # it was sent, and only there
    assert "***" in str(second.value)
    records = [r.getMessage() for r in caplog.records] + [repr(r.args) for r in caplog.records]
    assert any("retry 1 of 1" in m for m in records)
    no_key_anywhere(*texts, *chain(first.value), *chain(second.value), *chain(third.value), *records)


async def test_capacity_bounds_the_requests_in_flight():
    endpoint = ScriptedEndpoint(Reply(delay_s=0.4))
    with ServerThread(endpoint) as server:
        engine = await engine_with_context(config_for(server, capacity=1))
        started = time.monotonic()
        calls = [
            asyncio.create_task(engine.generate(10 + i, SAMPLING, parent_context_id=1)) for i in range(2)
        ]
        await asyncio.sleep(0.2)
        load = engine.stats()
        results = await asyncio.gather(*calls)
        elapsed = time.monotonic() - started
        await engine.aclose()
    assert (load["num_running"], load["num_waiting"]) == (1, 1)
    assert [r.text for r in results] == ["ok", "ok"] and elapsed >= 0.8  # one after the other
    assert endpoint.gaps()[0] >= 0.35


async def test_ping_accepts_an_endpoint_without_a_models_route():
    endpoint = ScriptedEndpoint()
    endpoint.models_status = 404
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server))
        info = await engine.ping()
        endpoint.models_status = 503
        with pytest.raises(EngineUnavailableError, match="answered 503"):
            await engine.ping()
        assert not engine.healthy
        await engine.aclose()
    assert info["model"] == MODEL and info["model_listed"] is None and info["healthy"] is True
