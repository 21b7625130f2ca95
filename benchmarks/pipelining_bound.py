"""What token pipelining between a producer and its consumer could gain at most, on the
chain workload (issue 22, section 3), measured before anything is built.

On Parrot a consumer whose input is still being generated already has its prompt filled up
to that input while the producer runs (the ServeCore's fill-ahead). What is left on the
critical path once the producer ends: prefill the input value, prefill the rest of the
prompt, decode. Pipelining (the producer's tokens appended to the consumer's context as
they arrive) can take only the first of these off that path. So the most it can save on
the chain is, summed over the steps that read a previous step's output, the time to
prefill that output in the consumer's context; the bound is that sum over the chain's time
to its final answer.

Each run: the chain workload's application on a ServeCore (`benchmarks/apps/chain.py`,
time to the final answer), then, on the same engine when idle, every consumer's input
value (the real text its producer wrote) filled on its own into a context that holds the
consumer's prompt up to that value (a system prompt with a tag of its own, so the
engine's prefix cache cannot serve the value's blocks). A fill of its own pays a whole
engine step and an HTTP request for a few tokens, where pipelined chunks would ride in
the producer's decode steps, and they are not free there either: the bound is generous.

    python benchmarks/pipelining_bound.py [--runs 3] [--size quick|full]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._report import machine, write_section
from benchmarks.apps.chain import SYSTEM, WORKLOAD, ChainScenario, refine, submit_chain
from benchmarks.apps.clients import WAIT_S, ParrotClient
from benchmarks.apps.processes import Stack
from benchmarks.apps.text import Document, new_tag, run_rng
from benchmarks.apps.workload import prompt_of
from benchmarks.spread import Spread

SHIP_THRESHOLD = 0.10  # issue 22: pipelining ships only for >= 10% on the time to the final answer
CONTEXT_IDS = itertools.count(7_000_000)  # a direct client's ids (a ServeCore's are >= 2**48)


async def chain_on_parrot(serve_url: str, s: ChainScenario) -> tuple[float, list[str]]:
    """The chain application's time to its final answer, and every step's output."""
    async with ParrotClient(serve_url, 0) as parrot:
        start = time.perf_counter()
        async with parrot.session():
            summaries = await submit_chain(s)
            await summaries[-1].get(timeout=WAIT_S)
            seconds = time.perf_counter() - start
            return seconds, [await v.get_text() for v in summaries]


class Probe:
    """Consumer steps re-run on the engine, each in a context of its own forked from a
    prefix with a tag of its own (nothing one measurement computes is in the engine's
    prefix cache for another)."""

    def __init__(self, engine: httpx.AsyncClient, s: ChainScenario) -> None:
        self.engine, self.s = engine, s
        self.made: list[int] = []

    async def _post(self, route: str, body: dict) -> float:
        start = time.perf_counter()
        (await self.engine.post(route, json=body)).raise_for_status()
        return time.perf_counter() - start

    async def prefix(self) -> tuple[int, str]:
        """A context holding a consumer's prompt up to its input value (as the ServeCore's
        fill-ahead leaves it), and that prompt's system prompt."""
        system = SYSTEM.format(tag=new_tag())  # as the chain's, with a tag of its own
        context = self.context()
        text = prompt_of(refine.template, {"system": system})  # up to {{previous}}
        await self._post("/fill", {"context_id": context, "text": text})
        return context, system

    def context(self) -> int:
        self.made.append(next(CONTEXT_IDS))
        return self.made[-1]

    async def fill_alone(self, prefix: int, value: str) -> float:
        """Seconds to prefill ``value`` on its own after the prompt so far."""
        return await self._post(
            "/fill", {"context_id": self.context(), "parent_context_id": prefix, "text": value}
        )

    async def critical_path(self, value: str, part: str, pipelined: bool) -> float:
        """Seconds from the producer's end to the consumer's answer: prefill the value
        (unless ``pipelined``: then it is in the context already) and the rest of the
        prompt, and decode the answer."""
        prefix, system = await self.prefix()
        whole = prompt_of(refine.template, {"system": system, "previous": value, "part": part})
        rest = whole[len(prompt_of(refine.template, {"system": system})) :]
        if pipelined:
            context = self.context()
            await self._post("/fill", {"context_id": context, "parent_context_id": prefix, "text": value})
            prefix, rest = context, rest[len(value) :]
        body = {
            "context_id": self.context(),
            "parent_context_id": prefix,
            "text": rest,
            "sampling": {"max_tokens": self.s.output_tokens, "temperature": 0, "ignore_eos": True},
        }
        return await self._post("/generate", body)

    async def free(self) -> None:
        for context in self.made:
            await self.engine.post("/free_context", json={"context_id": context})
        self.made.clear()


async def consumer_steps(
    engine: httpx.AsyncClient, s: ChainScenario, values: list[str]
) -> dict[str, list[float]]:
    """For every step that reads the previous step's output: the value's prefill alone, and
    the step's critical path without and with pipelining (in alternating order)."""
    probe = Probe(engine, s)
    found: dict[str, list[float]] = {"fill": [], "plain": [], "pipelined": []}
    try:
        prefix, _ = await probe.prefix()
        for n, (value, part) in enumerate(zip(values[:-1], s.parts[1:], strict=True)):
            found["fill"].append(await probe.fill_alone(prefix, value))
            for pipelined in (False, True) if n % 2 == 0 else (True, False):
                key = "pipelined" if pipelined else "plain"
                found[key].append(await probe.critical_path(value, part, pipelined))
    finally:
        await probe.free()
    return found


async def measure(engine_url: str, serve_url: str, size: str, runs: int) -> dict[str, list[float]]:
    config = WORKLOAD.configs(size)[0]
    doc = Document.load(engine_url)
    found: dict[str, list[float]] = {
        k: [] for k in ("answer_s", "fills_s", "saved_s", "bound", "estimate", "load")
    }
    async with httpx.AsyncClient(base_url=engine_url, timeout=600) as engine:
        warm = WORKLOAD.scenario(WORKLOAD.configs("smoke")[0], doc, run_rng("warm-up", "", 0), new_tag())
        _, values = await chain_on_parrot(serve_url, warm)
        await consumer_steps(engine, warm, values)  # first requests pay one-time costs
        for run in range(runs):
            s = WORKLOAD.scenario(config, doc, run_rng("pipelining", config.label, run), new_tag())
            answer_s, values = await chain_on_parrot(serve_url, s)
            steps = await consumer_steps(engine, s, values)
            fills, saved = sum(steps["fill"]), sum(steps["plain"]) - sum(steps["pipelined"])
            found["answer_s"].append(answer_s)
            found["fills_s"].append(fills)
            found["saved_s"].append(saved)
            found["bound"].append(fills / answer_s)
            found["estimate"].append(saved / answer_s)
            found["load"].append(os.getloadavg()[0])
            print(
                f"run {run}: final answer {answer_s:.2f} s; {len(steps['fill'])} value fills "
                f"{fills * 1000:.0f} ms ({', '.join(f'{f * 1000:.0f}' for f in steps['fill'])} ms); "
                f"consumer steps {sum(steps['plain']):.2f} s plain, {sum(steps['pipelined']):.2f} s "
                f"with the value already in; bound {fills / answer_s:.1%}, estimate {saved / answer_s:.1%}",
                flush=True,
            )
    found["label"], found["size"] = config.label, size  # type: ignore[assignment]
    return found


def report(found: dict, runs: int, engine_flags: list[str]) -> str:
    answer, fills, saved, bound, estimate = (
        Spread(found[k]) for k in ("answer_s", "fills_s", "saved_s", "bound", "estimate")
    )
    worst = max(bound.high, estimate.high)
    verdict = (
        f"under the issue's {SHIP_THRESHOLD:.0%} in every run: pipelining is not shipped"
        if worst < SHIP_THRESHOLD
        else f"not clearly under the issue's {SHIP_THRESHOLD:.0%}: for the lead to decide"
    )
    loads = Spread(found["load"])
    return "\n".join(
        [
            f"Machine: {machine()}; load average (1 min) {loads.low:.1f} to {loads.high:.1f} during the "
            f"runs. `parrot engine {' '.join(engine_flags)}` and `parrot serve` as processes of their own. "
            f"Chain workload `{found['label']}` (the {found['size']} size of `parrot bench chain`), "
            f"greedy with `ignore_eos`; {runs} runs, each the chain on Parrot,"
            " then its consumer steps re-run on the engine; median (min-max).",
            "",
            "| time to the final answer, s | value prefills alone, ms | bound: prefills / answer "
            "| consumer steps, plain - value already in, ms | estimate: saved / answer |",
            "| ---: | ---: | ---: | ---: | ---: |",
            f"| {answer.show('.2f')} | {fills.show('.0f', 1000)} | {bound.show('.1%')} "
            f"| {saved.show('.0f', 1000)} | {estimate.show('.1%')} |",
            "",
            f"Most pipelining could save: {bound.median:.1%} of the time to the final answer (at most "
            f"{worst:.1%} in any run, either way of measuring): {verdict}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", choices=("smoke", "quick", "full"), default="quick")
    parser.add_argument(
        "--engine-arg", action="append", default=[], metavar="FLAG", help="one more engine flag"
    )
    parser.add_argument("--no-docs", action="store_true", help="print only, leave docs/benchmarks.md")
    args = parser.parse_args()
    flags = ["--kv-cache-memory", "2GiB", *args.engine_arg]
    with tempfile.TemporaryDirectory(prefix="parrot-pipelining-") as tmp, Stack(Path(tmp)) as stack:
        (engine_url,) = stack.engines(1, flags)
        serve_url = stack.serves([engine_url], {"parrot": []})["parrot"]
        found = asyncio.run(measure(engine_url, serve_url, args.size, args.runs))
    table = report(found, args.runs, flags)
    print(table)
    if not args.no_docs:
        write_section(
            "pipelining-bound",
            "### Token pipelining: the most it could gain (`benchmarks/pipelining_bound.py`)\n\n" + table,
        )


if __name__ == "__main__":
    main()
