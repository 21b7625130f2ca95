"""Tool calling for ``ParrotChatModel.bind_tools``: LangChain tools and messages in
OpenAI's shapes for ``/v1/chat/completions``, and its answer back as an ``AIMessage``.

A chat with tools bound, or with tool turns in it (``ToolMessage``, an ``AIMessage`` with
``tool_calls``), runs on the server's OpenAI-compatible chat route, which renders the
tools into the prompt (the model's own tool syntax, or Parrot's generic one) and
constrains the answer to a text or a tool call; a plain chat stays a semantic call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_openai_messages
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from parrot.adapters.langchain.model_calls import usage_metadata
from parrot.sdk.chat import ChatReply

# The arguments of a model run that only the chat route takes.
TOOL_ARGS = ("tools", "tool_choice", "parallel_tool_calls")
CHOICES = ("auto", "none", "required")


def openai_tools(tools: Sequence[Any], strict: bool | None) -> list[dict[str, Any]]:
    """Each tool (a ``BaseTool``, a function, a pydantic class, a TypedDict, a dict) as an
    OpenAI function tool, converted by LangChain itself."""
    return [convert_to_openai_tool(tool, strict=strict) for tool in tools]


def openai_tool_choice(choice: Any, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any] | None:
    """LangChain's ``tool_choice`` as OpenAI's: ``auto`` / ``none`` / ``required`` (also
    ``any`` and True, as LangChain spells it), or the name of one tool (also a dict naming
    it) to call that tool."""
    if choice is None or choice is False:
        return None
    if choice is True or choice == "any":
        return "required"
    if isinstance(choice, Mapping):
        return dict(choice)
    if choice in CHOICES:
        return choice
    names = [t["function"]["name"] for t in tools]
    if choice not in names:
        raise ValueError(
            f"tool_choice {choice!r} is not a bound tool ({names}) nor one of {CHOICES} or 'any'"
        )
    return {"type": "function", "function": {"name": choice}}


def has_tool_turns(messages: Sequence[BaseMessage]) -> bool:
    """Whether the chat has a tool's result or an assistant's tool calls in it."""
    return any(isinstance(m, ToolMessage) or (isinstance(m, AIMessage) and m.tool_calls) for m in messages)


def openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The chat in OpenAI's shapes (tool results and assistant tool calls included)."""
    return convert_to_openai_messages(list(messages))


def chat_result(reply: ChatReply) -> ChatResult:
    """The answer as LangChain's result: an ``AIMessage`` whose ``tool_calls`` are parsed
    from the JSON arguments (a call whose arguments do not parse is in
    ``invalid_tool_calls``), with its usage and finish reason."""
    calls, invalid = [], []
    for call in reply.tool_calls:
        raw = call.message()
        try:
            calls.append(parse_tool_call(raw, return_id=True))
        except OutputParserException as error:
            invalid.append(make_invalid_tool_call(raw, str(error)))
    info = {"finish_reason": reply.finish_reason, "model_name": reply.model}
    usage, token_usage = None, {}
    if reply.usage is not None:
        u = reply.usage
        usage = usage_metadata(u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens)
        token_usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
        token_usage |= {
            "total_tokens": u.total_tokens,
            "cached_tokens": u.prompt_tokens_details.cached_tokens,
        }
    message = AIMessage(
        content=reply.content or "",
        tool_calls=calls,
        invalid_tool_calls=invalid,
        additional_kwargs={"tool_calls": [c.message() for c in reply.tool_calls]} if reply.tool_calls else {},
        response_metadata=info,
        usage_metadata=usage,
    )
    return ChatResult(
        generations=[ChatGeneration(message=message, generation_info=info)],
        llm_output={"token_usage": token_usage, "model_name": reply.model},
    )
