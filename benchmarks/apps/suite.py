"""Running a workload end to end: the servers it needs, the main comparison (baseline,
Parrot and optionally Parrot's OpenAI front at every round trip), then the ablations
(Parrot with each scheduling policy off), and the report."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.apps.chat import check_chat_template
from benchmarks.apps.clients import LEAST_BUSY
from benchmarks.apps.processes import Stack
from benchmarks.apps.runner import Sample, Side, measure
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Size, Workload
from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder

# parrot serve --no-...
POLICIES = ("app-fifo", "task-groups", "context-affinity", "criteria", "engine-roles")
OPENMP = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")  # inherited by the engines: named in the tables


@dataclass(frozen=True)
class Options:
    size: Size = "full"
    rtts_ms: tuple[int, ...] = (0, 50, 200)
    runs: int = 3
    ablations: bool = False
    front: bool = False  # a third side: the request-level client on Parrot's OpenAI front
    engine_urls: tuple[str, ...] = ()  # running engines to use instead of starting them
    kv_cache: str = "2GiB"  # --kv-cache-memory of each engine started
    capacity: int | None = None  # tasks at once per engine on a ServeCore (None: its default)
    warm_up: bool = True  # run the smallest scenario on every side first (one-time costs)
    engine_args: tuple[str, ...] = ()  # more flags for every engine started
    logs: Path | None = None  # keep the servers' debug logs (engine step traces) here
    label: str = ""  # names the run's docs sections beside the others' (e.g. cuda)
    fleet: tuple[int, ...] = ()  # llama.cpp replicas to run on, each count in turn (issue 39)
    fleet_slots: int = 4  # parallel slots of each replica


@dataclass
class Results:
    workload: Workload
    options: Options
    main: list[Sample] = field(default_factory=list)
    ablations: list[Sample] = field(default_factory=list)
    setups: dict[int, str] = field(default_factory=dict)  # by number of engines: how they ran

    @property
    def ablation_rtt_ms(self) -> int:
        return self.options.rtts_ms[0]


def engine_flags(count: int, options: Options) -> list[str]:
    """One engine uses both cores; two engines on this machine get one core each."""
    flags = ["--kv-cache-memory", options.kv_cache, *options.engine_args]
    return [*flags, "--threads", "1"] if count > 1 else flags


def describe_setup(count: int, options: Options) -> str:
    if options.engine_urls:
        return f"{count} running engine(s) given with --engine"
    env = " ".join(f"{k}={os.environ[k]}" for k in OPENMP if k in os.environ)
    engines = f"{count} x `{env + ' ' if env else ''}parrot engine {' '.join(engine_flags(count, options))}`"
    if options.capacity is not None:
        engines += f", registered with capacity {options.capacity}"
    return engines


class OnReplicas:
    """A configuration run on ``replicas`` llama.cpp servers (its label says so)."""

    def __init__(self, config: Any, replicas: int) -> None:
        self.config, self.replicas = config, replicas

    def __getattr__(self, name: str) -> Any:
        return getattr(self.config, name)

    @property
    def label(self) -> str:
        return f"{self.replicas} replica{'s' * (self.replicas > 1)}: {self.config.label}"


def run_on_fleet(workload: Workload, options: Options) -> Results:
    """Every configuration on 1, 2, ... llama.cpp replicas (``options.fleet``): Parrot with
    the replicas as its OpenAI engines against request-level clients on the same replicas,
    round-robin and least-busy."""
    results = Results(workload, options)
    fleet = getattr(workload, "fleet_configs", None)
    configs = fleet(options.size) if fleet else [c for c in workload.configs(options.size) if c.engines == 1]
    tokenizer = (resolve_model_folder(None, default_cache_dir()) / "tokenizer.json").read_text()
    doc = Document.tokenized_with(tokenizer)
    with (
        tempfile.TemporaryDirectory(prefix="parrot-fleet-") as tmp,
        Stack(options.logs or Path(tmp), "debug" if options.logs else "warning") as stack,
    ):
        for count in options.fleet:
            urls = stack.replicas(count, options.fleet_slots, slot_ctx=4096)
            check_chat_template(urls[0], llama=True)
            results.setups[count] = f"{count} x llama-server (1 thread, {options.fleet_slots} slots)"
            serve = stack.serves(urls, {"parrot": []}, options.capacity, openai=True)["parrot"]
            sides = [
                Side("baseline", "requests", tuple(urls)),
                Side("least-busy", "requests", tuple(urls), LEAST_BUSY),
                Side("parrot", "parrot", (serve,)),
            ]
            probes = {"ServeCore": lambda: stack.cpu_seconds("serve")}
            probes["engine"] = lambda: stack.cpu_seconds("llama")
            on = [OnReplicas(c, count) for c in configs]
            rtts, runs, warm = options.rtts_ms, options.runs, options.warm_up
            results.main += asyncio.run(measure(workload, on, sides, rtts, runs, doc, urls, probes, warm))
            stack.stop([serve, *urls])
    return results


def run_workload(workload: Workload, options: Options) -> Results:
    """Run ``workload`` as ``options`` say; servers are started and stopped here."""
    if options.fleet:
        return run_on_fleet(workload, options)
    results = Results(workload, options)
    configs = workload.configs(options.size)
    by_engines = itertools.groupby(sorted(configs, key=lambda c: c.engines), key=lambda c: c.engines)
    with (
        tempfile.TemporaryDirectory(prefix="parrot-bench-") as tmp,
        Stack(options.logs or Path(tmp), "debug" if options.logs else "warning") as stack,
    ):
        for count, group in by_engines:
            if options.engine_urls and len(options.engine_urls) < count:
                print(
                    f"{workload.name}: skipping {count}-engine configurations (fewer --engine URLs)",
                    file=sys.stderr,
                )
                continue
            urls = list(options.engine_urls[:count]) or stack.engines(count, engine_flags(count, options))
            results.setups[count] = describe_setup(count, options)
            _run_group(workload, options, list(group), stack, urls, results)
            if not options.engine_urls:
                stack.stop(urls)
    return results


def _run_group(
    workload: Workload,
    options: Options,
    configs: Sequence[Any],
    stack: Stack,
    urls: list[str],
    results: Results,
) -> None:
    check_chat_template(urls[0])
    doc = Document.load(urls[0])
    serve = stack.serves(urls, {"parrot": []}, options.capacity)["parrot"]
    parrot = Side("parrot", "parrot", (serve,))
    sides = [Side("baseline", "requests", tuple(urls)), parrot]
    if options.front:
        sides.append(Side("front", "requests", (serve,)))
    probes = {"ServeCore": lambda: stack.cpu_seconds("serve")}
    if not options.engine_urls:
        probes["engine"] = lambda: stack.cpu_seconds("engine")
    results.main += asyncio.run(
        measure(workload, configs, sides, options.rtts_ms, options.runs, doc, urls, probes, options.warm_up)
    )
    if options.ablations:
        variants = stack.serves(urls, {f"no {p}": [f"--no-{p}"] for p in POLICIES}, options.capacity)
        off = [Side(name, "parrot", (url,)) for name, url in variants.items()]
        rtt = (results.ablation_rtt_ms,)
        results.ablations += asyncio.run(
            measure(workload, configs, [parrot, *off], rtt, options.runs, doc, urls, probes, options.warm_up)
        )
        stack.stop(list(variants.values()))
    stack.stop([serve])
