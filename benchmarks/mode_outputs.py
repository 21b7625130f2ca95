"""Greedy outputs of every weight mode on the parity test's prompts, written into the docs.

Not a test: the fast modes are not expected to match the exact mode token for token (their
logits are bounded by tests/engines/builtin/test_weight_formats.py); this records what they
generate so a reader can judge. Each mode runs in an engine of its own, one after another.

    python benchmarks/mode_outputs.py [--tokens 32] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write_section
from engine_throughput import MODES

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.wire.sampling import SamplingParams

# A mode's variant (DTYPE/WEIGHTS[/VARIANT]): engine_throughput.py's torch matmuls for the
# exact mode, and cpu_peer.py's torch-kernels (small steps without int8 activations)
VARIANTS = {"": {}, "torch": {"cpu_matmul": "torch"}, "torch-kernels": {"int8_activations": "off"}}

# The prompts of tests/engines/builtin/test_model_correctness.py
PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "def fibonacci(n):\n",
]


def outputs(mode: str, tokens: int) -> list[tuple[list[int], str]]:
    dtype, weights, *variant = mode.split("/")
    flags = VARIANTS[variant[0] if variant else ""]
    engine = BuiltinEngine(EngineConfig(dtype=dtype, weights=weights, **flags))

    async def run() -> list[tuple[list[int], str]]:
        results = []
        for i, prompt in enumerate(PROMPTS, start=1):
            await engine.fill(i, engine.tokenize(prompt))
            r = await engine.generate(i, SamplingParams(max_tokens=tokens, temperature=0.0))
            await engine.free_context(i)
            results.append((r.token_ids, r.text))
        return results

    try:
        return asyncio.run(run())
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--modes", nargs="+", default=[*MODES, "float32/gguf/torch-kernels"])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results = {mode: outputs(mode, args.tokens) for mode in args.modes}
    exact = results.get("float32/exact")
    lines = [
        "## Greedy outputs per mode (`benchmarks/mode_outputs.py`)",
        "",
        f"The parity test's prompts, greedy, at most {args.tokens} tokens. `same tokens` counts the "
        "leading tokens equal to the exact mode's (which equals transformers').",
    ]
    for p, prompt in enumerate(PROMPTS):
        lines += [
            "",
            f"Prompt {p + 1}: `{prompt!r}`",
            "",
            "| mode | same tokens | output |",
            "| --- | ---: | --- |",
        ]
        for mode, res in results.items():
            ids, text = res[p]
            same = "-"
            if exact is not None:
                ref = exact[p][0]
                same = next(
                    (i for i, (a, b) in enumerate(zip(ids, ref, strict=False)) if a != b),
                    min(len(ids), len(ref)),
                )
                same = f"{same}/{len(ref)}"
            shown = text.replace("|", "\\|").replace("\n", "⏎")
            lines.append(f"| {mode} | {same} | {shown} |")
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        write_section("mode-outputs", table)


if __name__ == "__main__":
    main()
