"""Applications on the ServeCore against request-level serving, and the scheduler's
latency criteria on and off, in one run on one builtin engine.

1. Chains: 8 applications of 3 dependent calls each. Parrot: each application submits its
   three calls at once and reads the last output (the server runs each step as soon as the
   previous one has generated). Baseline: the same prompts through the engine's
   OpenAI-compatible ``/v1/completions``, each step sent by the client after the previous
   answer came back (what an application on a request-level server does).
2. Map-reduce: 8 maps and a reduce, the same two ways.
3. Latency under load: a 3-step latency-critical chain submitted behind 24 throughput
   calls, engine capacity 4 tasks, with the criteria policy on and off.

Greedy decoding with ``ignore_eos`` so both sides generate the same number of tokens.
Prints a table and writes it into docs/benchmarks.md.

    python benchmarks/serve_apps.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section

from parrot.engines.builtin.config import EngineConfig
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.server.app import create_app as engine_app
from parrot.platform.api.app import create_app as serve_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.executor import SchedulingPolicy

STEPS = ("Topic: {}\nOne fact about it:", "Fact: {}\nShorter:", "Short fact: {}\nTitle:")
SAMPLING = {"temperature": 0, "ignore_eos": True}


def serve(app) -> tuple[uvicorn.Server, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


class Parrot:
    """An application's side of the Parrot API."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client

    async def session(self) -> tuple[str, dict]:
        s = (await self.c.post("/v1/session")).json()
        return s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}

    async def call(self, sid, auth, template, inputs: dict, out: str, max_tokens: int, criteria=None) -> str:
        params = [{"name": k, **v} for k, v in inputs.items()]
        params.append({"name": out, "is_output": True, "sampling": {**SAMPLING, "max_tokens": max_tokens}})
        body = {"session_id": sid, "template": template, "parameters": params, "output_criteria": criteria}
        r = await self.c.post("/v1/semantic_call", json=body, headers=auth)
        r.raise_for_status()
        return r.json()["outputs"][out]

    async def get(self, sid, auth, var_id, criteria="latency") -> str:
        r = await self.c.get(
            f"/v1/semantic_var/{var_id}", params={"session_id": sid, "criteria": criteria}, headers=auth
        )
        r.raise_for_status()
        return r.json()["value"]

    async def chain(self, topic: str, max_tokens: int, criteria: str | None = None) -> str:
        sid, auth = await self.session()
        var = {"value": topic}
        for n, step in enumerate(STEPS):
            out = await self.call(
                sid, auth, step.format(f"{{{{x{n}}}}}") + " {{y}}", {f"x{n}": var}, "y", max_tokens, criteria
            )
            var = {"var_id": out}
        return await self.get(sid, auth, out)

    async def map_reduce(self, parts: list[str], max_tokens: int) -> str:
        sid, auth = await self.session()
        outs = [
            await self.call(
                sid, auth, "Summarize: {{p}}\nSummary: {{s}}", {"p": {"value": p}}, "s", max_tokens
            )
            for p in parts
        ]
        template = "Combine: " + " ".join(f"{{{{s{i}}}}}" for i in range(len(parts))) + "\nAll: {{total}}"
        inputs = {f"s{i}": {"var_id": v} for i, v in enumerate(outs)}
        return await self.get(sid, auth, await self.call(sid, auth, template, inputs, "total", max_tokens))


class RequestLevel:
    """The same applications on a request-level server: the client sends each step."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client

    async def complete(self, prompt: str, max_tokens: int) -> str:
        body = {"prompt": prompt, "max_tokens": max_tokens, **SAMPLING}
        r = await self.c.post("/v1/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    async def chain(self, topic: str, max_tokens: int) -> str:
        text = topic
        for step in STEPS:
            text = await self.complete(step.format(text) + " ", max_tokens)
        return text

    async def map_reduce(self, parts: list[str], max_tokens: int) -> str:
        sums = await asyncio.gather(*(self.complete(f"Summarize: {p}\nSummary: ", max_tokens) for p in parts))
        return await self.complete("Combine: " + " ".join(sums) + "\nAll: ", max_tokens)


async def timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def latency_under_load(parrot: Parrot, max_tokens: int) -> float:
    sid, auth = await parrot.session()
    background = [
        await parrot.call(sid, auth, f"Story {i}: {{{{s}}}}", {}, "s", max_tokens * 2) for i in range(24)
    ]
    seconds = await timed(parrot.chain("harbours", max_tokens // 2, criteria="latency"))
    for var in background:
        await parrot.get(sid, auth, var, "throughput")
    return seconds


async def main(repeats: int) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    engine = BuiltinEngine(EngineConfig.from_env(kv_cache_bytes=512 * 2**20))
    engine.start()
    _, engine_url = serve(engine_app(engine, manage_engine=False))
    topics = [f"lighthouse number {i}" for i in range(8)]
    parts = [f"Chapter {i}: the keeper mends lamp {i} and logs the storm." for i in range(8)]
    rows = []
    apps_url = serve(serve_app(ServeCore(), engine_urls=(engine_url,)))[1]
    # Latency under load: ServeCores that give the engine 4 tasks at a time.
    loaded = {}
    for name, policy in (("on", SchedulingPolicy()), ("off", SchedulingPolicy(criteria=False))):
        loaded[name] = serve(serve_app(ServeCore(policy=policy), admin_token="bench"))[1]
        httpx.post(
            f"{loaded[name]}/v1/engines",
            json={"url": engine_url, "capacity": 4},
            headers={"Authorization": "Bearer bench"},
        ).raise_for_status()
    async with (
        httpx.AsyncClient(base_url=apps_url, timeout=600) as apps,
        httpx.AsyncClient(base_url=engine_url, timeout=600) as direct,
    ):
        parrot, baseline = Parrot(apps), RequestLevel(direct)
        await parrot.chain("warm-up", 4)  # the first requests pay one-time costs
        await baseline.chain("warm-up", 4)
        cases = {
            "8 chains x 3 steps (16 tok)": (
                lambda: asyncio.gather(*(parrot.chain(t, 16) for t in topics)),
                lambda: asyncio.gather(*(baseline.chain(t, 16) for t in topics)),
            ),
            "map-reduce 8 + 1 (16 tok)": (
                lambda: parrot.map_reduce(parts, 16),
                lambda: baseline.map_reduce(parts, 16),
            ),
        }
        for case, (ours, theirs) in cases.items():
            a = [await timed(ours()) for _ in range(repeats)]
            b = [await timed(theirs()) for _ in range(repeats)]
            rows.append((case, "request-level client", statistics.median(b), statistics.median(a)))
    lat = {}
    for name, url in loaded.items():
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            lat[name] = statistics.median(
                [await latency_under_load(Parrot(client), 16) for _ in range(repeats)]
            )
    rows.append(("latency chain behind 24 calls", "criteria policy off", lat["off"], lat["on"]))
    engine.stop()
    lines = [
        f"Machine: {machine()}. Default model, float32, greedy with ignore_eos; median of {repeats}.",
        "",
        "| workload | baseline | baseline s | Parrot s | speed-up |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for case, base, b, a in rows:
        lines.append(f"| {case} | {base} | {b:.2f} | {a:.2f} | {b / a:.2f}x |")
    table = "\n".join(lines)
    print(table)
    write_section("serve-apps", "## Applications on the ServeCore (`benchmarks/serve_apps.py`)\n\n" + table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    asyncio.run(main(parser.parse_args().repeats))
