"""Retries, failures and secrets of the OpenAI engine against real local HTTP servers.

The endpoint is a tiny ASGI app served by uvicorn (``ServerThread``) that answers each
request from a script, so 429 / 500 / timeouts / broken streams are real HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass, field

import pytest
from conftest import ServerThread, free_port
from litestar.response.sse import ServerSentEventMessage

from parrot.engines.openai.config import OpenAIEngineConfig
from parrot.engines.openai.engine import OpenAIEngine
from parrot.engines.protocol.errors import BadRequestError, EngineUnavailableError, PromptTooLongError
from parrot.engines.protocol.schemas import StreamEnd
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")

KEY = "sk-test-SECRET-4f9a0c2e7b"
MODEL = "scripted-model"
SAMPLING = SamplingParams(max_tokens=4)


@dataclass
class Reply:
    status: int = 200
    body: dict | None = None  # None with 200: a success of the route's shape
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0
    break_stream: bool = False  # send one chunk of a stream, then drop the connection


def ok_body(path: str, text: str = "ok") -> dict:
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 1,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    if path.endswith("/chat/completions"):
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [choice],
            "usage": usage,
        }
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return {
        "id": "c1",
        "object": "text_completion",
        "created": 0,
        "model": MODEL,
        "choices": [choice],
        "usage": usage,
    }


def sse(data: str) -> bytes:
    return ServerSentEventMessage(data=data, sep="\n").encode()


def stream_chunks(path: str, words: list[str]) -> list[bytes]:
    chat = path.endswith("/chat/completions")
    chunks = []
    for i, word in enumerate(words):
        finish = "stop" if i == len(words) - 1 else None
        if chat:
            choice = {"index": 0, "delta": {"content": word}, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": word, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        data = {"id": "s1", "object": obj, "created": 0, "model": MODEL, "choices": [choice]}
        chunks.append(sse(json.dumps(data)))
    usage = {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}
    final = {"id": "s1", "object": "x", "created": 0, "model": MODEL, "choices": [], "usage": usage}
    chunks.append(sse(json.dumps(final)))
    chunks.append(sse("[DONE]"))
    return chunks


class ScriptedEndpoint:
    """An OpenAI-compatible endpoint: each generation request takes the next reply of the
    script (the last one repeats); ``GET /v1/models`` answers ``models_status``. A 401 echoes
    the bearer token it got, as careless servers do."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies) or [Reply()]
        self.requests: list[tuple[float, str, dict, dict]] = []  # (time, path, json body, headers)
        self.models_status = 200

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        if path.endswith("/models"):
            status = self.models_status
            body = {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "t"}],
            }
            await _send_json(send, status, body if status == 200 else {"error": {"message": "no"}})
            return
        request = json.loads(raw or b"{}")
        self.requests.append((time.monotonic(), path, request, headers))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        await asyncio.sleep(reply.delay_s)
        if reply.status == 200 and request.get("stream"):
            await self._stream(send, path, reply)
            return
        body = reply.body if reply.body is not None else ok_body(path)
        if reply.status == 401:
            token = headers.get("authorization", "")
            body = {"error": {"message": f"Incorrect API key provided: {token}", "code": "invalid_api_key"}}
        await _send_json(send, reply.status, body, reply.headers)

    async def _stream(self, send, path: str, reply: Reply) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        chunks = stream_chunks(path, ["Hel", "lo", "!"])
        if reply.break_stream:
            await send({"type": "http.response.body", "body": chunks[0], "more_body": True})
            raise RuntimeError("connection dropped mid-stream (on purpose)")
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def gaps(self) -> list[float]:
        times = [t for t, *_ in self.requests]
        return [b - a for a, b in itertools.pairwise(times)]


async def _send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    raw = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    head += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw})


def error(message: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def config_for(server: ServerThread, **overrides) -> OpenAIEngineConfig:
    fields = {
        "base_url": f"{server.url}/v1",
        "model": MODEL,
        "api_key": KEY,
        "api": "completions",
        "max_retries": 3,
        "timeout_s": 5.0,
    }
    return OpenAIEngineConfig(**{**fields, **overrides})


async def engine_with_context(config: OpenAIEngineConfig) -> OpenAIEngine:
    engine = OpenAIEngine(config)
    await engine.fill(1, text="Say hi.")
    return engine


def no_key_anywhere(*texts: str) -> None:
    for text in texts:
        assert KEY not in text


def chain(error: BaseException) -> list[str]:
    out: list[str] = []
    seen: BaseException | None = error
    while seen is not None:
        out += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return out


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
