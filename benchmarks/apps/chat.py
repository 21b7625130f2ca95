"""Chat turns, written once for the workloads that have chat users (chatbot, mixed).

Parrot's side uses :func:`answer` (a semantic function in the model's ChatML); the
baseline sends the same turn as chat messages to ``/v1/chat/completions``, where the
engine applies the model's chat template. :func:`check_chat_template` makes sure the two
render the same text.
"""

from __future__ import annotations

import httpx

from benchmarks.apps.workload import prompt_of
from parrot.sdk import Input, Output, semantic_function


@semantic_function
def answer(system, question: Input, reply: Output):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    {{question}}<|im_end|>
    <|im_start|>assistant
    {{reply}}"""


def messages(system: str, question: str) -> list[dict[str, str]]:
    """The turn of :func:`answer` as chat messages."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def check_chat_template(engine_url: str, llama: bool = False) -> None:
    """The engine renders :func:`messages` exactly as :func:`answer`'s template does
    (its ``POST /render_chat`` applies the chat template of ``/v1/chat/completions``; a
    llama.cpp server's ``POST /apply-template``)."""
    system, question = "You are terse.", "Say one word."
    route = "/apply-template" if llama else "/render_chat"
    response = httpx.post(f"{engine_url}{route}", json={"messages": messages(system, question)}, timeout=60)
    response.raise_for_status()
    rendered = response.json()["prompt"] if llama else "".join(response.json()["pieces"])
    ours = prompt_of(answer.template, {"system": system, "question": question})
    if rendered != ours:
        raise RuntimeError(
            f"the engine's chat template renders {rendered!r}, the benchmark's template {ours!r}: "
            "the two sides would not send the same prompt"
        )
