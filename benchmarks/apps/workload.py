"""What every workload module provides, and what they share.

A workload runs one *scenario* (the fresh prompts of one run) two ways:

- ``run_parrot``: as its user writes it with the SDK (semantic functions, variables), all
  calls of an application submitted before anything is read where the application allows
  it; streaming chat users use the SDK's streams (Parrot's OpenAI front);
- ``run_requests``: the same prompts (the same rendered text) through a request-level
  client that waits for each answer before it sends what depends on it, and sends
  independent calls concurrently.

Both return the workload's metrics (seconds, tokens/s, ...), measured by the workload.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from benchmarks.apps.clients import ParrotClient, RequestClient, Streamed
from benchmarks.apps.text import Document

Size = Literal["smoke", "quick", "full"]
Metrics = dict[str, float]

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Metric:
    """A measured quantity; its speed-up is baseline / Parrot for times, Parrot /
    baseline for rates, so above 1 always means Parrot did better."""

    key: str
    label: str
    higher_is_better: bool = False
    scale: float = 1.0  # shown as value * scale (seconds as ms: 1000)

    def speedup(self, baseline: float, parrot: float) -> float:
        if baseline <= 0 or parrot <= 0:
            return float("nan")
        return parrot / baseline if self.higher_is_better else baseline / parrot


FINAL_ANSWER = (Metric("seconds", "app s"), Metric("ttft_s", "first token s"))


def final_answer(answer: Streamed) -> Metrics:
    """The metrics of an application whose final answer was streamed, timed from the
    application's start: to its last token (the whole answer) and to its first."""
    return {"seconds": answer.total_s, "ttft_s": answer.ttft_s}


class Config(Protocol):
    """A workload's parameters; ``label`` names them in tables."""

    engines: int

    @property
    def label(self) -> str: ...


class Workload(Protocol):
    name: str  # the command-line name
    title: str
    about: str  # one paragraph for the docs: what runs, what is measured
    metrics: tuple[Metric, ...]  # the first is the headline

    def configs(self, size: Size) -> list[Any]: ...

    def scenario(self, config: Any, doc: Document, rng: random.Random, tag: str) -> Any: ...

    async def run_parrot(self, parrot: ParrotClient, scenario: Any) -> Metrics: ...

    async def run_requests(self, client: RequestClient, scenario: Any) -> Metrics: ...


def prompt_of(template: str, values: Mapping[str, str]) -> str:
    """The text a model reads for a call: ``template`` with ``values`` put in, up to the
    first placeholder without a value (the output). Semantic functions pass their
    ``.template``, so both sides of a benchmark send the same text by construction."""
    pieces, pos = [], 0
    for match in PLACEHOLDER.finditer(template):
        pieces.append(template[pos : match.start()])
        if match.group(1) not in values:
            return "".join(pieces)
        pieces.append(values[match.group(1)])
        pos = match.end()
    raise ValueError("the template has no output placeholder")
