"""Wire formats of the engine API (Fill / Generate / free / ping), shared by engine and ServeCore."""

from __future__ import annotations

from typing import Annotated

import msgspec

from parrot.engines.protocol.sampling import SamplingParams

ContextId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class FillRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    context_id: ContextId
    parent_context_id: ContextId | None = None
    token_ids: list[int] | None = None
    text: str | None = None


class FillResponse(msgspec.Struct, kw_only=True):
    context_id: int
    filled_tokens: int
    context_len: int
    cached_tokens: int = 0


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    context_id: ContextId
    parent_context_id: ContextId | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)


class GenerateResponse(msgspec.Struct, kw_only=True):
    context_id: int
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    cached_tokens: int = 0


class TokenStreamEvent(msgspec.Struct, kw_only=True):
    token_id: int
    text: str


class StreamEnd(msgspec.Struct, kw_only=True):
    finish_reason: str
    context_id: int
    token_ids: list[int]
    text: str
    prompt_tokens: int = 0
    cached_tokens: int = 0


class FreeContextRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    context_id: ContextId


class FreeContextResponse(msgspec.Struct, kw_only=True):
    context_id: int
    freed_tokens: int


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    text: str


class TokenizeResponse(msgspec.Struct, kw_only=True):
    token_ids: list[int]


class ErrorBody(msgspec.Struct, kw_only=True):
    code: str
    message: str


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorBody


class ChatTurn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    role: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    content: str


class RenderChatRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    messages: Annotated[list[ChatTurn], msgspec.Meta(min_length=1, max_length=4096)]


class RenderChatResponse(msgspec.Struct, kw_only=True):
    """The chat's prompt (with the generation prompt) in pieces that end at message
    boundaries where the model's template allows: joined, they are the whole prompt.
    Pieces let a shared system prompt or a shared chat history be one cached context."""

    pieces: list[str]
