"""Decode attention with a shared prefix: shared-prefix path vs plain paged vs SDPA.

For a shared prefix of 1k / 4k tokens and 8 / 32 / 128 sequences, each with a 128-token
suffix of its own, one decode step of attention (one layer, the default model's head
shape) is timed three ways in one run: the shared-prefix path (prefix attended once for
all sequences, suffixes separately, merged by log-sum-exp), plain paged attention (each
sequence gathers its whole context), and torch SDPA over KV that is already contiguous
(the baseline). On a GPU the Triton kernels run, timed as CUDA-graph replays; on the CPU
the torch backend's paths. The sides alternate over ``--rounds`` rounds (median, min-max).

    python benchmarks/attention_kernels.py [--prefixes 1024 4096] [--seqs 8 32 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section
from gpu_kernels import ms_cell, timed_sides

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
SUFFIX = 128


def build(prefix: int, seqs: int, device: torch.device, dtype: torch.dtype):
    blocks_needed = prefix // BLOCK + seqs * (SUFFIX // BLOCK + 1) + 4
    cache = torch.randn(1, 2, blocks_needed * BLOCK, KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    pool = ContextPool(BlockManager(blocks_needed, BLOCK), cache)
    parent = Context(context_id=0, token_ids=list(range(prefix)), materialized=True)
    pool.contexts[0] = parent
    pool.ensure_blocks(parent, prefix)
    parent.num_computed = prefix
    items = []
    for i in range(seqs):
        child = Context(context_id=i + 1, parent=parent, parent_id=0)
        pool.materialize(child)
        child.token_ids.extend([7] * SUFFIX)
        pool.ensure_blocks(child, prefix + SUFFIX)
        child.num_computed = prefix + SUFFIX - 1  # decoding its last suffix token
        items.append(StepItem(child, child.num_computed, 1, sample=True))
    return pool, items


def case(prefix: int, seqs: int, rounds: int, device: torch.device, dtype: torch.dtype, backend_name: str):
    pool, items = build(prefix, seqs, device, dtype)
    backend = create_backend(backend_name, HEADS, KV_HEADS, HEAD_DIM)
    q = torch.randn(seqs, HEADS, HEAD_DIM, device=device, dtype=dtype)
    k = torch.randn(seqs, KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    v = torch.randn_like(k)
    kc, vc = pool.kv_cache[0, 0], pool.kv_cache[0, 1]
    shared = build_step(
        items, BLOCK, SharedPrefixPolicy(min_prefix_tokens=1, min_saved_tokens=0), device
    ).attention
    plain = build_step(items, BLOCK, SharedPrefixPolicy(enabled=False), device).attention
    assert shared.uses_shared_prefix and not plain.uses_shared_prefix
    out_shared = backend.forward(q, k, v, kc, vc, shared)
    out_plain = backend.forward(q, k, v, kc, vc, plain)
    torch.testing.assert_close(out_shared.float(), out_plain.float(), atol=2e-3, rtol=2e-3)
    # Baseline: SDPA over contiguous KV (gathered once, outside the timing).
    length = prefix + SUFFIX
    keys = torch.stack([kc[_slots(it.context.blocks, length)] for it in items]).transpose(1, 2)
    vals = torch.stack([vc[_slots(it.context.blocks, length)] for it in items]).transpose(1, 2)
    keys, vals = keys.contiguous(), vals.contiguous()  # [seqs, kv_heads, length, head_dim]
    sides = {
        "shared": (lambda: backend.forward(q, k, v, kc, vc, shared), True),
        "plain": (lambda: backend.forward(q, k, v, kc, vc, plain), True),
        "sdpa": (lambda: F.scaled_dot_product_attention(q.unsqueeze(2), keys, vals, enable_gqa=True), True),
    }
    return timed_sides(sides, rounds)  # ms, median (min, max) per side


def _slots(blocks: list[int], length: int) -> torch.Tensor:
    pos = torch.arange(length)
    return torch.tensor(blocks)[pos // BLOCK] * BLOCK + pos % BLOCK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--seqs", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--section", default="", help="suffix of the docs section (e.g. thresholds)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    backend = "triton" if device.type == "cuda" else "torch"
    lines = [
        "## Shared-prefix decode attention (`benchmarks/attention_kernels.py`)",
        "",
        f"Machine: {machine()}. Backend: {backend} ({dtype}), one layer, {HEADS} query / {KV_HEADS} KV "
        f"heads x {HEAD_DIM}, block {BLOCK}, each sequence with its own {SUFFIX}-token suffix; "
        + f"{args.rounds} rounds, the three sides alternating, median (min-max) of the rounds; "
        + (
            "a round: the median CUDA-graph replay of `do_bench` (L2 flushed)"
            if device.type == "cuda"
            else "a round: one call"
        )
        + ". Ratios (of the medians) are speed-ups over plain paged attention.",
        "",
        "| prefix | seqs | shared-prefix ms | plain paged ms | SDPA contiguous ms "
        "| shared speed-up over plain | plain / SDPA time |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for prefix in args.prefixes:
        for seqs in args.seqs:
            t = case(prefix, seqs, args.rounds, device, dtype, backend)
            s, p, d = t["shared"][0], t["plain"][0], t["sdpa"][0]
            lines.append(
                f"| {prefix} | {seqs} | {ms_cell(t['shared'])} | {ms_cell(t['plain'])} "
                f"| {ms_cell(t['sdpa'])} "
                f"| {p / s:.2f}x | {p / d:.2f}x |"
            )
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        write_section(f"attention-kernels-{device.type}{'-' + args.section if args.section else ''}", table)


if __name__ == "__main__":
    main()
