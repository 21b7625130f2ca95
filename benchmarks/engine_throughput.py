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


async def main_async(args) -> str:
    config = EngineConfig(
        kv_cache_bytes=4 * 2**30,
        scheduler=SchedulerConfig(max_batched_tokens=2048, max_running=64),
    )
    engine = BuiltinEngine(config)
    engine.start()
    bench = EngineBench(engine)
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.model_folder, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(engine.model_folder)
    await bench.decode(4, 8)  # warm-up
    hf_decode(hf, tok, 2, 4)

    rows = []
    for batch in args.batches:
        ours = max([await bench.decode(batch, args.new_tokens) for _ in range(args.repeats)])
        theirs = max(hf_decode(hf, tok, batch, args.new_tokens) for _ in range(args.repeats))
        rows.append((batch, ours, theirs))

    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    bandwidth = measure_bandwidth()
    step_s = 1.0 / rows[0][1] if rows and rows[0][0] == 1 else None

    shared = max([await bench.shared_prefix(32, 1024, args.new_tokens, True) for _ in range(args.repeats)])
    plain = max([await bench.shared_prefix(32, 1024, args.new_tokens, False) for _ in range(args.repeats)])
    engine.stop()

    lines = [
        "## Engine throughput (`benchmarks/engine_throughput.py`)",
        "",
        f"Machine: {machine()}. Model: {engine.model_name}, float32, greedy, {args.new_tokens} new tokens, "
        f"best of {args.repeats}. Decode tokens/s (prefill excluded on both sides).",
        "",
        "| case | Parrot engine tok/s | transformers tok/s | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for batch, ours, theirs in rows:
        lines.append(f"| batch {batch} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x |")
    lines += [
        "",
        "| shared prefix: 32 seqs x 1,024-token prefix | tok/s | ratio |",
        "| --- | ---: | ---: |",
        f"| shared-prefix attention | {shared:.1f} | {shared / plain:.2f}x |",
        f"| plain paged attention | {plain:.1f} | 1.00x |",
    ]
    if step_s is not None:
        achieved = weight_bytes / step_s
        lines += [
            "",
            f"Batch-1 memory bound: weights {weight_bytes / 1e6:.0f} MB, measured read bandwidth "
            f"{bandwidth / 1e9:.1f} GB/s -> bound {bandwidth / weight_bytes:.1f} steps/s; engine "
            f"{1 / step_s:.1f} steps/s = {achieved / bandwidth:.0%} of the bound.",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    table = asyncio.run(main_async(args))
    print(table)
    if not args.no_write:
        write_section("engine-throughput", table)


if __name__ == "__main__":
    main()
