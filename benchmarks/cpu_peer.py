"""Parrot's engine against the real llama.cpp server on the CPU, through ``/v1/completions``.

The servers are started the same way (own process, 127.0.0.1, the same GGUF and thread
count) and stay up together; each round measures every batch size on every server, the
servers' order reversed from one round to the next, so a drift of the machine's speed
hits both sides alike. Reported: aggregate completion tokens/s (prefill included) per
server and batch, median and spread over the rounds, and the ratio of the medians.

The llama.cpp side is ``llama-server`` built from source by ``make bench-peers`` (with 16
parallel slots and continuous batching, as it serves concurrent requests); without it
the script says so and stops.

    python benchmarks/cpu_peer.py [--rounds 3] [--batches 1 4 16] [--modes gguf gguf/eager exact]

A mode is a ``--weights`` value; ``/eager`` runs it with ``--no-fused-decode`` (every decode
step op by op, as before the fused CPU step).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section
from _servers import LLAMA_SERVER, completions_throughput, llama_server, parrot_server
from spread import Spread

from parrot.engines.builtin.model.loader import default_model_path

PROMPT = (
    "<|im_start|>user\nTell me a long story about a lighthouse keeper number {i}.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def measure(args) -> dict[str, dict[int, Spread]]:
    gguf = str(default_model_path())
    prompts = [PROMPT.format(i=i) for i in range(max(args.batches))]
    runs: dict[str, dict[int, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[str, str | None]] = {}
        for mode in args.modes:
            weights, _, eager = mode.partition("/")  # gguf/eager: the fused decode step off
            flags = ["--no-fused-decode"] if eager else []
            url = stack.enter_context(parrot_server("float32", weights, args.threads, *flags))
            servers[f"Parrot {mode}"] = (url, None)
        url = stack.enter_context(llama_server(gguf, args.threads, slots=max(args.batches)))
        servers["llama.cpp"] = (url, gguf)
        runs = {name: {b: [] for b in args.batches} for name in servers}
        order = list(servers)
        for n in range(args.rounds):
            for b in args.batches:
                for name in order if n % 2 == 0 else order[::-1]:
                    url, model = servers[name]
                    extra = {"ignore_eos": True}
                    tps = completions_throughput(url, model, prompts, [b], args.new_tokens, 1, extra)[b]
                    runs[name][b].append(tps)
                    print(f"round {n + 1}: {name} batch {b}: {tps:.1f} tok/s", flush=True)
    return {name: {b: Spread(v) for b, v in per.items()} for name, per in runs.items()}


def table(args, results: dict[str, dict[int, Spread]]) -> str:
    ours = [name for name in results if name != "llama.cpp"]
    lines = [
        "## Parrot's engine against llama-server on the CPU (`benchmarks/cpu_peer.py`)",
        "",
        f"Machine: {machine()}. The bundled model's GGUF on both sides, {args.threads} threads each, "
        f"{args.new_tokens} tokens per request, greedy, the batch's requests sent at once; "
        "aggregate completion tokens/s over the wall time (prefill included), median (min-max) of "
        f"{args.rounds} rounds, the servers' order reversed each round. llama.cpp: `llama-server` "
        "built from source (`make bench-peers`), 16 parallel slots, continuous batching. Parrot modes "
        "are `--weights` values (float32 activations); `/eager`: with `--no-fused-decode`, every "
        "decode step op by op as before the fused CPU step.",
        "",
        "| batch | " + " | ".join(results) + " | " + " | ".join(f"{n} / llama.cpp" for n in ours) + " |",
        "| ---: | " + " | ".join("---:" for _ in [*results, *ours]) + " |",
    ]
    for b in args.batches:
        theirs = results["llama.cpp"][b]
        cells = [results[name][b].show(".1f") for name in results]
        for name in ours:
            mine = results[name][b]
            ratio = f"{mine.median / theirs.median:.2f}x"
            cells.append(ratio + (" (ranges overlap)" if mine.overlaps(theirs) else ""))
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--modes", nargs="+", default=["gguf", "gguf/eager", "exact"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--no-docs", action="store_true", help="print the table only")
    args = parser.parse_args()
    if not LLAMA_SERVER.exists():
        sys.exit(f"{LLAMA_SERVER} is not built: run `make bench-peers` first")
    body = table(args, measure(args))
    print(body)
    if not args.no_docs:
        write_section("cpu-peer", body)


if __name__ == "__main__":
    main()
