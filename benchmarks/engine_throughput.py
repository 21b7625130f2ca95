"""Decode throughput of the builtin engine per weight mode, against transformers and llama.cpp.

One run measures, each side in a fresh process of its own:

- decode tokens/s at batch 1 / 4 / 16 / 64 of the engine in every mode (``DTYPE/WEIGHTS``:
  float32/exact, bfloat16/exact, float32/int8, float32/int4, float32/gguf; and
  float32/exact/torch, the exact mode without numpy's BLAS for its decode steps) and of
  transformers ``generate`` (float32), prefill excluded on both sides;
- the same batches as concurrent requests to two servers' ``/v1/completions``: ``parrot
  engine`` in the exact and the fastest mode, and llama.cpp's ``llama-server`` (built from
  source by ``make bench-peers`` into .peers/, 16 parallel slots) on the same GGUF with the same thread count;
  aggregate completion tokens/s over the wall time (prefill included on both sides);
- the batch-1 memory-bandwidth bound of the exact mode, shared-prefix decoding and
  continuous batching (exact mode; not in ``--quick``).

Prints the tables and writes them into docs/benchmarks.md.

    python benchmarks/engine_throughput.py [--quick] [--batches 1 4 16 64] [--modes ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section
from _servers import LLAMA_SERVER, completions_throughput, llama_server, parrot_server

from parrot.engines.builtin.batch import SharedPrefixPolicy
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.engines.builtin.model.loader import default_model_path
from parrot.wire.sampling import SamplingParams

PROMPT = (
    "<|im_start|>user\nTell me a long story about a lighthouse keeper number {i}.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# DTYPE/WEIGHTS[/CPU_MATMUL]: float32/exact/torch is the exact mode with torch's matmuls for
# every step, the baseline of float32/exact's BLAS steps (engines/builtin/model/blas_linear.py)
MODES = [
    "float32/exact",
    "float32/exact/torch",
    "bfloat16/exact",
    "float32/int8",
    "float32/int4",
    "float32/gguf",
]


def measure_bandwidth() -> float:
    """Bytes/s of a large read (a sum over a 1 GiB tensor), the best of three."""
    x = torch.ones(2**28, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


class EngineBench:
    def __init__(self, engine: BuiltinEngine) -> None:
        self.engine = engine
        self.ids = itertools.count(1)

    async def decode(self, batch: int, new_tokens: int) -> float:
        """Tokens/s of decoding ``batch`` sequences (prompts filled beforehand, not timed)."""
        contexts = [next(self.ids) for _ in range(batch)]
        await asyncio.gather(
            *(self.engine.fill(c, self.engine.tokenize(PROMPT.format(i=c))) for c in contexts)
        )
        sampling = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        results = await asyncio.gather(*(self.engine.generate(c, sampling) for c in contexts))
        elapsed = time.perf_counter() - start
        await asyncio.gather(*(self.engine.free_context(c) for c in contexts))
        assert all(len(r.token_ids) == new_tokens for r in results)
        return batch * new_tokens / elapsed

    async def requests(self, count: int, new_tokens: int, concurrent: bool) -> float:
        """Seconds to serve ``count`` fill + generate requests, all at once or one after another."""

        async def one(i: int) -> None:
            cid = next(self.ids)
            await self.engine.fill(cid, self.engine.tokenize(PROMPT.format(i=i)))
            sampling = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
            await self.engine.generate(cid, sampling)
            await self.engine.free_context(cid)

        start = time.perf_counter()
        if concurrent:
            await asyncio.gather(*(one(i) for i in range(count)))
        else:
            for i in range(count):
                await one(i)
        return time.perf_counter() - start

    async def shared_prefix(self, seqs: int, prefix: int, new_tokens: int, shared: bool) -> float:
        self.engine.core.runner.policy = SharedPrefixPolicy(enabled=shared)
        parent = next(self.ids)
        prefix_ids = (self.engine.tokenize("The lighthouse keeper wrote in his log. " * 200) * 4)[:prefix]
        await self.engine.fill(parent, prefix_ids)
        children = [next(self.ids) for _ in range(seqs)]
        await asyncio.gather(
            *(
                self.engine.fill(c, [100 + i, 200 + i], parent_context_id=parent)
                for i, c in enumerate(children)
            )
        )
        sampling = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        await asyncio.gather(*(self.engine.generate(c, sampling) for c in children))
        elapsed = time.perf_counter() - start
        await asyncio.gather(*(self.engine.free_context(c) for c in [*children, parent]))
        self.engine.core.runner.policy = SharedPrefixPolicy()
        return seqs * new_tokens / elapsed


def hf_decode(model, tokenizer, batch: int, new_tokens: int) -> float:
    tokenizer.padding_side = "left"
    prompts = [PROMPT.format(i=i) for i in range(batch)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        # Prefill is timed separately and subtracted so both sides report decode throughput.
        start = time.perf_counter()
        model.generate(
            **enc, do_sample=False, max_new_tokens=1, min_new_tokens=1, pad_token_id=tokenizer.eos_token_id
        )
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tokenizer.eos_token_id,
        )
        elapsed = time.perf_counter() - start - prefill
    return batch * (new_tokens - 1) / elapsed


def engine_part(args) -> dict:
    dtype, weights, *matmul = args.mode.split("/")
    config = EngineConfig(
        dtype=dtype,
        weights=weights,
        cpu_matmul=matmul[0] if matmul else "auto",
        kv_cache_bytes=4 * 2**30,
        num_threads=args.threads,
        scheduler=SchedulerConfig(max_batched_tokens=2048, max_running=64),
    )
    engine = BuiltinEngine(config)
    bench = EngineBench(engine)

    async def run() -> dict:
        await bench.decode(4, 8)  # warm-up
        decode = {}
        for batch in args.batches:
            decode[batch] = max([await bench.decode(batch, args.new_tokens) for _ in range(args.repeats)])
        result: dict = {"decode": decode}
        if args.extras:  # the exact mode: its bound, read in the same process right after
            result["bandwidth"] = measure_bandwidth()
        if args.extras:
            shared = [await bench.shared_prefix(32, 1024, args.new_tokens, True) for _ in range(args.repeats)]
            plain = [await bench.shared_prefix(32, 1024, args.new_tokens, False) for _ in range(args.repeats)]
            seq = [await bench.requests(16, args.new_tokens, False) for _ in range(args.repeats)]
            con = [await bench.requests(16, args.new_tokens, True) for _ in range(args.repeats)]
            result.update(shared=max(shared), plain=max(plain), sequential=min(seq), concurrent=min(con))
        return result

    result = asyncio.run(run())
    model = engine.model
    result["weight_bytes"] = sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers() if b.dtype in (torch.int8, torch.uint8)
    )
    result["model"] = engine.model_name
    result["folder"] = str(engine.model_folder)
    engine.stop()
    return result


def transformers_part(args) -> dict:
    import transformers

    torch.set_num_threads(args.threads)
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.model_folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model_folder)
    hf_decode(hf, tok, 2, 4)  # warm-up
    decode = {
        b: max(hf_decode(hf, tok, b, args.new_tokens) for _ in range(args.repeats)) for b in args.batches
    }
    return {"decode": decode}


def run_part(part: str, args, *extra: str) -> dict:
    """Each side runs in a fresh process of its own, so neither inherits the other's threads."""
    cmd = [sys.executable, __file__, "--part", part, "--new-tokens", str(args.new_tokens)]
    cmd += ["--repeats", str(args.repeats), "--threads", str(args.threads)]
    cmd += ["--batches", *map(str, args.batches), *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1], object_hook=_int_keys)


def _int_keys(d: dict) -> dict:
    return {int(k) if k.isdigit() else k: v for k, v in d.items()}


def server_rows(args, fastest: str) -> tuple[dict[str, dict[int, float]], list[str]]:
    """Aggregate /v1/completions tokens/s per server and batch, and notes on how they varied.

    All servers are up together; each batch size is measured on every server in turn, round
    after round, keeping each server's best: this machine's speed
    drifts by tens of percent over minutes (llama.cpp's batch 1 read 98, 141 and 151
    tokens/s in three runs), so servers measured minutes apart would be compared across
    drifts. The notes give the fastest mode's ratio to llama.cpp per round.
    """
    prompts = [PROMPT.format(i=i) for i in range(max(args.batches))]
    gguf = str(default_model_path())
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[str, str | None, dict]] = {}
        for mode in dict.fromkeys(["float32/exact", fastest]):
            dtype, weights = mode.split("/")[:2]
            url = stack.enter_context(parrot_server(dtype, weights, args.threads))
            servers[f"Parrot {mode}"] = (url, None, {"ignore_eos": True})
        if LLAMA_SERVER.exists():
            url = stack.enter_context(llama_server(gguf, args.threads))
            servers["llama.cpp"] = (url, gguf, {"ignore_eos": True})
        else:
            notes.append(f"llama.cpp column skipped: {LLAMA_SERVER} is not built (run `make bench-peers`).")
        rounds: list[dict[str, dict[int, float]]] = []
        for _ in range(args.repeats):
            measured: dict[str, dict[int, float]] = {name: {} for name in servers}
            for b in args.batches:  # each batch on every server in turn
                for name, (url, model, extra) in servers.items():
                    one = completions_throughput(url, model, prompts, [b], args.new_tokens, 1, extra)
                    measured[name][b] = one[b]
            rounds.append(measured)
    rows = {name: {b: max(r[name][b] for r in rounds) for b in args.batches} for name in servers}
    if "llama.cpp" in servers:
        ours = f"Parrot {fastest}"
        per_round = [
            ", ".join(f"batch {b} {r[ours][b] / r['llama.cpp'][b]:.2f}x" for b in args.batches[:2])
            for r in rounds
        ]
        notes.append(f"{ours} / llama.cpp per round: " + "; ".join(per_round) + ".")
    return rows, notes


def report(args) -> str:
    results = {}
    for mode in args.modes:
        extras = ["--extras"] if mode == "float32/exact" and not args.quick else []
        results[mode] = run_part("engine", args, "--mode", mode, *extras)
    exact = results.get("float32/exact") or next(iter(results.values()))
    theirs = run_part("transformers", args, "--model-folder", exact["folder"])
    fastest = max(results, key=lambda m: results[m]["decode"][args.batches[0]])
    lines = [
        "## Engine throughput (`benchmarks/engine_throughput.py`)",
        "",
        f"Machine: {machine()}. Model: {exact['model']}; greedy, {args.new_tokens} new tokens, best of "
        f"{args.repeats}; {args.threads} threads on every side; each side in a fresh process.",
        "",
        "Decode tokens/s in-process (prefill excluded), per mode `dtype/weights`, and transformers "
        "(float32); the last column is the fastest mode at batch 1 over transformers.",
        "",
        "| batch | " + " | ".join(args.modes) + " | transformers | " + f"{fastest} / transformers |",
        "| ---: | " + " | ".join("---:" for _ in args.modes) + " | ---: | ---: |",
    ]
    for b in args.batches:
        cells = " | ".join(f"{results[m]['decode'][b]:.1f}" for m in args.modes)
        hf = theirs["decode"][b]
        lines.append(f"| {b} | {cells} | {hf:.1f} | {results[fastest]['decode'][b] / hf:.2f}x |")
    rows, notes = server_rows(args, fastest)
    names = list(rows)
    ours = [n for n in names if n != "llama.cpp"] if "llama.cpp" in rows else []
    lines += [
        "",
        f"Through `/v1/completions` ({args.new_tokens} tokens per request, the batch sent at once; "
        "aggregate completion tokens/s over the wall time, prefill included; the servers up together "
        f"and measured in turn, best of {args.repeats} rounds). llama.cpp: `llama-server`, 16 "
        "parallel slots, continuous batching.",
        "",
        "| batch | " + " | ".join(names + [f"{n} / llama.cpp" for n in ours]) + " |",
        "| ---: | " + " | ".join("---:" for _ in names + ours) + " |",
    ]
    for b in args.batches:
        cells = [f"{rows[n][b]:.1f}" for n in names] + [
            f"{rows[n][b] / rows['llama.cpp'][b]:.2f}x" for n in ours
        ]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    for note in notes:
        lines += ["", note]
    if 1 in args.batches and "bandwidth" in exact:
        steps = exact["decode"][1]
        weight_bytes, bandwidth = exact["weight_bytes"], exact["bandwidth"]
        bound = bandwidth / weight_bytes
        lines += [
            "",
            f"Batch-1 memory bound (float32/exact): weights {weight_bytes / 1e6:.0f} MB; read bandwidth "
            f"read in the same process right after its decode figures (a sum over 1 GiB) "
            f"{bandwidth / 1e9:.1f} GB/s, so at most {bound:.1f} "
            f"steps/s; the engine runs {steps:.1f} steps/s = {steps / bound:.0%} of that bound.",
        ]
    if "shared" in exact:
        lines += extras_lines(exact, args.new_tokens)
    return "\n".join(lines)


def extras_lines(r: dict, new_tokens: int) -> list[str]:
    shared, plain, seq_s, con_s = r["shared"], r["plain"], r["sequential"], r["concurrent"]
    return [
        "",
        "| 32 seqs forked from one 1,024-token prefix, decode (float32/exact) | tok/s | ratio |",
        "| --- | ---: | ---: |",
        f"| shared-prefix attention | {shared:.1f} | {shared / plain:.2f}x |",
        f"| plain paged attention | {plain:.1f} | 1.00x |",
        "",
        f"| 16 requests (fill + {new_tokens} tokens each, float32/exact) | seconds | speed-up |",
        "| --- | ---: | ---: |",
        f"| concurrent (continuous batching) | {con_s:.2f} | {seq_s / con_s:.2f}x |",
        f"| one after another | {seq_s:.2f} | 1.00x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches 1 and 4, 32 tokens, one repeat")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--modes", nargs="+", default=MODES, help="dtype/weights pairs")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every side")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--part", choices=["engine", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--extras", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick and args.part is None:
        args.batches, args.new_tokens, args.repeats = [1, 4], 32, 1
    if args.part == "engine":
        print(json.dumps(engine_part(args)))
        return
    if args.part == "transformers":
        print(json.dumps(transformers_part(args)))
        return
    torch.set_num_threads(args.threads)  # so the machine line names the threads of every side
    table = report(args)
    print(table)
    if not args.no_write:
        # The comparison is at 2 threads; other counts keep a section of their own.
        write_section("engine-throughput" + ("" if args.threads == 2 else f"-{args.threads}-threads"), table)


if __name__ == "__main__":
    main()
