"""A completion task: a chain of a session whose inputs all have values, to run on an engine,
and the reports the scheduler sends back about it.

The scheduler changes no call state: it tells the task's submitter what happened (the task
started on an engine, finished with a result, or failed with a reason) through the task's
``reports`` queue, and the submitter (:mod:`parrot.platform.serve.calls.drive`) advances the
call. (As nano-vllm's ``step`` returns outputs and only the scheduler's ``postprocess``
advances a sequence.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from parrot.engines.protocol.schemas import GenerateResponse, StreamEnd
from parrot.platform.serve.calls.graph import CompletionChain, PlaceholderGen
from parrot.platform.serve.scheduler.prompt import Prompt

LATENCY, THROUGHPUT = "latency", "throughput"
# Whose prompt: an engine's model, and whether its contexts are text (an OpenAI endpoint)
# or tokens (a builtin engine). Two engines of one model name may differ in that.
PromptKey = tuple[str, bool]
Result = GenerateResponse | StreamEnd


@dataclass(frozen=True)
class Started:
    """The task was placed on an engine (again, after a requeue)."""

    engine_id: str


@dataclass(frozen=True)
class Finished:
    """The engine generated the task's output."""

    result: Result
    first_token_at: float | None  # unix seconds
    model: str
    prompt_ids: tuple[int, ...] | None  # the prompt it ran with (None: a text engine)


@dataclass(frozen=True)
class Failed:
    """The task will never run to its end; ``reason`` says why."""

    reason: str


Report = Started | Finished | Failed


@dataclass(eq=False)
class CompletionTask:
    chain: CompletionChain
    session_id: str
    seq: int  # arrival order of the task
    app_seq: int  # arrival order of its session's first call, for app-FIFO
    criteria: str = THROUGHPUT  # as submitted; a latency get downstream makes it latency-critical
    models: tuple[str, ...] = ()
    prompts: dict[PromptKey, Prompt] = field(default_factory=dict)  # its prompt on each kind of engine
    attempts: int = 0  # runs started (a rerun after an engine went away counts)
    stranded_at: float | None = None  # since when no engine that serves it is up (monotonic)
    lost: bool = False  # its engine was marked down while it ran (it runs again elsewhere)
    tail: bool = False  # placed as its application's critical path's end (policy.EngineRoles)
    reports: asyncio.Queue[Report] = field(default_factory=asyncio.Queue)

    @property
    def key(self) -> str:
        return self.chain.key

    @property
    def gen(self) -> PlaceholderGen:
        return self.chain.gen

    @property
    def latency(self) -> bool:
        return self.criteria == LATENCY or self.chain.latency_depth > 0

    @property
    def depth(self) -> int:
        """How far upstream of an awaited variable it is (deeper first: the rest waits on it)."""
        return self.chain.latency_depth

    @property
    def group(self) -> tuple[int, int] | None:
        return self.chain.group

    def need(self, key: PromptKey) -> int:
        """KV tokens the task may add on an engine of ``key`` (its prompt, its output)."""
        prompt = self.prompts.get(key)
        return (len(prompt) if prompt is not None else 0) + self.gen.sampling.max_tokens

    def left(self, key: PromptKey) -> int:
        """Tokens a running task has yet to compute: its need until its first token, then
        the rest of its output (as far as its stream has told)."""
        stream = self.gen.var.stream
        if stream.first_token_at is None:
            return self.need(key)
        return max(0, self.gen.sampling.max_tokens - stream.token_count)


@dataclass
class SchedulerStats:
    """Counters of the tasks the scheduler ran (read through its snapshot)."""

    done: int = 0
    failed: int = 0
    requeued: int = 0
    prompt_tokens: int = 0  # of started tasks
    reused_tokens: int = 0  # of those, forked from a context on the engine (prefix hits)
    filled_ahead: int = 0  # tokens filled before their call's inputs were all there
    evicted: int = 0  # contexts freed under memory pressure (the context manager counts; snapshots copy)
