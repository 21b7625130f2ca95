"""OpenAI-compatible request and response shapes (the subset Parrot serves)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=10)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=-1)] = 0
    n: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0, le=10)] = 1.0
    ignore_eos: bool = False
    user: str | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[int | str]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    logprobs: bool | None = None


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class CompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: Usage | None = None


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    object: str = "chat.completion"
    usage: Usage | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: Usage | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    created: int
    object: str = "model"
    owned_by: str = "parrot"


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: str = "list"
