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
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section

STEPS = ("Topic: {}\nOne fact about it:", "Fact: {}\nShorter:", "Short fact: {}\nTitle:")
SAMPLING = {"temperature": 0, "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list[str], ready_path: str, data_dir: str) -> tuple[subprocess.Popen, str]:
    """``parrot ARGS --port P`` as its own process (as deployed), once it answers."""
    port = free_port()
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "bench", "PARROT_DATA_DIR": data_dir}
    cmd = [
        sys.executable,
        "-m",
        "parrot.cli.main",
        "--log-level",
        "warning",
        *args,
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{args[0]} exited with code {proc.returncode}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.3)


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
    """The same applications on a request-level server: the client sends each step.

    Prompts go as token ids, each piece of text tokenized on its own (with the model's
    tokenizer, fetched once) exactly as the ServeCore does, so both sides run the same
    tokens through the model and generate the same text: the comparison is of serving,
    not of two different workloads."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client
        self.tokenizer: Tokenizer | None = None

    async def complete(self, pieces: list[str], max_tokens: int) -> str:
        if self.tokenizer is None:
            self.tokenizer = Tokenizer.from_str((await self.c.get("/tokenizer")).text)
        tokens = [t for p in pieces if p for t in self.tokenizer.encode(p, add_special_tokens=False).ids]
        body = {"prompt": tokens, "max_tokens": max_tokens, **SAMPLING}
        r = await self.c.post("/v1/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    async def chain(self, topic: str, max_tokens: int) -> str:
        text = topic
        for step in STEPS:
            before, after = step.split("{}")
            text = await self.complete([before, text, after + " "], max_tokens)
        return text

    async def map_reduce(self, parts: list[str], max_tokens: int) -> str:
        sums = await asyncio.gather(
            *(self.complete(["Summarize: ", p, "\nSummary: "], max_tokens) for p in parts)
        )
        pieces = ["Combine: "]
        for n, text in enumerate(sums):
            pieces += [text, " "] if n < len(sums) - 1 else [text]
        return await self.complete([*pieces, "\nAll: "], max_tokens)


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
    # Fresh texts for every run: a repeat must not find the previous one in the engine's
    # prefix cache. Within a run both sides get the same texts, the baseline first (its
    # blocks are of no use to the ServeCore's forked contexts, nor the other way round).
    def topics(run: int) -> list[str]:
        return [f"lighthouse number {i} of fleet {run}" for i in range(8)]

    def parts(run: int) -> list[str]:
        return [f"Chapter {i} of book {run}: the keeper mends lamp {i} and logs the storm." for i in range(8)]

    rows = []
    data = tempfile.mkdtemp(prefix="parrot-bench-")
    procs = []
    try:
        engine, engine_url = start(["engine", "--kv-cache-memory", "512MiB"], "/ping", data)
        procs.append(engine)
        apps, apps_url = start(
            ["serve", "--engine", engine_url, "--db", f"sqlite+aiosqlite:///{data}/apps.db"], "/healthz", data
        )
        procs.append(apps)
        # Latency under load: ServeCores that give the engine 4 tasks at a time.
        loaded = {}
        for name, flag in (("on", []), ("off", ["--no-criteria"])):
            proc, loaded[name] = start(
                ["serve", "--no-engine", "--db", f"sqlite+aiosqlite:///{data}/{name}.db", *flag],
                "/healthz",
                data,
            )
            procs.append(proc)
            httpx.post(
                f"{loaded[name]}/v1/engines",
                json={"url": engine_url, "capacity": 4},
                headers={"Authorization": "Bearer bench"},
            ).raise_for_status()
        async with (
            httpx.AsyncClient(base_url=apps_url, timeout=600) as client,
            httpx.AsyncClient(base_url=engine_url, timeout=600) as direct,
        ):
            parrot, baseline = Parrot(client), RequestLevel(direct)
            await parrot.chain("warm-up", 4)  # the first requests pay one-time costs
            await baseline.chain("warm-up", 4)
            cases = {
                "8 chains x 3 steps (16 tok)": (
                    lambda run: asyncio.gather(*(parrot.chain(t, 16) for t in topics(run))),
                    lambda run: asyncio.gather(*(baseline.chain(t, 16) for t in topics(run))),
                ),
                "map-reduce 8 + 1 (16 tok)": (
                    lambda run: parrot.map_reduce(parts(run), 16),
                    lambda run: baseline.map_reduce(parts(run), 16),
                ),
            }

            async def computed() -> int:
                return (await direct.get("/ping")).json()["tokens_computed"]

            for case, (ours, theirs) in cases.items():
                a, b, work = [], [], {}
                for run in range(repeats):  # interleaved, so drifts hit both alike
                    for side, app, times in (("baseline", theirs, b), ("parrot", ours, a)):
                        before = await computed()
                        times.append(await timed(app(run)))
                        work[side] = await computed() - before
                case = f"{case}; engine tokens {work['baseline']} / {work['parrot']}"
                rows.append((case, "request-level client", statistics.median(b), statistics.median(a)))
        lat = {}
        for name, url in loaded.items():
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                runs = [await latency_under_load(Parrot(client), 16) for _ in range(repeats)]
                lat[name] = statistics.median(runs)
        rows.append(("latency chain behind 24 calls", "criteria policy off", lat["off"], lat["on"]))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.wait(timeout=60)
        shutil.rmtree(data, ignore_errors=True)
    lines = [
        f"Machine: {machine()}. Default model, float32, greedy with ignore_eos; median of {repeats}.",
        "The engine and each ServeCore run as their own processes (`parrot engine`, `parrot serve`);",
        "both sides send the same tokens (engine tokens computed: baseline / Parrot).",
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
