"""Wire formats of the engine API (Fill / Generate / free / ping), shared by engine and ServeCore."""

from __future__ import annotations

from typing import Annotated

import msgspec

from parrot.wire.chat import ChatTurn
from parrot.wire.openai_schemas import MAX_TOOLS, ToolChoice, ToolDefinition
from parrot.wire.sampling import SamplingParams

ContextId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Length = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
# Jobs with a higher priority are admitted first and preempted last (latency-critical
# work of a ServeCore runs at 1; plain requests at 0).
Priority = Annotated[int, msgspec.Meta(ge=0, le=10)]
# A fork may wait this long for a parent that does not exist yet (the request creating it
# may still be on its way): a ServeCore pipelines dependent requests.
WaitMs = Annotated[int, msgspec.Meta(ge=0, le=60_000)]
# A stream's events at most this often after its first token (0: one per token); the
# tokens between are joined into one event.
StreamIntervalMs = Annotated[int, msgspec.Meta(ge=0, le=60_000)]


class Checkpoint(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A new context forked from the request's context at ``length`` tokens, once the
    prompt is computed: a shareable prefix (a system prompt) kept as a context of its own,
    sharing the KV blocks instead of copying them."""

    context_id: ContextId
    length: Length


class FillRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Append tokens (or text) to a context; a new context forks ``parent_context_id``
    (its first ``parent_len`` tokens; all of it when omitted)."""

    context_id: ContextId
    parent_context_id: ContextId | None = None
    parent_len: Length | None = None
    parent_timeout_ms: WaitMs = 0
    token_ids: list[int] | None = None
    text: str | None = None
    priority: Priority = 0
    checkpoints: Annotated[list[Checkpoint], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    # A fill that prepares for later (a ServeCore filling a waiting call's known prompt):
    # it takes only what steps used by other jobs can spare.
    background: bool = False


class FillResponse(msgspec.Struct, kw_only=True):
    context_id: int
    filled_tokens: int
    context_len: int
    cached_tokens: int = 0


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Generate into a context. ``token_ids`` (or ``text``), when given, are filled first in
    the same job: one request and one job for prompt tail + generation."""

    context_id: ContextId
    parent_context_id: ContextId | None = None
    parent_len: Length | None = None
    parent_timeout_ms: WaitMs = 0
    token_ids: list[int] | None = None
    text: str | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    priority: Priority = 0
    checkpoints: Annotated[list[Checkpoint], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    # ``/generate_stream``: a caller that nobody reads along with (it only needs the first
    # token's time and the end) asks for fewer events; each costs both sides CPU.
    stream_interval_ms: StreamIntervalMs = 0


class GenerateResponse(msgspec.Struct, kw_only=True):
    context_id: int
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stop_string: bool = False  # a stop string cut the text (the context holds more)


class TokenStreamEvent(msgspec.Struct, kw_only=True):
    token_id: int  # the last of its tokens
    text: str
    tokens: int = 1  # tokens its text covers (more than one when joined by an interval)


class StreamEnd(msgspec.Struct, kw_only=True):
    finish_reason: str
    context_id: int
    token_ids: list[int]
    text: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stop_string: bool = False  # a stop string cut the text (the context holds more)


class FreeContextRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    context_id: ContextId


class FreeContextResponse(msgspec.Struct, kw_only=True):
    context_id: int
    freed_tokens: int


class AbortRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Stop the jobs running or queued on these contexts and free the contexts."""

    context_ids: Annotated[list[ContextId], msgspec.Meta(min_length=1, max_length=4096)]


class AbortRangeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Stop the jobs on, and free, every context with ``start <= context_id < end``: what a
    ServeCore run that died left behind (each run takes its ids from a range of its own)."""

    start: ContextId
    end: ContextId


class AbortResponse(msgspec.Struct, kw_only=True):
    aborted_jobs: int
    freed_contexts: int


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    text: str


class TokenizeResponse(msgspec.Struct, kw_only=True):
    token_ids: list[int]


class RenderChatRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A chat to render, with the tool fields of its OpenAI request: the engine renders the
    tools and tool turns in its model's tool syntax (:mod:`parrot.wire.tool_syntax`)."""

    messages: Annotated[list[ChatTurn], msgspec.Meta(min_length=1, max_length=4096)]
    tools: Annotated[list[ToolDefinition], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True


class RenderChatResponse(msgspec.Struct, kw_only=True):
    """The chat's prompt (with the generation prompt) in pieces that end at message
    boundaries where the model's template allows: joined, they are the whole prompt.
    Pieces let a shared system prompt or a shared chat history be one cached context."""

    pieces: list[str]
    tool_syntax: str = "generic"  # how the answer is to write calls (wire/tool_syntax.py)


class EngineHealth(msgspec.Struct, kw_only=True):
    status: str  # "ok", or "loading" (answered with 503) while the model loads
    stage: str | None = None  # while loading: what it is doing and for how long
