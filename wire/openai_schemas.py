"""OpenAI-compatible request and response shapes (the subset Parrot serves)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
# OpenAI's rule for function names (and a json_schema's name).
FunctionName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
MAX_TOOLS = 128
# OpenAI's ``metadata``: up to 16 string pairs, keys of up to 64 characters, values of 512.
Metadata = Annotated[
    dict[
        Annotated[str, msgspec.Meta(max_length=64)],
        Annotated[str, msgspec.Meta(max_length=512)],
    ],
    msgspec.Meta(max_length=16),
]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class TextFormat(msgspec.Struct, tag="text", tag_field="type", kw_only=True):
    """``response_format: {"type": "text"}``: free text (the default)."""


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", kw_only=True):
    """``response_format: {"type": "json_object"}``: a JSON object of any shape."""


class JsonSchemaSpec(msgspec.Struct, kw_only=True):
    name: FunctionName
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None  # accepted; the answer is always constrained to the schema


class JsonSchemaFormat(msgspec.Struct, tag="json_schema", tag_field="type", kw_only=True):
    """``response_format: {"type": "json_schema", "json_schema": {...}}``: JSON that
    matches the schema (what ``openai``'s ``chat.completions.parse`` sends)."""

    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class StructuredOutputs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` (one field set): what OpenAI's ``response_format``
    cannot say. ``json`` is a schema (an object or its JSON text); ``grammar`` is Lark in
    llguidance's dialect (Parrot's grammar library), not GBNF."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


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
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's extension: regex, choice, grammar
    metadata: Metadata | None = None  # the ServeCore's front: a label (``label``) and tags (the rest)


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[int | str]
    echo: bool = False
    logprobs: int | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(msgspec.Struct, kw_only=True):
    """A call of a tool in an assistant message (an answer, or the history sent back)."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (its content may be null)
    tool_call_id: str | None = None  # a tool message: the call it answers


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of an object; none: no arguments
    strict: bool | None = None  # accepted; arguments are always constrained to the schema


class ToolDefinition(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


class ChosenFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: call that tool."""

    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    logprobs: bool | None = None
    tools: Annotated[list[ToolDefinition], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True


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
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET  # only in an answer with calls


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


class FunctionCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed piece of a tool call: the first carries its id, type and name."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


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
