"""Map-reduce summarization: every chunk of a document summarized on its own (the maps),
then one call that reads all those summaries (the reduce).

Parrot: one pipelined session; the maps, the reduce (a template with a placeholder per
map output, so the server starts it once the last map has generated and schedules the
maps as the group it waits for) and the stream of the reduce's output go in one request.
Baseline: the maps sent concurrently, the reduce (streamed) once all their answers are
back. Measured: the latency of one application, to the first token of its answer and to
the whole answer. The mixed workload runs these applications beside chat users (there
they are batch jobs, read with one ``get``).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from benchmarks.apps.chain import SYSTEM, summarize  # the maps are the chain's first step
from benchmarks.apps.clients import WAIT_S, ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import FINAL_ANSWER, Metrics, Size, final_answer, prompt_of
from parrot.sdk import AsyncSession, AsyncVar


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


async def submit_map_reduce(session: AsyncSession, s: MapReduceScenario) -> AsyncVar:
    """The maps, then the reduce, submitted without waiting for any: the reduce's output."""
    out = fixed_output(s.output_tokens)
    maps = await asyncio.gather(*(summarize.asubmit(s.system, part, summary=out) for part in s.parts))
    inputs = {f"s{i}": var for i, var in enumerate(maps)}
    call = await session.submit(reduce_template(s.system, len(maps)), inputs, {"summary": out})
    return call.outputs["summary"]


async def parrot_app(parrot: ParrotClient, s: MapReduceScenario, criteria: str = "latency") -> float:
    """One application on Parrot; its latency in seconds. ``criteria``: what its final
    ``get`` asks for (a batch job beside interactive users asks for throughput)."""
    start = time.perf_counter()
    async with parrot.session(pipeline=True) as session:
        final = await submit_map_reduce(session, s)
        await final.get(criteria=criteria, timeout=WAIT_S)
        return time.perf_counter() - start


async def map_answers(client: RequestClient, s: MapReduceScenario) -> list[str]:
    """The maps on a request-level server, sent concurrently."""
    prompts = [prompt_of(summarize.template, {"system": s.system, "part": part}) for part in s.parts]
    return await asyncio.gather(*(client.complete(p, s.output_tokens) for p in prompts))


def reduce_prompt(s: MapReduceScenario, sums: list[str]) -> str:
    values = {f"s{i}": text for i, text in enumerate(sums)}
    return prompt_of(reduce_template(s.system, len(sums)), values)


async def requests_app(client: RequestClient, s: MapReduceScenario) -> float:
    """One application on a request-level server; its latency in seconds."""
    start = time.perf_counter()
    await client.complete(reduce_prompt(s, await map_answers(client, s)), s.output_tokens)
    return time.perf_counter() - start


class MapReduce:
    name = "map-reduce"
    title = "Map-reduce summarization"
    about = (
        "A document's chunks summarized in parallel (the maps), then one reduce over all "
        "the summaries. Latency of one application."
    )
    metrics = FINAL_ANSWER

    def configs(self, size: Size) -> list[MapReduceConfig]:
        return {
            "smoke": [MapReduceConfig(2, 48, 4)],
            "quick": [MapReduceConfig(8, 256, 16)],
            "full": [MapReduceConfig(16, 512, 32), MapReduceConfig(32, 256, 32)],
        }[size]

    def scenario(self, config: MapReduceConfig, doc: Document, rng: random.Random, tag: str):
        return map_reduce_scenario(config, doc, rng, tag)

    async def run_parrot(self, parrot: ParrotClient, s: MapReduceScenario) -> Metrics:
        start = time.perf_counter()
        async with parrot.session(pipeline=True) as session:  # the calls and the answer: one request
            final = await submit_map_reduce(session, s)
            return final_answer(await parrot.stream_var(final, s.output_tokens, start))

    async def run_requests(self, client: RequestClient, s: MapReduceScenario) -> Metrics:
        start = time.perf_counter()
        sums = await map_answers(client, s)
        return final_answer(await client.complete_stream(reduce_prompt(s, sums), s.output_tokens, start))


WORKLOAD = MapReduce()
