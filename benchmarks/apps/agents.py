"""Multi-agent programming (the code / test / review DAG of the design notes): for every
task a coder writes the code, a tester writes tests for that code, and a reviewer reads
both; many such applications run at once, and the three roles' system prompts are shared
by all of them.

Parrot: a pipelined session per application: its three calls (the tester takes the
coder's output variable, the reviewer both) and the ``get`` of the verdict go in one
request. Baseline: each agent's request sent once the answers it reads are back,
applications concurrently. Measured: the time until every application is done, and the
mean latency of an application.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from benchmarks.apps.clients import WAIT_S, ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Metric, Metrics, Size, prompt_of
from parrot.sdk import Input, Output, semantic_function

TEAM = (
    "Team {tag}. You are one of three agents of a small software team that writes Python "
    "utilities for a library of old books: a coder writes a function for a task, a tester "
    "writes pytest tests for the coder's function, and a reviewer reads both and decides "
    "whether they can be merged. The team's conventions: Python 3.11, type hints on every "
    "function, a one-line docstring, no global state, no third-party packages, plain loops "
    "rather than clever one-liners, and names that say what a thing is. Functions take "
    "plain strings and return plain values; they never print, and they raise ValueError "
    "with a clear message on bad input. Tests are small, one behaviour each, named after "
    "that behaviour, with the edge cases (empty text, one word, mixed case, punctuation) "
    "covered. "
)
CODER = TEAM + "You are the coder. Answer with the code only, no explanation."
TESTER = TEAM + "You are the tester. Answer with the test code only, no explanation."
REVIEWER = TEAM + "You are the reviewer. Answer with a verdict (merge or revise) and one reason."
TASKS = (
    "Write a function count_{name}(text: str) -> int that counts how often the word "
    "'{word}' occurs in text, ignoring case and punctuation.",
    "Write a function first_{name}(text: str) -> int that returns the index of the first "
    "sentence of text that mentions '{word}', or -1 when none does.",
    "Write a function redact_{name}(text: str) -> str that replaces every occurrence of "
    "the word '{word}' in text by as many asterisks as it has letters.",
    "Write a function define_{name}(entries: str) -> str that finds the dictionary entry "
    "for '{word}' in entries (lines 'WORD, n.  definition') and returns its definition.",
)


@semantic_function
def write_code(system, task: Input, code: Output):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    {{task}}<|im_end|>
    <|im_start|>assistant
    {{code}}"""


@semantic_function
def write_tests(system, task: Input, code: Input, tests: Output):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    The task was: {{task}}
    The coder wrote:
    {{code}}
    Write pytest tests for this function.<|im_end|>
    <|im_start|>assistant
    {{tests}}"""


@semantic_function
def review(system, task: Input, code: Input, tests: Input, verdict: Output):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    The task was: {{task}}
    The code:
    {{code}}
    The tests:
    {{tests}}
    Can this be merged?<|im_end|>
    <|im_start|>assistant
    {{verdict}}"""


@dataclass(frozen=True)
class AgentsConfig:
    apps: int
    output_tokens: int
    engines: int = 1

    @property
    def label(self) -> str:
        return f"{self.apps} apps x (code, test, review), {self.output_tokens} out"


@dataclass(frozen=True)
class AgentsScenario:
    coder: str
    tester: str
    reviewer: str
    tasks: list[str]
    output_tokens: int


def _metrics(latencies: list[float]) -> Metrics:
    """All applications start together: the last one ended after the longest latency."""
    return {"seconds": max(latencies), "app_s": sum(latencies) / len(latencies)}


class Agents:
    name = "agents"
    title = "Multi-agent programming"
    about = (
        "Many applications at once, each a coder, a tester that reads the code, and a "
        "reviewer that reads both, behind three role prompts shared by all applications. "
        "Time until all are done, and the mean latency of an application."
    )
    metrics = (Metric("seconds", "all apps s"), Metric("app_s", "app s"))

    def configs(self, size: Size) -> list[AgentsConfig]:
        return {
            "smoke": [AgentsConfig(1, 4)],
            "quick": [AgentsConfig(4, 16)],
            "full": [AgentsConfig(16, 32)],
        }[size]

    def scenario(self, config: AgentsConfig, doc: Document, rng: random.Random, tag: str) -> AgentsScenario:
        tasks = []
        for n, word in enumerate(doc.words(rng, config.apps)):
            name = "".join(c if c.isalnum() else "_" for c in word.lower())
            tasks.append(TASKS[n % len(TASKS)].format(name=name, word=word.lower()))
        roles = (CODER.format(tag=tag), TESTER.format(tag=tag), REVIEWER.format(tag=tag))
        return AgentsScenario(*roles, tasks, config.output_tokens)

    async def run_parrot(self, parrot: ParrotClient, s: AgentsScenario) -> Metrics:
        async def app(task: str) -> float:
            start = time.perf_counter()
            out = fixed_output(s.output_tokens)
            async with parrot.session(pipeline=True):  # the calls and the verdict: one request
                code = await write_code.asubmit(s.coder, task, code=out)
                tests = await write_tests.asubmit(s.tester, task, code, tests=out)
                verdict = await review.asubmit(s.reviewer, task, code, tests, verdict=out)
                await verdict.get(timeout=WAIT_S)
                return time.perf_counter() - start

        return _metrics(await asyncio.gather(*(app(t) for t in s.tasks)))

    async def run_requests(self, client: RequestClient, s: AgentsScenario) -> Metrics:
        async def app(task: str) -> float:
            start = time.perf_counter()
            n = s.output_tokens
            code = await client.complete(prompt_of(write_code.template, {"system": s.coder, "task": task}), n)
            values = {"system": s.tester, "task": task, "code": code}
            tests = await client.complete(prompt_of(write_tests.template, values), n)
            values = {"system": s.reviewer, "task": task, "code": code, "tests": tests}
            await client.complete(prompt_of(review.template, values), n)
            return time.perf_counter() - start

        return _metrics(await asyncio.gather(*(app(t) for t in s.tasks)))


WORKLOAD = Agents()
