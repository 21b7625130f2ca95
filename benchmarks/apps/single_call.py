"""Single calls: the ServeCore's overhead per call. Independent one-call applications, one
after another (never two at once), each summarizing a fresh passage.

Parrot: each call in one request with the SDK's ``client.call`` (a session made and
deleted by that request). Baseline: the same rendered prompt sent to the engine's own
``/v1/completions``. Both sides run the same tokens on an idle engine, so the difference
is what the ServeCore adds to a call: the SDK's requests, tokenizing and placing the call,
one engine request, storing its states. Measured: the mean time of a call.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from benchmarks.apps.chain import SYSTEM, summarize
from benchmarks.apps.clients import WAIT_S, ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Metric, Metrics, Size, prompt_of


@dataclass(frozen=True)
class SingleCallConfig:
    calls: int
    chunk_tokens: int
    output_tokens: int
    engines: int = 1

    @property
    def label(self) -> str:
        return f"{self.calls} calls one at a time, {self.chunk_tokens} tok, {self.output_tokens} out"


@dataclass(frozen=True)
class SingleCallScenario:
    system: str
    parts: list[str]
    output_tokens: int


class SingleCall:
    name = "single-call"
    title = "Single calls: the ServeCore's overhead"
    about = (
        "Independent one-call applications, one after another: what the ServeCore adds to "
        "a call over the engine's own route. Mean time of a call."
    )
    metrics = (Metric("seconds", "s per call"),)

    def configs(self, size: Size) -> list[SingleCallConfig]:
        return {
            "smoke": [SingleCallConfig(2, 48, 4)],
            "quick": [SingleCallConfig(8, 256, 16)],
            "full": [SingleCallConfig(16, 256, 32), SingleCallConfig(16, 64, 8)],
        }[size]

    def scenario(
        self, config: SingleCallConfig, doc: Document, rng: random.Random, tag: str
    ) -> SingleCallScenario:
        parts = doc.passages(rng, config.calls, config.chunk_tokens)
        return SingleCallScenario(SYSTEM.format(tag=tag), parts, config.output_tokens)

    async def run_parrot(self, parrot: ParrotClient, s: SingleCallScenario) -> Metrics:
        out = fixed_output(s.output_tokens)
        start = time.perf_counter()
        for part in s.parts:  # one request a call, as the baseline's
            await parrot.call(summarize, s.system, part, summary=out, timeout=WAIT_S)
        return {"seconds": (time.perf_counter() - start) / len(s.parts)}

    async def run_requests(self, client: RequestClient, s: SingleCallScenario) -> Metrics:
        start = time.perf_counter()
        for part in s.parts:
            prompt = prompt_of(summarize.template, {"system": s.system, "part": part})
            await client.complete(prompt, s.output_tokens)
        return {"seconds": (time.perf_counter() - start) / len(s.parts)}


WORKLOAD = SingleCall()
