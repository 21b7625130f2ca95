"""Tool-calling accuracy in the model's own syntax against Parrot's generic one (issue 36 §2).

A fixed set of tool-calling prompts (below: six tools, each prompt with the call a good answer
makes), sent with the real ``openai`` client to two ``parrot engine`` processes on the same
model: ``--tool-format auto`` (the model's own syntax, where its chat template writes one) and
``--tool-format generic``. Greedy, ``tool_choice`` ``required`` (which call) and ``auto``
(whether to call at all: some prompts need no tool). A call is right when it names the
expected tool and its arguments hold the expected values (strings compared without case or
surrounding spaces). A model whose template has no tool syntax (the bundled SmolLM2) runs the
generic format only: the comparison needs a model trained for tools, e.g.

    python benchmarks/tool_accuracy.py                              # the bundled model
    python benchmarks/tool_accuracy.py --model Qwen/Qwen2.5-1.5B-Instruct
    python benchmarks/tool_accuracy.py --model "$(python benchmarks/tool_model.py)" --label qwen2.5-coder-0.5b

(a hub id is fetched into the hub's cache once: it needs the network, or the files cached.)
The table goes to docs/benchmarks.md (section ``tool-accuracy``, or ``tool-accuracy-LABEL``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from _report import machine, write_section
from _servers import free_port, launched, parrot_command


def tool(name: str, description: str, **properties: dict) -> dict:
    required = [k for k, v in properties.items() if not v.pop("optional", False)]
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TEXT, NUMBER = {"type": "string", "maxLength": 40}, {"type": "number"}
TOOLS = [
    tool("get_weather", "The weather in a city today.", city=dict(TEXT)),
    tool("add", "Add two numbers.", a=dict(NUMBER), b=dict(NUMBER)),
    tool(
        "convert_currency",
        "Convert an amount of money.",
        amount=dict(NUMBER),
        source=dict(TEXT),
        target=dict(TEXT),
    ),
    tool("set_timer", "Set a timer.", minutes=dict(NUMBER)),
    tool("search_web", "Search the web for a query.", query=dict(TEXT)),
    tool("send_email", "Send an email.", to=dict(TEXT), subject=dict(TEXT)),
]


@dataclass(frozen=True)
class Case:
    prompt: str
    name: str | None  # the tool to call (None: answer in text)
    arguments: dict[str, Any]


CASES = [
    Case("What is the weather in Oslo?", "get_weather", {"city": "Oslo"}),
    Case("Is it raining in Lisbon right now?", "get_weather", {"city": "Lisbon"}),
    Case("Tell me today's weather for Tokyo.", "get_weather", {"city": "Tokyo"}),
    Case("What is 17 plus 25?", "add", {"a": 17, "b": 25}),
    Case("Add 3 and 4 for me.", "add", {"a": 3, "b": 4}),
    Case("Compute 120 + 80.", "add", {"a": 120, "b": 80}),
    Case("Convert 100 USD to EUR.", "convert_currency", {"amount": 100, "source": "USD", "target": "EUR"}),
    Case("How many yen is 50 euros?", "convert_currency", {"amount": 50, "source": "EUR", "target": "JPY"}),
    Case("Set a timer for 10 minutes.", "set_timer", {"minutes": 10}),
    Case("Remind me in 25 minutes with a timer.", "set_timer", {"minutes": 25}),
    Case("Search the web for the tallest lighthouse in Europe.", "search_web", {}),
    Case("Look up the population of Iceland online.", "search_web", {}),
    Case(
        "Email bob@example.com with the subject Lunch.",
        "send_email",
        {"to": "bob@example.com", "subject": "Lunch"},
    ),
    Case("Send an email to ana@example.org titled Report.", "send_email", {"to": "ana@example.org"}),
    Case("Say hello in French.", None, {}),
    Case("What is the capital of Italy? Answer from memory.", None, {}),
]
SYSTEM = "You are a helpful assistant. Use a tool when one helps; otherwise answer briefly."


def same(got: Any, want: Any) -> bool:
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().lower() == want.lower()
    return isinstance(got, (int, float)) and not isinstance(got, bool) and float(got) == float(want)


def judge(case: Case, message) -> str:
    """``right``, ``wrong tool``, ``wrong arguments``, ``no call`` or ``called`` (a prompt
    that needs no tool, under ``auto``)."""
    calls = message.tool_calls or []
    if case.name is None:
        return "right" if not calls else "called"
    if not calls:
        return "no call"
    call = calls[0]
    if call.function.name != case.name:
        return "wrong tool"
    arguments = json.loads(call.function.arguments or "{}")
    if not all(same(arguments.get(k), v) for k, v in case.arguments.items()):
        return "wrong arguments"
    return "right"


def run(url: str, model: str, choice: str, max_tokens: int) -> tuple[dict[str, int], float]:
    cases = [c for c in CASES if choice == "auto" or c.name is not None]
    outcomes: dict[str, int] = {}
    start = time.perf_counter()
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600) as oai:
        for case in cases:
            answer = oai.chat.completions.create(
                model=model,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": case.prompt}],
                tools=TOOLS,
                tool_choice=choice,
                max_tokens=max_tokens,
                temperature=0,
            )
            verdict = judge(case, answer.choices[0].message)
            outcomes[verdict] = outcomes.get(verdict, 0) + 1
    return outcomes, time.perf_counter() - start


def engine(model: str | None, tool_format: str):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = parrot_command("engine", "--port", str(port), "--tool-format", tool_format)
    if model:
        cmd += ["--model", model]

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json()["status"] == "ok"

    return launched(cmd, ready, f"parrot engine ({tool_format})", timeout_s=900), url


def syntax_of(url: str) -> str:
    """The tool syntax the engine renders tools in (its /render_chat answer names it)."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS[:1]}
    return httpx.post(f"{url}/render_chat", json=body, timeout=60).json()["tool_syntax"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default=None, help="a hub id, a model folder or a .gguf (default: bundled)"
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--label", default=None, help="docs section tool-accuracy-LABEL")
    args = parser.parse_args()
    described = Path(args.model).name if args.model else "the bundled SmolLM2-135M-Instruct (GGUF)"
    rows: list[str] = []
    for tool_format in ("auto", "generic"):
        launch, url = engine(args.model, tool_format)
        with launch:
            syntax = syntax_of(url)
            if tool_format == "auto" and syntax == "generic":
                print("the model's template writes no tool syntax Parrot knows: the generic format only")
                continue
            model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
            for choice in ("required", "auto"):
                outcomes, seconds = run(url, model, choice, args.max_tokens)
                total = sum(outcomes.values())
                detail = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()) if k != "right")
                right = outcomes.get("right", 0)
                share = f"{right}/{total} ({right / total:.2f})"
                rows.append(f"| {syntax} | {choice} | {share} | {detail or '-'} | {seconds:.1f} |")
                print(rows[-1], flush=True)
    body = "\n".join(
        [
            f"Machine: {machine()}. Model: {described}; {len(CASES)} prompts (14 with a call to",
            f"make, 2 without), {len(TOOLS)} tools, greedy, `max_tokens` {args.max_tokens}, one request at a",
            "time (`benchmarks/tool_accuracy.py`). right: the expected tool, with the expected values.",
            "",
            "| tool syntax | tool_choice | right | otherwise | s (all prompts) |",
            "| --- | --- | ---: | --- | ---: |",
            *rows,
        ]
    )
    write_section(f"tool-accuracy-{args.label}" if args.label else "tool-accuracy", body)


if __name__ == "__main__":
    main()
