"""Streamed deltas of the SDK (:class:`parrot.sdk.CompletionDelta`) as LangChain chunks.

A model's own ``stream`` runs on the ServeCore's OpenAI-compatible routes: one call per
stream, latency-critical, with the same sampling as a call. (A compiled chain streams its
final semantic variable instead: :meth:`ChainRun.stream_output`.)
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult, GenerationChunk

from parrot.adapters.langchain.model_calls import usage_metadata
from parrot.sdk.streams import CompletionDelta


def _info(delta: CompletionDelta) -> dict[str, Any] | None:
    info: dict[str, Any] = {}
    if delta.finish_reason is not None:
        info |= {"finish_reason": delta.finish_reason, "model_name": delta.model}
    if delta.usage is not None:
        u = delta.usage
        info["token_usage"] = {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "cached_tokens": u.prompt_tokens_details.cached_tokens,
        }
    return info or None


def generation_chunk(delta: CompletionDelta) -> GenerationChunk:
    return GenerationChunk(text=delta.text, generation_info=_info(delta))


def chat_generation_chunk(delta: CompletionDelta) -> ChatGenerationChunk:
    """A chat chunk; the last one carries the usage as ``usage_metadata`` (LangChain adds
    the chunks' usage up), the finish reason is in the message's ``response_metadata``."""
    usage = None
    if delta.usage is not None:
        u = delta.usage
        usage = usage_metadata(u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens)
    info = None
    if delta.finish_reason is not None:
        info = {"finish_reason": delta.finish_reason, "model_name": delta.model}
    message = AIMessageChunk(content=delta.text, usage_metadata=usage)
    return ChatGenerationChunk(message=message, generation_info=info)


def whole_message_chunk(result: ChatResult) -> ChatGenerationChunk:
    """A whole answer as the one chunk of its stream (its tool calls as tool call chunks)."""
    generation = result.generations[0]
    message = generation.message
    assert isinstance(message, AIMessage)
    chunks = [
        {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": n}
        for n, c in enumerate(message.tool_calls)
    ]
    chunk = AIMessageChunk(
        content=message.content,
        tool_call_chunks=chunks,
        usage_metadata=message.usage_metadata,
        response_metadata=message.response_metadata,
    )
    return ChatGenerationChunk(message=chunk, generation_info=generation.generation_info)
