"""A completion task: a chain of a session whose inputs all have values, to run on an engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from parrot.platform.serve.calls.graph import CompletionChain, PlaceholderGen
from parrot.platform.serve.scheduler.prompt import Prompt

LATENCY, THROUGHPUT = "latency", "throughput"
# Whose prompt: an engine's model, and whether its contexts are text (an OpenAI endpoint)
# or tokens (a builtin engine). Two engines of one model name may differ in that.
PromptKey = tuple[str, bool]


@dataclass(eq=False)
class CompletionTask:
    chain: CompletionChain
    session_id: str
    seq: int  # arrival order of the task
    app_seq: int  # arrival order of its session's first call, for app-FIFO
    criteria: str = THROUGHPUT  # as submitted; a latency get downstream makes it latency-critical
    models: tuple[str, ...] = ()
    prompts: dict[PromptKey, Prompt] = field(default_factory=dict)  # its prompt on each kind of engine
    engine_id: str | None = None
    attempts: int = 0  # runs started (a rerun after an engine went away counts)
    streamed: bool = False  # some of its output already went to a streaming client
    stranded_at: float | None = None  # since when no engine that serves it is up (monotonic)

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
