"""Streaming semantic variables (issue 22): does following a generation slow it down?

    python benchmarks/var_streaming.py [--rounds 3] [--calls 4] [--tokens 96]

1. Transport: every semantic generation now streams from the engine to the ServeCore (one
   event per token, ``/generate_stream``) where it used to be one answer at the end
   (``/generate``). The same ``--calls`` generations through the ServeCore's engine client
   (:class:`HttpEngine`), streamed against not: aggregate tokens/s.
2. Followers: each run submits ``--calls`` semantic calls at once (greedy, ``ignore_eos``,
   ``--tokens`` tokens each) and measures the aggregate generation rate: tokens generated /
   seconds from the submit until every value is there. One side reads the values with a
   plain get (0 followers); the other has 16 followers in all (16 / calls per variable)
   reading ``GET /v1/semantic_var/{id}/stream`` from the start, each checking that its
   deltas join to the value.

A ``parrot engine`` and a ``parrot serve`` run as their own processes. The sides alternate
each round; cells are the median (min-max) over the rounds. A benchmark, not a test: it
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._report import machine, write_section
from benchmarks._servers import free_port, launched, parrot_command
from parrot.engines.protocol.schemas import StreamEnd
from parrot.platform.serve.engines.client import HttpEngine
from parrot.wire.sampling import SamplingParams

FOLLOWERS = 16
READING = (
    "Where a follower's cost goes: the engine, the ServeCore (one SSE write per follower per "
    "wake) and this script's followers (one SSE parse each) share the machine's cores, so on a "
    "2-core box the followers' own reading counts against the generation; followers on other "
    "machines cost the server only its writes. A slow follower gets several deltas in one "
    "event (it holds a position, nothing is queued for it)."
)
PROMPT = "<|im_start|>user\nTell me a long story about {topic}.<|im_end|>\n<|im_start|>assistant\n{{{{a}}}}"
TOPICS = ["a lighthouse", "a dragon", "the sea", "a forest", "a city", "a river", "a robot", "a cat"]


async def transport(engine_url: str, calls: int, tokens: int, streamed: bool, ids: Iterator[int]) -> float:
    """Tokens per second of ``calls`` generations sent straight to the engine."""
    engine = HttpEngine(engine_url)
    sampling = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    contexts = [next(ids) for _ in range(calls)]

    async def one(cid: int, topic: str) -> int:
        prompt = PROMPT.format(topic=topic).replace("{{a}}", "")
        if not streamed:
            return len((await engine.generate(cid, sampling, text=prompt)).token_ids)
        count = 0
        async for event in engine.generate_stream(cid, sampling, text=prompt):
            count += not isinstance(event, StreamEnd)
        return count

    try:
        started = time.monotonic()
        done = await asyncio.gather(*(one(c, TOPICS[i % len(TOPICS)]) for i, c in enumerate(contexts)))
        took = time.monotonic() - started
        await engine.abort(contexts)
    finally:
        await engine.aclose()
    return sum(done) / took


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str]]:
    engine_port, api_port = free_port(), free_port()
    engine_url, url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{api_port}"

    def up(probe: str):
        return lambda: httpx.get(probe, timeout=2).status_code == 200

    with tempfile.TemporaryDirectory() as data:
        engine = parrot_command("engine", "--port", str(engine_port))
        serve = parrot_command("serve", "--port", str(api_port), "--engine", engine_url, "--data-dir", data)
        with (
            launched(engine, up(f"{engine_url}/ping"), "parrot engine", timeout_s=600),
            launched(serve, up(f"{url}/healthz"), "parrot serve", timeout_s=600, stop=signal.SIGINT),
        ):
            yield engine_url, url


async def follow(api: httpx.AsyncClient, sid: str, auth: dict, var: str) -> str:
    deltas, value = [], None
    url = f"/v1/semantic_var/{var}/stream"
    async with aconnect_sse(api, "GET", url, params={"session_id": sid}, headers=auth) as source:
        async for sse in source.aiter_sse():
            data = json.loads(sse.data)
            if sse.event == "delta":
                deltas.append(data["delta"])
            elif sse.event == "value":
                value = data["value"]
            else:
                raise RuntimeError(f"stream failed: {data}")
    if "".join(deltas) != value:
        raise RuntimeError("the deltas do not join to the value")
    return value


async def run(url: str, calls: int, tokens: int, followers: int) -> float:
    """Tokens per second of ``calls`` generations watched by ``followers`` in all."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as api:
        s = (await api.post("/v1/session")).json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        sampling = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        started = time.monotonic()
        outputs = []
        for i in range(calls):
            body = {
                "session_id": sid,
                "template": PROMPT.format(topic=TOPICS[i % len(TOPICS)]),
                "parameters": [{"name": "a", "is_output": True, "sampling": sampling}],
            }
            outputs.append(
                (await api.post("/v1/semantic_call", json=body, headers=auth)).json()["outputs"]["a"]
            )
        work = [follow(api, sid, auth, outputs[n % calls]) for n in range(followers)]
        gets = [api.get(f"/v1/semantic_var/{v}", params={"session_id": sid}, headers=auth) for v in outputs]
        await asyncio.gather(*work, *gets)
        took = time.monotonic() - started
        await api.delete(f"/v1/session/{sid}", headers=auth)
    return calls * tokens / took


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    sides: dict[int, list[float]] = {0: [], FOLLOWERS: []}
    moved: dict[bool, list[float]] = {False: [], True: []}
    ids = itertools.count(2**40)  # context ids of their own on the engine
    with servers() as (engine_url, url):
        asyncio.run(run(url, args.calls, 8, 0))  # warm-up
        for r in range(args.rounds):
            for streamed in [False, True] if r % 2 == 0 else [True, False]:
                rate = asyncio.run(transport(engine_url, args.calls, args.tokens, streamed, ids))
                moved[streamed].append(rate)
                print(
                    f"round {r + 1}: {'streamed' if streamed else 'one answer'}: {rate:.1f} tokens/s",
                    file=sys.stderr,
                )
            for followers in [0, FOLLOWERS] if r % 2 == 0 else [FOLLOWERS, 0]:
                rate = asyncio.run(run(url, args.calls, args.tokens, followers))
                sides[followers].append(rate)
                print(f"round {r + 1}: {followers:2d} followers: {rate:.1f} tokens/s", file=sys.stderr)
    ratio = statistics.median(sides[FOLLOWERS]) / statistics.median(sides[0])
    cost = statistics.median(moved[True]) / statistics.median(moved[False])
    table = (
        f"Machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the end. {args.calls} "
        f"generations at once, {args.tokens} tokens each (greedy, ignore_eos), {args.rounds} "
        "rounds, sides alternating; median (min-max).\n\n"
        "| engine to ServeCore | tokens/s |\n| --- | ---: |\n"
        f"| one answer (`/generate`) | {cell(moved[False])} |\n"
        f"| streamed (`/generate_stream`) | {cell(moved[True])} |\n\n"
        f"Streamed / one answer: **{cost:.2f}x**.\n\n"
        "| followers of each run's variables | tokens/s |\n| ---: | ---: |\n"
        f"| 0 | {cell(sides[0])} |\n| {FOLLOWERS} | {cell(sides[FOLLOWERS])} |\n\n"
        f"With {FOLLOWERS} followers / without: **{ratio:.2f}x**.\n\n{READING}"
    )
    print(table)
    if not args.no_docs:
        write_section(
            "var-streaming", "## Following streamed variables (`benchmarks/var_streaming.py`)\n\n" + table
        )


if __name__ == "__main__":
    main()
