"""A chat completion with tools or a response format: ``POST /v1/chat/completions``
(not streamed), answered with the assistant's text or its tool calls.

The messages, tools, ``tool_choice`` and ``response_format`` are OpenAI's own shapes,
sent as they are (``{"role": "tool", "tool_call_id": ..., "content": ...}`` and assistant
messages with ``tool_calls`` included), so a tool loop written for OpenAI's API sends the
same dicts here. Sampling settings are validated and sent as a stream's are
(:func:`parrot.sdk.streams.openai_sampling`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from parrot.sdk.errors import BadRequestError
from parrot.sdk.http import Op, struct
from parrot.sdk.streams import openai_sampling
from parrot.wire.openai_schemas import ChatCompletionRequest, Usage


class ToolCall(msgspec.Struct, kw_only=True, frozen=True):
    """One call of a tool the model asked for: ``arguments`` is its JSON text."""

    id: str
    name: str
    arguments: str

    def args(self) -> Any:
        """The arguments, parsed."""
        return json.loads(self.arguments)

    def message(self) -> dict[str, Any]:
        """The call as an entry of an assistant message's ``tool_calls`` (OpenAI's shape)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class ChatReply(msgspec.Struct, kw_only=True, frozen=True):
    """The assistant's answer: its text (``content``, None when it only calls tools), the
    tools it calls, ``finish_reason`` (``stop``, ``length`` or ``tool_calls``), usage."""

    model: str
    content: str | None = None
    tool_calls: list[ToolCall] = []
    finish_reason: str | None = None
    usage: Usage | None = None

    def message(self) -> dict[str, Any]:
        """The answer as the assistant message to send back in the next turn."""
        turn: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            turn["tool_calls"] = [call.message() for call in self.tool_calls]
        return turn


class _Function(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = ""


class _ToolCall(msgspec.Struct, kw_only=True):
    id: str
    function: _Function
    type: str = "function"


class _Message(msgspec.Struct, kw_only=True):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct, kw_only=True):
    message: _Message
    finish_reason: str | None = None


class _Response(msgspec.Struct, kw_only=True):
    model: str
    choices: list[_Choice]
    usage: Usage | None = None


def _reply(response: _Response) -> ChatReply:
    choice = response.choices[0]
    calls = [
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
        for c in choice.message.tool_calls or ()
    ]
    return ChatReply(
        model=response.model,
        content=choice.message.content,
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        usage=response.usage,
    )


def chat_completion(
    messages: Sequence[Mapping[str, Any]],
    model: str | None,
    sampling: Mapping[str, Any],
    api_key: str | None,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    parallel_tool_calls: bool | None = None,
    response_format: Mapping[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Op[ChatReply]:
    """``POST /v1/chat/completions``; the options left None are the server's defaults. The
    body is checked here against the type the server decodes (:class:`BadRequestError`)."""
    body: dict[str, Any] = {"messages": [dict(m) for m in messages], **openai_sampling(sampling)}
    options = {
        "model": model,
        "tools": list(tools) if tools else None,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel_tool_calls,
        "response_format": response_format,
        "metadata": dict(metadata) if metadata else None,
    }
    body |= {k: v for k, v in options.items() if v is not None}
    try:
        request = msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as error:
        raise BadRequestError(f"invalid chat request: {error}") from None
    return Op("POST", "/v1/chat/completions", struct(_Response), body=request, token=api_key).then(_reply)
