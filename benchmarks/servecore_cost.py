"""The ServeCore's own cost per call: wall and CPU time it adds to a single call.

    python benchmarks/servecore_cost.py [--model DIR] [--calls 40] [--rounds 3]

One engine (by default the tiny random Llama of ``benchmarks/random_llama.py --size tiny``,
made on the fly, so a step costs little beside the host work) and one ``parrot serve``.
Calls of 16 tokens one after another, three ways, alternating, each ``--rounds`` times:
``plain`` (the engine's own ``/v1/completions``), ``session`` (an SDK session per call:
create, submit, get, delete) and ``call`` (``client.call``: one request). Printed: ms per
call and the ``parrot serve`` process's CPU ms per call, median (min-max) over the rounds,
also written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._report import machine, write_section
from benchmarks.apps.processes import Stack
from parrot.sdk import AsyncClient, Input, Output, semantic_function

TEXT = "the keeper logged wind and tide at dawn " * 8


@semantic_function
def summarize(part: Input, summary: Output(max_tokens=16, temperature=0, ignore_eos=True)):
    """Summarize: {{part}} => {{summary}}"""


async def one(way: str, client: AsyncClient, http: httpx.AsyncClient, engine: str, text: str) -> None:
    if way == "plain":
        body = {"prompt": f"Summarize: {text} => ", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        (await http.post(f"{engine}/v1/completions", json=body)).raise_for_status()
    elif way == "session":
        async with client.session() as session:
            await (await summarize.asubmit(text, session=session)).get()
    else:
        await client.call(summarize, text)


async def measure(stack: Stack, serve: str, engine: str, calls: int, rounds: int) -> dict[str, list]:
    results: dict[str, list] = {}
    async with AsyncClient(serve, timeout=120) as client, httpx.AsyncClient(timeout=120) as http:
        for way in ("plain", "session", "call"):  # warm up
            await one(way, client, http, engine, TEXT)
        for n in range(rounds):
            for way in ("plain", "session", "call") if n % 2 == 0 else ("call", "session", "plain"):
                cpu, start = stack.cpu_seconds("serve"), time.perf_counter()
                for i in range(calls):
                    await one(way, client, http, engine, f"{TEXT}{n}-{i}-{way}")
                wall = (time.perf_counter() - start) / calls
                used = 1000 * (stack.cpu_seconds("serve") - cpu) / calls
                results.setdefault(way, []).append((1000 * wall, used))
    return results


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: a tiny Llama)")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="parrot-cost-") as tmp, Stack(Path(tmp)) as stack:
        model = args.model
        if model is None:
            from benchmarks.random_llama import make
            from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder

            model = Path(tmp) / "tiny-llama"
            make(model, resolve_model_folder(None, default_cache_dir()), "tiny", "cpu")
        engine = stack.engines(1, ["--model", str(model), "--kv-cache-memory", "256MiB"])[0]
        serve = stack.serves([engine], {"parrot": []}, None)["parrot"]
        results = asyncio.run(measure(stack, serve, engine, args.calls, args.rounds))
    plain = statistics.median(w for w, _ in results["plain"])
    rows = [
        "| way | ms per call | added over plain, ms | ServeCore CPU ms per call |",
        "| --- | ---: | ---: | ---: |",
    ]
    for way, runs in results.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        added = "" if way == "plain" else f"{statistics.median(walls) - plain:.1f}"
        rows.append(f"| {way} | {spread(walls)} | {added} | {spread(cpus)} |")
    table = "\n".join(rows)
    print(table)
    where = "a tiny random Llama (2 layers, 64 wide)" if args.model is None else f"`{args.model}`"
    write_section(
        "servecore-cost",
        "### The ServeCore's cost per call (`benchmarks/servecore_cost.py`)\n\n"
        f"{machine()}; engine: {where}. "
        f"{args.calls} calls of 16 tokens one after another per round, {args.rounds} rounds, the ways "
        "alternating; median (min-max) over the rounds. `session`: an SDK session per call (create, "
        "submit, get, delete: 4 requests); `call`: `client.call` (one request, an unstored session).\n\n"
        + table,
    )


if __name__ == "__main__":
    main()
