"""Decode throughput of the builtin engine against transformers ``generate``, in one run.

Cases: batch 1, 8 and 32 (64 new tokens, greedy) for both; the memory-bandwidth bound at
batch 1 (weight bytes / step time, against a bandwidth measured here); and 32 sequences
forked from one 1,024-token prefix, decoded with and without the shared-prefix attention
path. Prints a table and writes it into docs/benchmarks.md.

    python benchmarks/engine_throughput.py [--batches 1 8 32] [--new-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section

from parrot.engines.builtin.batch import SharedPrefixPolicy
from parrot.engines.builtin.config import EngineConfig
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.scheduler import SchedulerConfig
from parrot.engines.protocol.sampling import SamplingParams

PROMPT = (
    "<|im_start|>user\nTell me a long story about a lighthouse keeper number {i}.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


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
            *(self.engine.fill(c, [100 + i, 200 + i], parent) for i, c in enumerate(children))
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
    config = EngineConfig(
        dtype=args.dtype,
        kv_cache_bytes=4 * 2**30,
        scheduler=SchedulerConfig(max_batched_tokens=2048, max_running=64),
    )
    engine = BuiltinEngine(config)
    bench = EngineBench(engine)

    async def run() -> dict:
        await bench.decode(4, 8)  # warm-up
        decode = {}
        for batch in args.batches:
            decode[batch] = max([await bench.decode(batch, args.new_tokens) for _ in range(args.repeats)])
        shared = max(
            [await bench.shared_prefix(32, 1024, args.new_tokens, True) for _ in range(args.repeats)]
        )
        plain = max(
            [await bench.shared_prefix(32, 1024, args.new_tokens, False) for _ in range(args.repeats)]
        )
        sequential = min([await bench.requests(16, args.new_tokens, False) for _ in range(args.repeats)])
        concurrent = min([await bench.requests(16, args.new_tokens, True) for _ in range(args.repeats)])
        return {
            "decode": decode,
            "shared": shared,
            "plain": plain,
            "sequential": sequential,
            "concurrent": concurrent,
        }

    result = asyncio.run(run())
    result["weight_bytes"] = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    result["model"] = engine.model_name
    result["folder"] = str(engine.model_folder)
    engine.stop()
    return result


def transformers_part(args) -> dict:
    engine_folder = args.model_folder
    dtype = getattr(torch, args.dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine_folder, dtype=dtype).eval()
    tok = transformers.AutoTokenizer.from_pretrained(engine_folder)
    hf_decode(hf, tok, 2, 4)  # warm-up
    decode = {
        b: max(hf_decode(hf, tok, b, args.new_tokens) for _ in range(args.repeats)) for b in args.batches
    }
    return {"decode": decode, "bandwidth": measure_bandwidth()}


def run_part(part: str, args, *extra: str) -> dict:
    """Each side runs in a fresh process of its own, so neither inherits the other's threads."""
    cmd = [
        sys.executable,
        __file__,
        "--part",
        part,
        "--new-tokens",
        str(args.new_tokens),
        "--repeats",
        str(args.repeats),
        "--dtype",
        args.dtype,
        "--batches",
        *map(str, args.batches),
        *extra,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1], object_hook=_int_keys)


def _int_keys(d: dict) -> dict:
    return {int(k) if k.isdigit() else k: v for k, v in d.items()}


def report(args) -> str:
    ours = run_part("engine", args)
    theirs = run_part("transformers", args, "--model-folder", ours["folder"])
    lines = [
        "## Engine throughput (`benchmarks/engine_throughput.py`)",
        "",
        f"Machine: {machine()}. Model: {ours['model']}, {args.dtype} on both sides, "
        f"greedy, {args.new_tokens} new tokens, best of {args.repeats}; decode tokens/s (prefill "
        "excluded on both sides); each side in a fresh process of the same run.",
        "",
        "| case | Parrot engine tok/s | transformers tok/s | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for batch in args.batches:
        a, b = ours["decode"][batch], theirs["decode"][batch]
        lines.append(f"| batch {batch} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    shared, plain = ours["shared"], ours["plain"]
    lines += [
        "",
        "| 32 seqs forked from one 1,024-token prefix, decode | tok/s | ratio |",
        "| --- | ---: | ---: |",
        f"| shared-prefix attention | {shared:.1f} | {shared / plain:.2f}x |",
        f"| plain paged attention | {plain:.1f} | 1.00x |",
    ]
    seq_s, con_s = ours["sequential"], ours["concurrent"]
    lines += [
        "",
        f"| 16 requests (fill + {args.new_tokens} tokens each) | seconds | speed-up |",
        "| --- | ---: | ---: |",
        f"| concurrent (continuous batching) | {con_s:.2f} | {seq_s / con_s:.2f}x |",
        f"| one after another | {seq_s:.2f} | 1.00x |",
    ]
    if 1 in ours["decode"]:
        steps = ours["decode"][1]
        weight_bytes, bandwidth = ours["weight_bytes"], theirs["bandwidth"]
        bound = bandwidth / weight_bytes
        lines += [
            "",
            f"Batch-1 memory bound: weights {weight_bytes / 1e6:.0f} MB; read bandwidth measured here "
            f"(a sum over 1 GiB) {bandwidth / 1e9:.1f} GB/s, so at most {bound:.1f} steps/s; the engine "
            f"runs {steps:.1f} steps/s = {steps / bound:.0%} of that bound.",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--part", choices=["engine", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--model-folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "engine":
        print(json.dumps(engine_part(args)))
        return
    if args.part == "transformers":
        print(json.dumps(transformers_part(args)))
        return
    table = report(args)
    print(table)
    if not args.no_write:
        write_section(f"engine-throughput-{args.dtype}", table)


if __name__ == "__main__":
    main()
