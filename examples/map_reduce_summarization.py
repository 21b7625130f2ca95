"""Map-reduce summarization: every part of a text summarized on its own (the maps, which
the server batches), then one call combines all those summaries (the reduce).

The reduce takes a variable number of inputs, so it is submitted with the raw
``session.submit``: a template with one placeholder per map output. The maps and the
reduce are all submitted before anything is read; the server starts the reduce when the
last map has finished, and schedules the maps as one group that the reduce waits for.

    python examples/map_reduce_summarization.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from parrot.sdk.api import Client, Input, Output, semantic_function
from parrot.sdk.run import app_main

TEXT = Path(__file__).parent / "data" / "aesop.txt"


@semantic_function
def summarize(part: Input, summary: Output(max_tokens=16, temperature=0)):
    """<|im_start|>user
    Summarize this story in one sentence:
    {{part}}<|im_end|>
    <|im_start|>assistant
    {{summary}}"""


def reduce_template(count: int) -> str:
    lines = "\n".join(f"- {{{{part{i}}}}}" for i in range(count))
    return (
        "<|im_start|>user\nHere are summaries of some stories:\n"
        f"{lines}\nWhat do these stories teach together? Answer in one sentence.<|im_end|>\n"
        "<|im_start|>assistant\n{{moral}}"
    )


def main(server_url: str, max_parts: int | None = None) -> dict:
    """Summarize ``examples/data/aesop.txt`` (its first ``max_parts`` paragraphs)."""
    parts = [p.strip() for p in TEXT.read_text().split("\n\n") if p.strip()][:max_parts]
    with Client(server_url) as client, client.session() as session:
        maps = [summarize(part) for part in parts]
        reduce = session.submit(
            reduce_template(len(maps)),
            inputs={f"part{i}": summary for i, summary in enumerate(maps)},
            outputs={"moral": Output(max_tokens=24, temperature=0)},
        )
        moral = reduce.outputs["moral"]
        return {
            "moral": moral.get(),  # the only wait
            "reduce": msgspec.to_builtins(moral.call_info()),
            "maps": [{"summary": m.get(), "call": msgspec.to_builtins(m.call_info())} for m in maps],
        }


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
