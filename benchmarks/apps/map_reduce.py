"""Map-reduce summarization: every chunk of a document summarized on its own (the maps),
then one call that reads all those summaries (the reduce).

Parrot: one session; the maps are submitted together, then the reduce (a template with a
placeholder per map output, so the server starts it once the last map has generated and
schedules the maps as the group it waits for), then one ``get``. Baseline: the maps sent
concurrently, the reduce once all their answers are back. Measured: the latency of one
application. The mixed workload runs these applications beside chat users.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from benchmarks.apps.chain import SYSTEM, summarize  # the maps are the chain's first step
from benchmarks.apps.clients import WAIT_S, ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Metric, Metrics, Size, prompt_of


def reduce_template(system: str, count: int) -> str:
    """The reduce: one placeholder ``s0`` ... per map output, then the output ``summary``."""
    lines = "\n".join(f"- {{{{s{i}}}}}" for i in range(count))
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
        f"Here are summaries of consecutive passages of one book:\n{lines}\n"
        "Write one summary of the whole, in three sentences.<|im_end|>\n"
        "<|im_start|>assistant\n{{summary}}"
    )


@dataclass(frozen=True)
class MapReduceConfig:
    maps: int
    chunk_tokens: int
    output_tokens: int
    engines: int = 1

    @property
    def label(self) -> str:
        return f"{self.maps} maps x {self.chunk_tokens} tok + reduce, {self.output_tokens} out"


@dataclass(frozen=True)
class MapReduceScenario:
    system: str
    parts: list[str]
    output_tokens: int


def map_reduce_scenario(
    config: MapReduceConfig, doc: Document, rng: random.Random, tag: str
) -> MapReduceScenario:
    parts = doc.passages(rng, config.maps, config.chunk_tokens)
    return MapReduceScenario(SYSTEM.format(tag=tag), parts, config.output_tokens)


async def parrot_app(parrot: ParrotClient, s: MapReduceScenario, criteria: str = "latency") -> float:
    """One application on Parrot; its latency in seconds. ``criteria``: what its final
    ``get`` asks for (a batch job beside interactive users asks for throughput)."""
    start = time.perf_counter()
    out = fixed_output(s.output_tokens)
    async with parrot.session() as session:
        maps = await asyncio.gather(*(summarize.asubmit(s.system, part, summary=out) for part in s.parts))
        inputs = {f"s{i}": var for i, var in enumerate(maps)}
        call = await session.submit(reduce_template(s.system, len(maps)), inputs, {"summary": out})
        await call.outputs["summary"].get(criteria=criteria, timeout=WAIT_S)
        return time.perf_counter() - start


async def requests_app(client: RequestClient, s: MapReduceScenario) -> float:
    """One application on a request-level server; its latency in seconds."""
    start = time.perf_counter()
    prompts = [prompt_of(summarize.template, {"system": s.system, "part": part}) for part in s.parts]
    sums = await asyncio.gather(*(client.complete(p, s.output_tokens) for p in prompts))
    values = {f"s{i}": text for i, text in enumerate(sums)}
    await client.complete(prompt_of(reduce_template(s.system, len(sums)), values), s.output_tokens)
    return time.perf_counter() - start


class MapReduce:
    name = "map-reduce"
    title = "Map-reduce summarization"
    about = (
        "A document's chunks summarized in parallel (the maps), then one reduce over all "
        "the summaries. Latency of one application."
    )
    metrics = (Metric("seconds", "app s"),)

    def configs(self, size: Size) -> list[MapReduceConfig]:
        return {
            "smoke": [MapReduceConfig(2, 48, 4)],
            "quick": [MapReduceConfig(8, 256, 16)],
            "full": [MapReduceConfig(16, 512, 32), MapReduceConfig(32, 256, 32)],
        }[size]

    def scenario(self, config: MapReduceConfig, doc: Document, rng: random.Random, tag: str):
        return map_reduce_scenario(config, doc, rng, tag)

    async def run_parrot(self, parrot: ParrotClient, s: MapReduceScenario) -> Metrics:
        return {"seconds": await parrot_app(parrot, s)}

    async def run_requests(self, client: RequestClient, s: MapReduceScenario) -> Metrics:
        return {"seconds": await requests_app(client, s)}


WORKLOAD = MapReduce()
