"""Fill and Generate jobs as the local scheduler sees them, and how results travel back."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parrot.engines.builtin.context_pool import Context
from parrot.wire.sampling import SamplingParams


def settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Complete a command's future on its loop (posted through the :class:`Outbox`), unless
    it was already done (cancelled by its caller)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class JobKind(enum.Enum):
    FILL = "fill"
    GENERATE = "generate"


class Outbox:
    """What the engine thread hands to the asyncio side, held until the engine has published
    its statistics for the step (or commands) that produced it: a client never sees an
    answer before ``/ping`` reflects it."""

    def __init__(self) -> None:
        self._held: list[tuple[asyncio.AbstractEventLoop, Callable[..., None], tuple]] = []

    def post(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
        self._held.append((loop, fn, args))

    def deliver(self) -> None:
        held, self._held = self._held, []
        for loop, fn, args in held:
            loop.call_soon_threadsafe(fn, *args)


class JobSink:
    """Delivers a job's events from the engine thread to the asyncio side.

    ``result`` resolves once with the final result (or an exception); ``events`` receives
    streamed tokens when the caller asked for a stream. Without an outbox, events go at once.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stream: bool = False, outbox: Outbox | None = None
    ) -> None:
        self.loop = loop
        self.outbox = outbox
        self.result: asyncio.Future[Any] = loop.create_future()
        self.events: asyncio.Queue[Any] | None = asyncio.Queue() if stream else None

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        if self.outbox is not None:
            self.outbox.post(self.loop, fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def emit(self, event: Any) -> None:
        if self.events is not None:
            self._post(self.events.put_nowait, event)

    def finish(self, result: Any) -> None:
        self._post(self._set, result, None)

    def fail(self, error: BaseException) -> None:
        self._post(self._set, None, error)

    def _set(self, result: Any, error: BaseException | None) -> None:
        if self.result.done():
            return
        if error is not None:
            self.result.set_exception(error)
        else:
            self.result.set_result(result)
        if self.events is not None:
            self.events.put_nowait(None)  # end of stream; the caller then reads ``result``


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
