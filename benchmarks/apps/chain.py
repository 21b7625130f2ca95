"""Chain summarization: a long document summarized chunk by chunk, each step rewriting the
summary so far with the next chunk (the paper's chain summary).

Parrot: one session; the first step and every refinement are submitted one after another
(each takes the previous step's output variable, so the server runs it as soon as that
exists, without a round trip), then one ``get`` of the last summary. Baseline: each step
sent after the previous answer came back. Measured: the latency of one application.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from benchmarks.apps.clients import WAIT_S, ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Metric, Metrics, Size, prompt_of
from parrot.sdk import AsyncVar, Input, Output, semantic_function

SYSTEM = "Editor desk {tag}. You write short, plain summaries of old books for modern readers."


@semantic_function
def summarize(system, part: Input, summary: Output):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    Summarize this passage in two sentences:
    {{part}}<|im_end|>
    <|im_start|>assistant
    {{summary}}"""


@semantic_function
def refine(system, previous: Input, part: Input, summary: Output):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    The summary so far:
    {{previous}}
    The next passage:
    {{part}}
    Rewrite the summary so that it covers the next passage too, in two sentences.<|im_end|>
    <|im_start|>assistant
    {{summary}}"""


@dataclass(frozen=True)
class ChainConfig:
    steps: int
    chunk_tokens: int
    output_tokens: int
    engines: int = 1

    @property
    def label(self) -> str:
        return f"{self.steps} steps x {self.chunk_tokens} tok, {self.output_tokens} out"


@dataclass(frozen=True)
class ChainScenario:
    system: str
    parts: list[str]
    output_tokens: int


async def submit_chain(s: ChainScenario) -> list[AsyncVar]:
    """Every step of the chain submitted, in the current session, without waiting for any:
    the summary variable of each step, the last one the application's answer."""
    out = fixed_output(s.output_tokens)
    summaries = [await summarize.asubmit(s.system, s.parts[0], summary=out)]
    for part in s.parts[1:]:
        summaries.append(await refine.asubmit(s.system, summaries[-1], part, summary=out))
    return summaries


class Chain:
    name = "chain"
    title = "Chain summarization"
    about = (
        "One document summarized chunk by chunk: step 1 summarizes the first chunk, step n "
        "rewrites the summary so far with chunk n. Latency of one application."
    )
    metrics = (Metric("seconds", "app s"),)

    def configs(self, size: Size) -> list[ChainConfig]:
        return {
            "smoke": [ChainConfig(2, 48, 4)],
            "quick": [ChainConfig(8, 256, 16)],
            "full": [ChainConfig(8, 256, 32), ChainConfig(16, 512, 32)],
        }[size]

    def scenario(self, config: ChainConfig, doc: Document, rng: random.Random, tag: str) -> ChainScenario:
        parts = doc.passages(rng, config.steps, config.chunk_tokens)
        return ChainScenario(SYSTEM.format(tag=tag), parts, config.output_tokens)

    async def run_parrot(self, parrot: ParrotClient, s: ChainScenario) -> Metrics:
        start = time.perf_counter()
        async with parrot.session():
            summaries = await submit_chain(s)
            await summaries[-1].get(timeout=WAIT_S)
            return {"seconds": time.perf_counter() - start}

    async def run_requests(self, client: RequestClient, s: ChainScenario) -> Metrics:
        start = time.perf_counter()
        first = prompt_of(summarize.template, {"system": s.system, "part": s.parts[0]})
        summary = await client.complete(first, s.output_tokens)
        for part in s.parts[1:]:
            values = {"system": s.system, "previous": summary, "part": part}
            summary = await client.complete(prompt_of(refine.template, values), s.output_tokens)
        return {"seconds": time.perf_counter() - start}


WORKLOAD = Chain()
