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

A mode is a ``--weights`` value with a variant (``VARIANTS``): ``/eager`` runs it with
``--no-fused-decode`` (every decode step op by op, as before the fused CPU step);
``/bfloat16`` and ``/float32`` force the dtype of the dense copies that large steps run on
(``--dense-dtype``; by default the engine times both at start), ``/packed`` keeps none;
``/torch-kernels`` keeps small steps on torch's int4/int8 kernels (``--int8-activations off``;
by default the engine takes llama.cpp's int8 activations where they time faster at start).

``--sections prefill`` measures prompt processing instead: fresh prompts of 500, 1,500 and
4,000 tokens (``--lengths``; passages of the benchmark book behind a tag of their own, so no
cache on either side holds them), ``max_tokens`` 1, one request at a time, the servers
alternating; the time to the (first and only) token, median and spread.

``--before DIR`` adds the engine of another checkout (e.g. a git worktree of an earlier
commit, run with this venv) in its default mode, to show a change's effect beside the
peer in the same rounds.

``--cpu avx2`` measures what an AVX2-only CPU (no AVX-512, no native bfloat16) runs, on a
newer one: Parrot's engine starts with torch's and oneDNN's instruction sets lowered to AVX2
and its C++ step compiled for Haswell (``CPU_TARGETS``), llama.cpp is the build of ``make
bench-peers-avx2`` (``GGML_NATIVE=OFF``, AVX2 and FMA on, AVX-512 off). The machine line
says which CPU it was and what it emulated.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section
from _servers import LLAMA_SERVER, ROOT, completions_throughput, llama_server, parrot_server
from apps.text import Document, new_tag
from spread import Spread

from parrot.engines.builtin.model.cpu_paths import cpu_features
from parrot.engines.builtin.model.loader import default_model_path


@dataclass(frozen=True)
class CpuTarget:
    """The CPU the two servers run as: this one, or an older one emulated on it."""

    name: str
    env: dict[str, str]  # Parrot's engine's environment on top of this one's
    llama_server: Path

    def describe(self) -> str:
        real = f"{machine()}; CPU flags {', '.join(cpu_features().flags)}"
        if not self.env:
            return real
        lowered = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{real}; emulating {self.name}: Parrot with {lowered}, llama.cpp built for {self.name} only"


VARIANTS = {  # a mode's variant -> its engine flags
    "": [],
    "eager": ["--no-fused-decode"],
    "bfloat16": ["--dense-dtype", "bfloat16"],
    "float32": ["--dense-dtype", "float32"],
    "packed": ["--dense-rows", "0"],
    "torch-kernels": ["--int8-activations", "off"],
}

CPU_TARGETS = {
    "native": CpuTarget("native", {}, LLAMA_SERVER),
    "avx2": CpuTarget(
        "AVX2",
        {
            "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorized kernels
            "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's GEMMs (its bfloat16 ones need more)
            "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "PARROT_NATIVE_ARCH": "haswell",  # the fused C++ decode step
        },
        ROOT / ".peers" / "bin" / "llama-server-avx2",
    ),
}

PROMPT = (
    "<|im_start|>user\nTell me a long story about a lighthouse keeper number {i}.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


Servers = dict[str, tuple[str, str | None]]  # name -> (url, the model name to send or None)


def start_servers(stack, args, modes: list[str], slots: int, slot_ctx: int) -> Servers:
    """A Parrot engine per mode and a llama-server, all up until ``stack`` closes;
    ``args.paths`` is what the default mode chose."""
    gguf = str(default_model_path())
    servers: Servers = {}
    for mode in modes:
        weights, _, variant = mode.partition("/")
        flags = VARIANTS[variant]
        url = stack.enter_context(parrot_server("float32", weights, args.threads, *flags, env=args.env))
        servers[f"Parrot {mode}"] = (url, None)
        args.paths = args.paths if variant and args.paths else paths_of(url)
    if args.before:  # an earlier checkout's engine in its default mode, same venv and flags
        folder = Path(tempfile.mkdtemp(prefix="parrot-before-"))
        (folder / "parrot").symlink_to(Path(args.before).resolve())
        env = {**(args.env or os.environ), "PYTHONPATH": str(folder)}  # found before the editable install
        before = stack.enter_context(parrot_server("float32", "gguf", args.threads, env=env))
        servers["Parrot before"] = (before, None)
    binary = CPU_TARGETS[args.cpu].llama_server
    llama = stack.enter_context(llama_server(gguf, args.threads, slots, slot_ctx, binary))
    servers["llama.cpp"] = (llama, gguf)
    return servers


def measure(args) -> dict[str, dict[int, Spread]]:
    prompts = [PROMPT.format(i=i) for i in range(max(args.batches))]
    with contextlib.ExitStack() as stack:
        servers = start_servers(stack, args, args.modes, max(args.batches), 512)
        runs: dict[str, dict[int, list[float]]] = {name: {b: [] for b in args.batches} for name in servers}
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


def heading(args, what: str) -> tuple[str, str]:
    """A section's title, and the start of its setup paragraph (the machine, both sides)."""
    return (
        f"## {what} against llama-server on the CPU (`benchmarks/cpu_peer.py{args.flags}`)",
        f"Machine: {CPU_TARGETS[args.cpu].describe()}. Parrot's CPU paths: {args.paths}. The bundled "
        f"model's GGUF on both sides, {args.threads} threads each"
        + (f"; `Parrot before`: the engine of {args.before}. " if args.before else ", "),
    )


def table(args, results: dict[str, dict[int, Spread]]) -> str:
    ours = [name for name in results if name != "llama.cpp"]
    title, setup = heading(args, "Parrot's engine")
    lines = [
        title,
        "",
        setup
        + f"{args.new_tokens} tokens per request, greedy, the batch's requests sent at once; "
        "aggregate completion tokens/s over the wall time (prefill included), median (min-max) of "
        f"{args.rounds} rounds, the servers' order reversed each round. llama.cpp: `llama-server` "
        "built from source (`make bench-peers`), 16 parallel slots, continuous batching. Parrot modes "
        "are `--weights` values (float32 activations); `/eager`: with `--no-fused-decode`, every "
        "decode step op by op as before the fused CPU step; `/torch-kernels`: `--int8-activations off`, "
        "small steps on torch's int4/int8 kernels (before issue 40).",
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


def measure_prefill(args) -> dict[str, dict[int, Spread]]:
    """Seconds to the first token of a fresh prompt of each length, per server."""
    with contextlib.ExitStack() as stack:
        servers = start_servers(stack, args, args.prefill_modes, 1, max(args.lengths) + 512)
        runs: dict[str, dict[int, list[float]]] = {name: {} for name in servers}
        book = Document.load(servers[f"Parrot {args.prefill_modes[0]}"][0])
        rng = random.Random("cpu-peer-prefill")
        for url, model in servers.values():  # warm-up: the first request sets kernels up
            time_to_first_token(url, model, f"{new_tag()} Warm up.")
        order = list(servers)
        for n in range(args.rounds):
            for length in args.lengths:
                (text,) = book.passages(rng, 1, length - 16)  # room for the tag and the frame
                for name in order if n % 2 == 0 else order[::-1]:
                    url, model = servers[name]
                    prompt = f"Note {new_tag()}:\n{text}\nSummary:"
                    seconds = time_to_first_token(url, model, prompt)
                    runs[name].setdefault(length, []).append(seconds)
                    print(f"round {n + 1}: {name} {length} tokens: {seconds:.2f} s", flush=True)
    return {name: {k: Spread(v) for k, v in per.items()} for name, per in runs.items()}


def time_to_first_token(url: str, model: str | None, prompt: str) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, **({"model": model} if model else {})}
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=3600)
    r.raise_for_status()
    return time.perf_counter() - start


def paths_of(url: str) -> str:
    """What a Parrot engine's ``/ping`` says of its CPU and the product its prompts run on."""
    cpu = httpx.get(f"{url}/ping", timeout=10).json()["cpu"]
    dense = cpu["dense_copy"]
    times = ", ".join(f"{k} {v} ms" for k, v in dense["ms"].items())
    bf16 = "native bfloat16" if cpu["onednn_bf16"] else "no native bfloat16"
    small = cpu["int8_activations"]
    ints = f"int8 activations up to {small['rows']} rows ({small['reason']})"
    prompts = f"prompts on {dense['dtype']} copies ({dense['reason']}: {times})"
    return f"torch at {cpu['isa']}, {bf16}; {prompts}; {ints}"


def prefill_table(args, results: dict[str, dict[int, Spread]]) -> str:
    ours = [name for name in results if name != "llama.cpp"]
    title, setup = heading(args, "Prompt processing")
    lines = [
        title,
        "",
        setup
        + "all servers up together; a fresh prompt of each length (a passage of the benchmark book "
        "behind a tag of its own), `max_tokens` 1, one request at a time, the servers' order "
        "reversed each round; "
        f"seconds to the token, median (min-max) of {args.rounds} rounds. llama.cpp: one slot. Parrot "
        "modes as in the decode table (`gguf`: the default; `/bfloat16`, `/float32`: the dense copies' "
        "dtype forced; `/packed`: no copies, every row on the int4 kernel).",
        "",
        "| prompt tokens | "
        + " | ".join([*(f"{n} s" for n in results), *(f"{n} tok/s" for n in results)])
        + " | "
        + " | ".join(f"{n} / llama.cpp" for n in ours)
        + " |",
        "| ---: | " + " | ".join("---:" for _ in [*results, *results, *ours]) + " |",
    ]
    for length in args.lengths:
        theirs = results["llama.cpp"][length]
        cells = [results[n][length].show() for n in results]
        cells += [f"{length / results[n][length].median:.0f}" for n in results]
        for name in ours:
            mine = results[name][length]
            overlap = " (ranges overlap)" if mine.overlaps(theirs) else ""
            cells.append(f"{theirs.median / mine.median:.2f}x{overlap}")
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--modes", nargs="+", default=["gguf", "gguf/eager", "exact"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--no-docs", action="store_true", help="print the table only")
    parser.add_argument("--sections", nargs="+", choices=["decode", "prefill"], default=["decode", "prefill"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[500, 1500, 4000], help="prefill prompts")
    parser.add_argument("--prefill-modes", nargs="+", default=["gguf"], help="e.g. gguf gguf/bfloat16")
    parser.add_argument("--cpu", choices=sorted(CPU_TARGETS), default="native", help="the CPU to run as")
    parser.add_argument("--before", help="an earlier commit's checkout: its engine joins as 'Parrot before'")
    args = parser.parse_args()
    target = CPU_TARGETS[args.cpu]
    if not target.llama_server.exists():
        make = "make bench-peers" + ("" if args.cpu == "native" else f"-{args.cpu}")
        sys.exit(f"{target.llama_server} is not built: run `{make}` first")
    args.paths = ""
    args.env = {**os.environ, **target.env} if target.env else None
    args.flags = "" if args.cpu == "native" else f" --cpu {args.cpu}"
    suffix = "" if args.cpu == "native" else f"-{args.cpu}"
    if "prefill" in args.sections:
        body = prefill_table(args, measure_prefill(args))
        print(body)
        if not args.no_docs:
            write_section(f"cpu-peer-prefill{suffix}", body)
    if "decode" in args.sections:
        body = table(args, measure(args))
        print(body)
        if not args.no_docs:
            write_section(f"cpu-peer{suffix}", body)


if __name__ == "__main__":
    main()
