"""The two kinds of client, each waiting a simulated round trip before every request.

A request is one HTTP call to a server; before each, the client sleeps ``rtt_s``: the time
a request and its answer would spend on a network between a client and a server that are
far apart (both sides of a benchmark pay it alike).

- :class:`ParrotClient`: the SDK's ``AsyncClient`` (semantic functions, variables, and
  streamed chats through Parrot's OpenAI front).
- :class:`RequestClient`: a request-level client of OpenAI-compatible servers (the
  engine's own ``/v1``, or Parrot's OpenAI front): one request per LLM call, greedy with a
  fixed number of output tokens; over several servers round-robin (a plain load balancer)
  or to the one with the fewest of its requests in flight (``least-busy``: a
  least-connections balancer).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from httpx_sse import aconnect_sse

from parrot.sdk import AsyncClient, AsyncVar, Output
from parrot.sdk.http import AsyncTransport, Op, StreamOp

T = TypeVar("T")
ROUND_ROBIN, LEAST_BUSY = "round-robin", "least-busy"  # how a request-level client picks a server
TIMEOUT_S = 1800.0
WAIT_S = 3600.0  # what a get asks the server to wait at most (the API's limit): a slow run is no error


def fixed_output(tokens: int) -> Output:
    """Exactly ``tokens`` tokens, greedy: the same work on every side."""
    return Output(max_tokens=tokens, temperature=0, ignore_eos=True)


def sampling(tokens: int) -> dict[str, Any]:
    """:func:`fixed_output` in an OpenAI request body."""
    return {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}


class DelayedTransport(AsyncTransport):
    """The SDK's transport, sleeping ``rtt_s`` before every request."""

    def __init__(self, base_url: str, timeout: float, rtt_s: float) -> None:
        super().__init__(base_url, timeout)
        self.rtt_s = rtt_s

    async def send(self, op: Op[T]) -> T:
        if self.rtt_s:
            await asyncio.sleep(self.rtt_s)
        return await super().send(op)

    async def stream(self, op: StreamOp[T]) -> AsyncIterator[T]:
        if self.rtt_s:
            await asyncio.sleep(self.rtt_s)
        async for item in super().stream(op):
            yield item


class ParrotClient(AsyncClient):
    """The SDK's ``AsyncClient`` with a simulated round trip before every request (a
    variable's stream pays it once, before its first event)."""

    def __init__(self, base_url: str, rtt_s: float) -> None:
        self.transport_class = functools.partial(DelayedTransport, rtt_s=rtt_s)
        super().__init__(base_url, timeout=TIMEOUT_S)

    async def stream_var(
        self, var: AsyncVar, tokens: int, start: float, criteria: str = "latency"
    ) -> Streamed:
        """``var``'s value as it is generated (the SDK's ``astream``: the server's
        ``GET /v1/semantic_var/{id}/stream``), timed from ``start`` (``perf_counter``)."""
        return await timed_stream(var.astream(criteria, timeout=WAIT_S), tokens, start)


@dataclass(frozen=True)
class Streamed:
    """One streamed answer: time to its first token and per output token after that."""

    text: str
    ttft_s: float
    tpot_s: float
    total_s: float  # from the request to the last token: what the reader waits for the answer


async def timed_stream(texts: AsyncIterator[str], tokens: int, start: float | None = None) -> Streamed:
    """Read a stream of text pieces of ``tokens`` tokens, timed from ``start``
    (``perf_counter``; by default this call, before the request's round trip, which the
    stream pays on its first read)."""
    start = time.perf_counter() if start is None else start
    first = last = None
    parts = []
    async for text in texts:
        if text:
            last = time.perf_counter()
            first = first or last
            parts.append(text)
    if first is None or last is None:
        raise RuntimeError("the stream had no text")
    return Streamed("".join(parts), first - start, (last - first) / max(1, tokens - 1), last - start)


class RequestClient:
    """A request-level client of OpenAI-compatible servers (see the module docstring)."""

    def __init__(self, urls: Sequence[str], rtt_s: float, pick: str = ROUND_ROBIN) -> None:
        self.rtt_s = rtt_s
        self._urls = itertools.cycle([f"{u}/v1" for u in urls])
        self._in_flight = dict.fromkeys((f"{u}/v1" for u in urls), 0)  # (least-busy)
        self._pick = pick
        self._http = httpx.AsyncClient(
            timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)
        )

    @contextlib.contextmanager
    def _server(self) -> Iterator[str]:
        """The server a request goes to, counted in flight while it runs."""
        url = next(self._urls) if self._pick == ROUND_ROBIN else min(self._in_flight, key=self._in_flight.get)
        self._in_flight[url] += 1
        try:
            yield url
        finally:
            self._in_flight[url] -= 1

    async def _post(self, route: str, body: dict) -> dict:
        if self.rtt_s:
            await asyncio.sleep(self.rtt_s)
        with self._server() as url:
            response = await self._http.post(url + route, json=body)
        response.raise_for_status()
        return response.json()

    async def complete(self, prompt: str, tokens: int) -> str:
        """``/v1/completions`` of ``prompt`` (text): its answer."""
        answer = await self._post("/completions", {"prompt": prompt, **sampling(tokens)})
        return answer["choices"][0]["text"]

    async def complete_stream(self, prompt: str, tokens: int, start: float | None = None) -> Streamed:
        """``/v1/completions`` of ``prompt`` streamed (``stream: true``), timed from ``start``."""
        return await timed_stream(self._pieces("/completions", {"prompt": prompt}, tokens), tokens, start)

    async def chat(self, messages: list[dict[str, str]], tokens: int) -> str:
        """``/v1/chat/completions``: the assistant's answer."""
        answer = await self._post("/chat/completions", {"messages": messages, **sampling(tokens)})
        return answer["choices"][0]["message"]["content"]

    async def chat_stream(self, messages: list[dict[str, str]], tokens: int) -> Streamed:
        """``/v1/chat/completions`` streamed."""
        return await timed_stream(self._pieces("/chat/completions", {"messages": messages}, tokens), tokens)

    async def _pieces(self, route: str, body: dict, tokens: int) -> AsyncIterator[str]:
        """The text of a streamed OpenAI answer (chat deltas or completion texts), piece by piece."""
        if self.rtt_s:
            await asyncio.sleep(self.rtt_s)
        body = {**body, "stream": True, **sampling(tokens)}
        with self._server() as url:
            async with aconnect_sse(self._http, "POST", url + route, json=body) as source:
                source.response.raise_for_status()
                async for event in source.aiter_sse():
                    if event.data == "[DONE]":
                        break
                    for choice in event.json().get("choices", []):
                        yield choice.get("delta", {}).get("content") or choice.get("text") or ""

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RequestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
