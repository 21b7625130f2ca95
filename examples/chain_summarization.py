"""Chain summarization: a long text summarized part by part, each step refining the summary
of the parts before it.

All steps are submitted at once, before any result is read: step n takes step n-1's output
Var as its input, so the server runs each step as soon as the previous one has generated,
with no round trip to this script. The script waits once, for the last summary.

    python examples/chain_summarization.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from parrot.sdk.api import Client, Input, Output, semantic_function
from parrot.sdk.run import app_main

TEXT = Path(__file__).parent / "data" / "aesop.txt"


@semantic_function
def summarize(part: Input, summary: Output(max_tokens=24, temperature=0)):
    """<|im_start|>system
    You write short, plain summaries.<|im_end|>
    <|im_start|>user
    Summarize this story in one sentence:
    {{part}}<|im_end|>
    <|im_start|>assistant
    {{summary}}"""


@semantic_function
def refine(previous: Input, part: Input, summary: Output(max_tokens=24, temperature=0)):
    """<|im_start|>system
    You write short, plain summaries.<|im_end|>
    <|im_start|>user
    The summary so far: {{previous}}
    The next story:
    {{part}}
    Write one summary of all the stories so far, in at most two sentences.<|im_end|>
    <|im_start|>assistant
    {{summary}}"""


def main(server_url: str, max_parts: int | None = None) -> dict:
    """Summarize ``examples/data/aesop.txt`` (its first ``max_parts`` paragraphs)."""
    parts = [p.strip() for p in TEXT.read_text().split("\n\n") if p.strip()][:max_parts]
    with Client(server_url) as client, client.session():  # calls below run in it
        steps = [summarize(parts[0])]
        for part in parts[1:]:
            steps.append(refine(steps[-1], part))  # depends on the previous step, on the server
        final = steps[-1].get()  # the only wait
        return {
            "parts": len(parts),
            "summary": final,
            "steps": [
                {"summary": step.get(), "call": msgspec.to_builtins(step.call_info())} for step in steps
            ],
        }


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
