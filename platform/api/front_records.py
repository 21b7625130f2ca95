"""What the OpenAI front tells operators of a request when it comes in
(:class:`~parrot.platform.serve.ops.requests.RequestFacts`): its label and tags, the format or
tools it asks for, and a preview of its prompt.

A request is labelled the way OpenAI clients can say it without a Parrot client: its
``metadata`` (OpenAI's object of string values: ``label``, and every other key as a tag
``key=value``, or ``key`` where its value is empty), else an ``X-Parrot-Label`` header. A
label follows the rules of a session's (``POST /v1/session``): 1 to 200 characters, else a
400 that names where it came from.
"""

from __future__ import annotations

import msgspec
from litestar.datastructures import Headers

from parrot.engines.protocol.errors import BadRequestError
from parrot.platform.serve.ops.requests import PREVIEW_CHARS, RequestFacts
from parrot.wire.bodies import Label
from parrot.wire.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    NamedToolChoice,
)

LABEL_HEADER = "X-Parrot-Label"
CHAT_ROUTE, COMPLETIONS_ROUTE = "/v1/chat/completions", "/v1/completions"


def request_facts(
    request_id: str, data: ChatCompletionRequest | CompletionRequest, headers: Headers
) -> RequestFacts:
    chat = isinstance(data, ChatCompletionRequest)
    label, tags = _label(data.metadata or {}, headers.get(LABEL_HEADER))
    tools = tuple(t.function.name for t in data.tools or ()) if chat else ()
    return RequestFacts(
        request_id=request_id,
        route=CHAT_ROUTE if chat else COMPLETIONS_ROUTE,
        model=data.model,
        n=data.n,
        stream=bool(data.stream),
        prompt_preview=_chat_preview(data) if chat else _prompt_preview(data),
        label=label,
        tags=tags,
        output=_output(data),
        tools=tools,
        tool_choice=_tool_choice(data) if tools else None,
    )


def _label(metadata: dict[str, str], header: str | None) -> tuple[str | None, tuple[str, ...]]:
    tags = tuple(f"{key}={value}" if value else key for key, value in metadata.items() if key != "label")
    label, where = (metadata["label"], "metadata.label") if "label" in metadata else (header, LABEL_HEADER)
    if label is None:
        return None, tags
    try:
        return msgspec.convert(label, Label), tags
    except msgspec.ValidationError as error:
        raise BadRequestError(f"{where}: {error}") from None


def _output(data: ChatCompletionRequest | CompletionRequest) -> str | None:
    """The answer's format, as a short phrase: ``json_schema: <its name>``, ``json_object``,
    ``structured_outputs: regex``; None for free text."""
    asked = data.response_format
    if isinstance(asked, JsonSchemaFormat):
        return f"json_schema: {asked.json_schema.name}"
    if isinstance(asked, JsonObjectFormat):
        return "json_object"
    if data.structured_outputs is not None:
        kinds = [k for k, v in msgspec.structs.asdict(data.structured_outputs).items() if v is not None]
        return f"structured_outputs: {', '.join(kinds)}"
    return None


def _tool_choice(data: ChatCompletionRequest) -> str:
    choice = data.tool_choice
    if isinstance(choice, NamedToolChoice):
        return f"function: {choice.function.name}"
    return choice or "auto"  # OpenAI's default when tools are given


def _chat_preview(data: ChatCompletionRequest) -> str:
    """The last user message (its start: the question), cut to PREVIEW_CHARS."""
    message = next((m for m in reversed(data.messages) if m.role == "user"), data.messages[-1])
    content = message.content
    if isinstance(content, list):  # parts: their text (others are refused later, with a 400)
        content = "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")
    text = content or ""
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def _prompt_preview(data: CompletionRequest) -> str:
    """A completion's prompt, its end (what differs between requests that share a start),
    cut to PREVIEW_CHARS."""
    prompt = data.prompt
    if isinstance(prompt, list):
        prompt = " ".join(p if isinstance(p, str) else "(token ids)" for p in prompt[:1])
    return prompt if len(prompt) <= PREVIEW_CHARS else "…" + prompt[-PREVIEW_CHARS:]
