"""Chain summarization: a long document summarized chunk by chunk, each step rewriting the
summary so far with the next chunk (the paper's chain summary).

Parrot: one pipelined session; the first step and every refinement (each takes the
previous step's output variable, so the server runs it as soon as that exists, without a
round trip) and the stream of the last summary go in one request. Baseline: each step
sent after the previous answer came back, the last one streamed. Measured: the latency of
one application, to the first token of its answer and to the whole answer.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from benchmarks.apps.clients import ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import FINAL_ANSWER, Metrics, Size, final_answer, prompt_of
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


def step_prompt(s: ChainScenario, n: int, previous: str) -> str:
    """The text step ``n`` reads, ``previous`` the summary so far (none for the first)."""
    if n == 0:
        return prompt_of(summarize.template, {"system": s.system, "part": s.parts[0]})
    return prompt_of(refine.template, {"system": s.system, "previous": previous, "part": s.parts[n]})


class Chain:
    name = "chain"
    title = "Chain summarization"
    about = (
        "One document summarized chunk by chunk: step 1 summarizes the first chunk, step n "
        "rewrites the summary so far with chunk n. Latency of one application."
    )
    metrics = FINAL_ANSWER

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
        async with parrot.session(pipeline=True):  # the calls and the answer: one request
            summaries = await submit_chain(s)
            return final_answer(await parrot.stream_var(summaries[-1], s.output_tokens, start))

    async def run_requests(self, client: RequestClient, s: ChainScenario) -> Metrics:
        start = time.perf_counter()
        summary = ""
        for n in range(len(s.parts) - 1):
            summary = await client.complete(step_prompt(s, n, summary), s.output_tokens)
        last = step_prompt(s, len(s.parts) - 1, summary)
        return final_answer(await client.complete_stream(last, s.output_tokens, start))


WORKLOAD = Chain()
