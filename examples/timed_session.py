"""A helper of the LangChain examples: run a runnable in an SDK session of its own and
report its output, the seconds it took and the server's record of every call it made;
compare two runnables over several runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from langchain_core.runnables import Runnable

from parrot.sdk import Client

RUNS = 3  # one run's ratio is noise on a busy machine: a median and a spread need three


def run_in_session(client: Client, runnable: Runnable, inputs: Any) -> dict:
    with client.session() as session:  # Parrot models called inside put their calls here
        start = time.perf_counter()
        output = runnable.invoke(inputs)
        seconds = time.perf_counter() - start
        calls = [msgspec.to_builtins(call) for call in session.info().calls]
    return {"output": output, "seconds": round(seconds, 3), "calls": calls}


def compare(client: Client, runnables: Mapping[str, Runnable], inputs: Any, runs: int = RUNS) -> dict:
    """Every runnable ``runs`` times, in alternating order (A B, B A, A B, ...) so that a
    machine that gets busier or quieter affects them alike, after one warm-up run (the
    first calls pay one-time costs, and all runnables send the same prompts). Per name:
    the last run (output, calls), ``seconds`` the median over the runs, ``runs_s`` them all."""
    names = list(runnables)
    run_in_session(client, runnables[names[0]], inputs)  # warm-up, not counted
    found: dict[str, list[dict]] = {name: [] for name in names}
    for n in range(runs):
        for name in names if n % 2 == 0 else reversed(names):
            found[name].append(run_in_session(client, runnables[name], inputs))
    return {
        name: {
            **done[-1],
            "seconds": round(statistics.median(r["seconds"] for r in done), 3),
            "runs_s": [r["seconds"] for r in done],
        }
        for name, done in found.items()
    }


def spread(run: dict) -> str:
    """``median s (min-max)`` of a :func:`compare` result."""
    return f"{run['seconds']:.2f} s ({min(run['runs_s']):.2f}-{max(run['runs_s']):.2f})"


def verdict(results: Mapping[str, dict]) -> str:
    """Both times with their spread, and how much faster the second is than the first,
    unless their ranges overlap: then the difference is within the noise."""
    (slow_name, slow), (fast_name, fast) = results.items()
    runs = len(fast["runs_s"])
    shown = f"{slow_name}: {spread(slow)}, {fast_name}: {spread(fast)} (median of {runs} runs, min-max)"
    ratio = slow["seconds"] / fast["seconds"]
    if min(slow["runs_s"]) <= max(fast["runs_s"]) and min(fast["runs_s"]) <= max(slow["runs_s"]):
        return f"{shown}; the ranges overlap: the ratio ({ratio:.2f}x) is within the noise, not a result"
    return f"{shown}; {fast_name} {ratio:.2f}x as fast"
