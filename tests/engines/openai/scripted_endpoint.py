"""A scripted OpenAI-compatible endpoint for the OpenAI engine's tests: a tiny ASGI app
served by uvicorn (``ServerThread``) that answers each request from a script, so 429 / 500 /
timeouts / broken streams are real HTTP; and helpers to check the engine against it."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

from conftest import ServerThread
from litestar.response.sse import ServerSentEventMessage

from parrot.engines.openai.config import OpenAIEngineConfig
from parrot.engines.openai.engine import OpenAIEngine
from parrot.wire.sampling import SamplingParams

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
        self.owned_by = "t"  # "llamacpp", "vllm", "sglang": the server kind the engine finds
        self.pages: dict[str, dict] = {}  # GET pages by path (llama.cpp's /props, ...); else 404

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
        if scope["method"] == "GET" and not path.endswith("/models"):
            found = path in self.pages
            await _send_json(send, 200 if found else 404, self.pages[path] if found else error(f"no {path}"))
            return
        if path.endswith("/models"):
            status = self.models_status
            body = {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": self.owned_by}],
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
