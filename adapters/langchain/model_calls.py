"""A model's prompt as a semantic call, for both kinds of model and both ways of running
(a Parrot model on its own, a compiled chain): the prompt text with the run's markers in
it becomes a template whose markers are input variables.

A chat is rendered on the server with the model's own chat template (``/v1/render_chat``),
so its text is what ``/v1/chat/completions`` would run, and a system message shared by many
calls is constant text at the start of each: one shared prefix on the engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata

from parrot.adapters.langchain.session_run import SessionRun
from parrot.adapters.langchain.texts import TextSlot
from parrot.sdk.results import CallUsage

ROLES: tuple[tuple[type[BaseMessage], str], ...] = (
    (HumanMessage, "user"),
    (AIMessage, "assistant"),
    (SystemMessage, "system"),
    (ToolMessage, "tool"),
    (FunctionMessage, "function"),
)


async def submit_completion(
    run: SessionRun, prompt: str, output: str, sampling: dict[str, Any], models: Sequence[str]
) -> TextSlot:
    """Generate after ``prompt`` (text with the run's markers)."""
    return await run.generate(run.texts.split(prompt), output, sampling, models)


async def submit_chat(
    run: SessionRun,
    messages: Sequence[BaseMessage],
    output: str,
    sampling: dict[str, Any],
    model: str | None,
) -> tuple[TextSlot, str]:
    """Generate the assistant's reply to ``messages`` (whose texts may hold the run's
    markers); returns its slot and the model whose template rendered the chat (the call
    runs on that model)."""
    turns = [{"role": role_of(m), "content": text_of(m)} for m in messages]
    rendered = await run.client.render_chat(turns, model)
    slot = await run.generate(run.texts.split(rendered.prompt), output, sampling, [rendered.model])
    return slot, rendered.model


def role_of(message: BaseMessage) -> str:
    """The chat template's role of a message (chunks count as their message kind)."""
    if isinstance(message, ChatMessage):
        return message.role
    for kind, role in ROLES:
        if isinstance(message, kind):
            return role
    raise ValueError(f"a Parrot chat model cannot send a {type(message).__name__}")


def text_of(message: BaseMessage) -> str:
    """The text of a message: its content, or the text blocks of a list content joined."""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for block in message.content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ValueError(f"a Parrot chat model takes text only, not a {kind!r} content block")
    return "".join(parts)


def usage_metadata(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageMetadata:
    """Token counts as LangChain's ``AIMessage.usage_metadata``."""
    return UsageMetadata(
        input_tokens=prompt_tokens,
        output_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        input_token_details=InputTokenDetails(cache_read=cached_tokens),
    )


def call_usage_metadata(usage: CallUsage) -> UsageMetadata:
    return usage_metadata(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def token_usage(usages: Iterable[CallUsage]) -> dict[str, int]:
    """Calls' usage summed, as ``llm_output["token_usage"]`` (OpenAI's names)."""
    usages = list(usages)
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    cached = sum(u.cached_tokens for u in usages)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cached_tokens": cached,
    }


def call_metadata(run: SessionRun, slot: TextSlot) -> dict[str, str | None]:
    """Where a generation ran on Parrot (for ``generation_info`` / ``response_metadata``)."""
    return {"parrot_session_id": run.session.session_id, "parrot_call_id": slot.call_id}
