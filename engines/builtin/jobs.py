"""Fill and Generate jobs as the local scheduler sees them, and how results travel back."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from parrot.engines.builtin.context_pool import Context
from parrot.wire.sampling import SamplingParams


class JobKind(enum.Enum):
    FILL = "fill"
    GENERATE = "generate"


@dataclass(frozen=True)
class Final:
    """A job's (or a command's) last word: its result, or the error it failed with."""

    result: Any = None
    error: BaseException | None = None


class JobSink:
    """Where a job's answers arrive on the asyncio side: ``result`` resolves once with the
    final result (or an exception); ``events`` receives streamed tokens when the caller
    asked for a stream, then None. Only :func:`hand_over` (on its loop) writes to it."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stream: bool = False, interval_s: float = 0.0
    ) -> None:
        self.loop = loop
        self.result: asyncio.Future[Any] = loop.create_future()
        self.events: asyncio.Queue[Any] | None = asyncio.Queue() if stream else None
        self.interval_s = interval_s  # streamed events after the first at most this often


Answer = tuple[JobSink, Any]  # a streamed event, or a Final


class Outbox:
    """The one way anything leaves the engine thread: answers are posted here during a step
    (or a command) and handed to the asyncio side together once the engine has published
    its statistics for that step: a client never sees an answer before ``/ping`` reflects
    it, and a step costs one wake-up of the event loop, not one per token."""

    def __init__(self) -> None:
        self._held: list[Answer] = []

    def post(self, answers: Iterable[Answer]) -> None:
        self._held.extend(answers)

    @property
    def holds(self) -> bool:
        """Whether answers wait to be delivered."""
        return bool(self._held)

    def deliver(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, []
        by_loop: dict[asyncio.AbstractEventLoop, list[Answer]] = {}
        for answer in held:
            by_loop.setdefault(answer[0].loop, []).append(answer)
        for loop, answers in by_loop.items():
            loop.call_soon_threadsafe(hand_over, answers)


def hand_over(answers: list[Answer]) -> None:
    """On the sinks' loop: each streamed event to its queue, each final answer to its future
    (unless the caller went away and cancelled it), which also ends a stream."""
    for sink, item in answers:
        if not isinstance(item, Final):
            if sink.events is not None:
                sink.events.put_nowait(item)
            continue
        if sink.result.done():
            continue
        if item.error is not None:
            sink.result.set_exception(item.error)
        else:
            sink.result.set_result(item.result)
        if sink.events is not None:
            sink.events.put_nowait(None)  # end of stream; the caller then reads ``result``


@dataclass(frozen=True)
class GenerateResult:
    """A finished generation on the engine thread: the wire's ``GenerateResponse`` plus the
    engine-clock timings that the engine's metrics observe."""

    context_id: int
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    cached_tokens: int
    # True when a stop string cut the text: the context then holds tokens past ``text``.
    stop_string: bool = False
    # Engine clock, from the job's submission: to its first sampled token, and to its end.
    first_token_s: float = 0.0
    seconds: float = 0.0


@dataclass(eq=False)
class Job:
    kind: JobKind
    context: Context
    sink: JobSink
    seq: int  # submission order
    fill_tokens: list[int] = field(default_factory=list)  # a fill's tokens, or a generation's prompt tail
    sampling: SamplingParams | None = None
    grammar: Any = None  # a generation's compiled output format (a template llguidance matcher)
    priority: int = 0  # higher: admitted first, preempted last
    background: bool = False  # a fill that prepares for later: takes what a step can spare
    # Contexts forked from this job's context once its prompt is computed (not yet made).
    checkpoints: list[Context] = field(default_factory=list)
    created: list[Context] = field(default_factory=list)  # by this job's request (freed if it goes)
    # Filled in while the job runs (engine thread only).
    prepared: bool = False
    admitted_seq: int = -1
    cached_tokens: int = 0
    prompt_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    state: Any = None  # GenerationState for generate jobs
    preemptions: int = 0
    submitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None  # when its first token was sampled
