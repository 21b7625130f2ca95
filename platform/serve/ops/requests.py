"""The recent requests of the OpenAI-compatible front, as operators see them.

A ``/v1/completions`` or ``/v1/chat/completions`` request runs as a one-call session that is
never stored nor listed with the sessions (:mod:`parrot.platform.serve.sessions.oneshot`), so
this log is where it shows: each request has a :class:`RequestTrace` while it runs, which
writes one frozen :class:`RequestRecord` here when the request ends (answered, failed with
its reason, or cancelled because its client went away), streamed or not. The log keeps the
last ``KEEP`` records (a ring: the oldest go first), in memory only; the dashboard's
``/requests`` reads them through :class:`~parrot.platform.serve.ops.views.OperatorViews`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

from parrot.engines.protocol.errors import ClientGoneError, NotFoundError, ParrotError
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.ops.observe import matches
from parrot.wire.tool_syntax import ToolSyntax

KEEP = 500  # records the log holds
PREVIEW_CHARS = 300  # of a request's prompt, kept in its record


class RequestStatus(StrEnum):
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its client went away before the whole answer


@dataclass(frozen=True)
class RequestFacts:
    """What a request asks for, known when it comes in (read off its body and headers)."""

    request_id: str  # its response's id: ``chatcmpl-...`` or ``cmpl-...``
    route: str
    model: str | None  # as asked (None: the first model served)
    n: int
    stream: bool
    prompt_preview: str  # a chat's last user message, a completion's prompt: cut (preview)
    label: str | None = None
    tags: tuple[str, ...] = ()
    output: str | None = None  # the answer's format: "json_schema: place", "json_object", ...
    tools: tuple[str, ...] = ()  # the names of the tools it offers
    tool_choice: str | None = None  # with tools: "auto", "none", "required", "function: name"


@dataclass(frozen=True)
class RequestRecord:
    """A request that ended: what it asked for, and what became of it."""

    asked: RequestFacts
    model: str | None  # the model it ran on (None: it ended before one was chosen)
    status: RequestStatus
    error: str | None  # why it failed or stopped
    started_at: float  # unix seconds, when it came in
    ttft_s: float | None  # from its start to its first generated token
    duration_s: float  # from its start to its end
    prompt_tokens: int
    cached_tokens: int  # of the prompt tokens, those an engine had cached already
    completion_tokens: int  # over its choices (of those that finished)
    engines: tuple[str, ...]  # that ran it
    finish_reasons: tuple[str | None, ...]  # per choice, as its client was told (None: none)

    @property
    def request_id(self) -> str:
        return self.asked.request_id

    def matches(self, query: str | None) -> bool:
        """Whether ``query`` (case aside) is part of its label, id, model or a tag."""
        return matches(
            query, self.asked.label, self.request_id, self.model or self.asked.model, *self.asked.tags
        )


class RequestLog:
    """The last ``keep`` requests that ended, oldest first inside."""

    def __init__(self, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError("the request log must keep at least one request")
        self.keep = keep
        self._records: deque[RequestRecord] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._records)

    def trace(self, facts: RequestFacts) -> RequestTrace:
        """A request that comes in now."""
        return RequestTrace(self, facts)

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)

    def recent(self, query: str | None = None) -> list[RequestRecord]:
        """Newest first; with ``query``, those it matches (:meth:`RequestRecord.matches`)."""
        return [r for r in reversed(self._records) if r.matches(query)]

    def get(self, request_id: str) -> RequestRecord:
        for record in self._records:
            if record.request_id == request_id:
                return record
        raise NotFoundError(f"request {request_id!r} is not among the last {self.keep} requests")


class RequestTrace:
    """One request while it runs: its facts, then its calls once submitted. :meth:`end`
    writes its record, once: the first end wins (the front and its run may both see the
    end, e.g. a client that leaves cancels the run, then the route)."""

    def __init__(self, log: RequestLog, facts: RequestFacts) -> None:
        self.log = log
        self.facts = facts
        self.started_at = time.time()
        self._started = time.monotonic()
        self.model: str | None = None
        self.calls: Sequence[RequestChain] = ()
        self.tool_syntax: ToolSyntax | None = None  # the syntax of its tool answers, if any
        self.ended = False

    def read_tools_with(self, syntax: ToolSyntax | None) -> None:
        """Its answers are tool answers in ``syntax`` (None: they are not), known once its
        chat is rendered: its record says ``tool_calls`` where the client was told so."""
        self.tool_syntax = syntax

    def running(self, model: str, calls: Sequence[RequestChain]) -> None:
        """It runs on ``model`` as ``calls`` (one per choice; the list may still grow)."""
        self.model, self.calls = model, calls

    def end(self, status: RequestStatus, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        results = [c.chains[0].result for c in self.calls]
        first = next((r for r in results if r is not None), None)
        first_tokens = [c.timings["first_token_at"] for c in self.calls if "first_token_at" in c.timings]
        self.log.add(
            RequestRecord(
                asked=self.facts,
                model=self.model,
                status=status,
                error=error,
                started_at=self.started_at,
                ttft_s=min(first_tokens) - self.started_at if first_tokens else None,
                duration_s=time.monotonic() - self._started,
                prompt_tokens=first.prompt_tokens if first is not None else 0,
                cached_tokens=first.cached_tokens if first is not None else 0,
                completion_tokens=sum(len(r.token_ids) for r in results if r is not None),
                engines=tuple(sorted({c.engine_id for c in self.calls if c.engine_id})),
                finish_reasons=tuple(self._finish_reason(r) for r in results),
            )
        )

    def _finish_reason(self, result) -> str | None:
        if result is None:
            return None
        if self.tool_syntax is not None and self.tool_syntax.read(result.text)[1]:
            return "tool_calls"  # as the front tells the client of a complete list of calls
        return result.finish_reason

    @contextmanager
    def watch(self, done: bool = False) -> Iterator[None]:
        """Ends the trace with what ends the block: an error (failed, with its message), the
        client's leaving or a cancellation (cancelled), and with ``done`` its normal end."""
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit, ClientGoneError):
            self.end(RequestStatus.CANCELLED, "the client went away before the whole answer")
            raise
        except ParrotError as error:
            self.end(RequestStatus.FAILED, str(error))
            raise
        except Exception as error:  # a bug: its client gets a 500, the operator its name
            self.end(RequestStatus.FAILED, f"internal error: {error!r}")
            raise
        if done:
            self.end(RequestStatus.DONE)
