"""A tool-using agent: the model answers a question by calling tools, and the application
runs them and sends their results back, until the model answers in text.

It uses the OpenAI-compatible chat route through the SDK (``client.chat``), with OpenAI's
own shapes: ``tools`` (function tools with JSON-schema parameters), assistant messages
with ``tool_calls``, and ``{"role": "tool", "tool_call_id": ...}`` results. The server
constrains each answer to a text or a call of an offered tool whose arguments match its
schema, so every call here parses and runs. (LangChain users get the same loop with
``ParrotChatModel.bind_tools``; see adapters/README.md.)

    python examples/tool_agent.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from parrot.sdk.api import Client, ToolCall
from parrot.sdk.run import app_main

QUESTION = "What is the weather in Paris, and what is 17 plus 25?"
SYSTEM = "You are an assistant that calls tools to answer. Use the results to answer briefly."


def get_weather(city: str) -> str:
    """A stand-in for a weather service."""
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})


def add(a: int, b: int) -> str:
    return str(a + b)


TOOLS: dict[str, tuple[Callable[..., str], dict[str, Any]]] = {
    "get_weather": (
        get_weather,
        {
            "description": "The weather in a city today.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 32}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    ),
    "add": (
        add,
        {
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    ),
}


def tool_specs() -> list[dict[str, Any]]:
    """The tools as OpenAI function tools."""
    return [{"type": "function", "function": {"name": name, **spec}} for name, (_, spec) in TOOLS.items()]


def run_tool(call: ToolCall) -> str:
    function, _ = TOOLS[call.name]
    return function(**call.args())


def main(server_url: str, question: str = QUESTION, max_turns: int = 4, max_tokens: int = 48) -> dict:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    calls = []
    with Client(server_url) as client:
        for turn in range(max_turns):
            # The first turn must call a tool; later turns choose (a tool or the answer).
            choice = "required" if turn == 0 else "auto"
            answer = client.chat(
                messages, tools=tool_specs(), tool_choice=choice, max_tokens=max_tokens, temperature=0
            )
            messages.append(answer.message())
            if not answer.tool_calls:
                break
            for call in answer.tool_calls:
                result = run_tool(call)
                calls.append({"name": call.name, "args": call.args(), "result": result})
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    final = messages[-1]
    return {
        "answer": final.get("content") if final["role"] == "assistant" else None,
        "tool_calls": calls,
        "turns": sum(m["role"] == "assistant" for m in messages),
        "messages": messages,
    }


if __name__ == "__main__":
    app_main(main)
