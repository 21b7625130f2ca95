"""Measuring a workload: its configurations x round trips x runs, every side of a run
one after the other on the same engines, with the engines' token counters read around
each side's run.

Sides are interleaved (baseline, Parrot, ...; reversed on every other run) so that drifts
of a shared machine hit them alike. A side is a way to run the workload: ``baseline``
(request-level client on the engines' own ``/v1``), ``parrot`` (the SDK on a ServeCore),
``front`` (request-level client on Parrot's OpenAI front), and for the ablations
``parrot`` next to ServeCores with one scheduling policy off each.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any, Literal

import httpx

from benchmarks.apps.clients import ROUND_ROBIN, ParrotClient, RequestClient
from benchmarks.apps.text import Document, new_tag, run_rng
from benchmarks.apps.workload import Metrics, Workload

SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Side:
    """``parrot``: the SDK (and OpenAI front) of the ServeCore at ``urls[0]``;
    ``requests``: a request-level client of the OpenAI-compatible servers ``urls``, which
    picks one per request as ``pick`` says (round-robin or least-busy)."""

    name: str
    kind: Literal["parrot", "requests"]
    urls: tuple[str, ...]
    pick: str = ROUND_ROBIN


@dataclass(frozen=True)
class Work:
    """Engine token counters (``GET /ping``), summed over the engines."""

    generated: int
    computed: int
    steps: int  # engine iterations (one batch each)
    fill_steps: int = 0  # steps that computed prompts only (sampled nothing)
    graph_steps: int = 0  # steps replayed as CUDA graphs (the rest ran eagerly)
    step_s: float = 0.0  # wall time in steps

    def __sub__(self, other: Work) -> Work:
        return Work(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.step_s / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class Sample:
    config: str
    rtt_ms: int
    side: str
    run: int
    metrics: Metrics
    work: Work
    cpu: dict[str, float]  # CPU seconds of the run: "client" (this process) and each probe's
    load: float  # the machine's 1-minute load average at the end of the run


# The engine's counters (GET /ping) that make a Work, in its fields' order.
WORK_COUNTERS = ("tokens_generated", "tokens_computed", "steps", "fill_steps", "graph_steps", "step_seconds")


# A llama.cpp server's counters (GET /metrics) by the names of the builtin engine's.
LLAMA_METRICS = {
    "tokens_generated": "llamacpp:tokens_predicted_total",
    "tokens_computed": "llamacpp:prompt_tokens_total",
    "steps": "llamacpp:n_decode_total",
    "num_running": "llamacpp:requests_processing",
    "num_waiting": "llamacpp:requests_deferred",
}


async def engine_stats(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """A builtin engine's ``/ping``, or a llama.cpp server's ``/metrics`` under its names."""
    answer = await http.get(f"{url}/ping")
    if answer.status_code != 404:
        return answer.json()
    lines = (await http.get(f"{url}/metrics")).text.splitlines()
    values = dict(line.split()[:2] for line in lines if line.startswith("llamacpp:"))
    return {ours: float(values.get(theirs, 0)) for ours, theirs in LLAMA_METRICS.items()}


async def settled_work(http: httpx.AsyncClient, engine_urls: Sequence[str]) -> Work:
    """The engines' counters once nothing runs or waits on them (the work of a run is
    all counted, and the next run starts on idle engines)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        stats = [await engine_stats(http, url) for url in engine_urls]
        busy = sum(s["num_running"] + s["num_waiting"] for s in stats)
        if not busy or time.monotonic() > deadline:
            counts = [sum(s.get(k, 0) for s in stats) for k in WORK_COUNTERS]
            return Work(*(round(c) for c in counts[:-1]), counts[-1])
        await asyncio.sleep(0.1)


async def run_side(workload: Workload, side: Side, scenario: Any, rtt_s: float) -> Metrics:
    if side.kind == "requests":
        async with RequestClient(side.urls, rtt_s, side.pick) as client:
            return await workload.run_requests(client, scenario)
    async with ParrotClient(side.urls[0], rtt_s) as parrot:
        return await workload.run_parrot(parrot, scenario)


async def warm_up(workload: Workload, sides: Sequence[Side], doc: Document) -> None:
    """The smallest scenario once on every side: first requests pay one-time costs."""
    config = workload.configs("smoke")[0]
    for side in sides:
        await run_side(
            workload, side, workload.scenario(config, doc, run_rng("warm-up", "", 0), new_tag()), 0
        )


async def measure(
    workload: Workload,
    configs: Sequence[Any],
    sides: Sequence[Side],
    rtts_ms: Sequence[int],
    runs: int,
    doc: Document,
    engine_urls: Sequence[str],
    probes: Mapping[str, Callable[[], float]],
    warm: bool = True,
) -> list[Sample]:
    """Every configuration, round trip and run on every side (see the module docstring).
    ``probes`` read CPU seconds used so far by the servers (by kind: engine, ServeCore)."""
    samples = []
    if warm:
        await warm_up(workload, sides, doc)
    async with httpx.AsyncClient(timeout=60) as http:
        for config in configs:
            for rtt in rtts_ms:
                for run in range(runs):
                    for side in sides if run % 2 == 0 else list(reversed(sides)):
                        rng = run_rng(workload.name, f"{config.label}/{rtt}", run)
                        scenario = workload.scenario(config, doc, rng, new_tag())
                        before = await settled_work(http, engine_urls)
                        cpu = _cpu(probes)
                        metrics = await run_side(workload, side, scenario, rtt / 1000)
                        work = await settled_work(http, engine_urls) - before
                        used = {k: v - cpu[k] for k, v in _cpu(probes).items()}
                        load = os.getloadavg()[0]
                        sample = Sample(config.label, rtt, side.name, run, metrics, work, used, load)
                        samples.append(sample)
                        log(workload, sample)
    return samples


def _cpu(probes: Mapping[str, Callable[[], float]]) -> dict[str, float]:
    return {"client": time.process_time(), **{name: probe() for name, probe in probes.items()}}


def log(workload: Workload, sample: Sample) -> None:
    shown = ", ".join(
        f"{m.label} {sample.metrics[m.key] * m.scale:.3g}"
        for m in workload.metrics
        if m.key in sample.metrics
    )
    print(
        f"{workload.name} | {sample.config} | rtt {sample.rtt_ms} ms | run {sample.run} | {sample.side}: "
        f"{shown} | tokens generated {sample.work.generated}, computed {sample.work.computed}, "
        f"engine steps {sample.work.steps} | CPU s "
        + ", ".join(f"{k} {v:.2f}" for k, v in sample.cpu.items()),
        file=sys.stderr,
        flush=True,
    )
