"""The Triton paged attention kernels against SDPA (flash) on a GPU, decode and prefill.

Decode: 1-128 sequences x 1k-16k keys; prefill: one or a few sequences of 1k-16k causal
tokens. Each side attends the same keys: the kernels through a block table of scattered
16-key blocks, SDPA (flash backend, GQA) over the same keys stored contiguously. Each call
is captured in a CUDA graph and its replay timed with ``triton.testing.do_bench`` (CUDA
events, L2 flushed before every run, median), as an engine would replay it, in rounds with
the sides alternating (``timed_sides``: median and min-max of the rounds); the kernels are
also timed as plain Python calls ("eager": launch costs included). With ``--before DIR`` the
kernels of an earlier revision (a copy of ``engines/builtin/kernels`` as package
``kernels_before``) are timed too, eagerly (their wrappers sync, so they cannot be captured).

    python benchmarks/gpu_kernels.py [--heads 9/3x64 32/8x128] [--dtypes float16 bfloat16] [--before DIR]

A ``--before`` folder from a revision REV (the 2026-11-26 table used 296f707): each file of
REV's ``engines/builtin/kernels/`` into ``.gpu_before/kernels_before/``, with its imports of
``parrot.engines.builtin.kernels.`` renamed to ``kernels_before.`` (sed).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section

from parrot.engines.builtin.kernels.paged_decode import paged_decode_attention
from parrot.engines.builtin.kernels.paged_prefill import paged_prefill_batch

BLOCK = 16
SMOKE = False  # --smoke: on the CPU (Triton's interpreter), one call per side, no timing


ROUNDS = 3  # timing rounds per side, the sides' order reversed every other round


def _runnable(fn, graph: bool):
    """``fn``, or the replay of a CUDA graph of it (captured after two warm-up calls)."""
    if not graph:
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def timed_sides(sides: dict, rounds: int = ROUNDS) -> dict[str, tuple[float, float, float]]:
    """ms per call of each side ``name: (fn, graph)``: median (min, max) over ``rounds``
    rounds, the sides alternating. On a GPU each round is ``triton.testing.do_bench``'s median
    (CUDA events, L2 flushed before each run); on the CPU one call, after a warm-up."""
    if SMOKE:
        for fn, _ in sides.values():
            fn()
        return dict.fromkeys(sides, (1.0, 1.0, 1.0))
    cuda = torch.cuda.is_available()
    runs = {name: _runnable(fn, graph and cuda) for name, (fn, graph) in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            times[name].append(_once(runs[name], cuda))
    return {name: (statistics.median(t), min(t), max(t)) for name, t in times.items()}


def _once(run, cuda: bool) -> float:
    if cuda:
        import triton.testing

        return triton.testing.do_bench(run, warmup=10, rep=40, return_mode="median")
    run()
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def paged_copy(keys: torch.Tensor, gen: torch.Generator):
    """keys [seqs, kv_heads, L, d] -> (cache [blocks * BLOCK, kv_heads, d], table [seqs, L / BLOCK])
    with every sequence's blocks scattered through the cache in a random order."""
    seqs, kv_heads, length, d = keys.shape
    per_seq = length // BLOCK
    table = torch.randperm(seqs * per_seq, generator=gen).view(seqs, per_seq).to(keys.device)
    cache = torch.empty(seqs * per_seq * BLOCK, kv_heads, d, dtype=keys.dtype, device=keys.device)
    blocks = keys.permute(0, 2, 1, 3).reshape(seqs, per_seq, BLOCK, kv_heads, d)
    cache.view(seqs * per_seq, BLOCK, kv_heads, d)[table.flatten()] = blocks.flatten(0, 1)
    return cache, table.to(torch.int32).contiguous()


def sdpa(q, k, v, causal: bool):
    with sdpa_kernel(SDPBackend.MATH if SMOKE else SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def sdpa_inputs(k: torch.Tensor, v: torch.Tensor, heads: int):
    """The keys as SDPA's flash backend takes them: shared by a group of query heads where it
    supports GQA, else repeated per query head (outside the timing)."""
    global FLASH_GQA
    if FLASH_GQA is None:
        try:
            q = torch.randn(1, heads, 1, k.shape[-1], dtype=k.dtype, device=k.device)
            sdpa(q, k[:1, :, :16], v[:1, :, :16], False)
            FLASH_GQA = True
        except RuntimeError as exc:
            print("flash SDPA without GQA:", exc, flush=True)
            FLASH_GQA = False
    if FLASH_GQA:
        return k, v
    group = heads // k.shape[1]
    return k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)


FLASH_GQA: bool | None = None


def decode_case(seqs, length, heads, kv_heads, d, dtype, before):
    gen = torch.Generator().manual_seed(seqs * length)
    dev = "cpu" if SMOKE else "cuda"
    q = torch.randn(seqs, heads, d, dtype=dtype, device=dev)
    k = torch.randn(seqs, kv_heads, length, d, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    kc, table = paged_copy(k, gen)
    vc, _ = paged_copy(v, torch.Generator().manual_seed(seqs * length))
    lens = torch.full((seqs,), length, dtype=torch.int32, device=dev)
    scale = d**-0.5
    ours = lambda: paged_decode_attention(q, kc, vc, table, lens, BLOCK, scale, check_values=False)  # noqa: E731
    k_sdpa, v_sdpa = sdpa_inputs(k, v, heads)
    ref = lambda: sdpa(q.unsqueeze(2), k_sdpa, v_sdpa, False)  # noqa: E731
    err = rel_err(ours()[0], ref().squeeze(2))
    sides = {"sdpa": (ref, True), "graph": (ours, True), "eager": (ours, False)}
    if before is not None:
        old = lambda: before.paged_decode.paged_decode_attention(q, kc, vc, table, lens, BLOCK, scale)  # noqa: E731
        sides["old"] = (old, False)
    return {**timed_sides(sides), "err": err}


def prefill_case(seqs, length, heads, kv_heads, d, dtype, before):
    gen = torch.Generator().manual_seed(seqs + length)
    dev = "cpu" if SMOKE else "cuda"
    q = torch.randn(seqs, heads, length, d, dtype=dtype, device=dev)
    k = torch.randn(seqs, kv_heads, length, d, dtype=dtype, device=dev)
    v = torch.randn_like(k)
    kc, table = paged_copy(k, gen)
    vc, _ = paged_copy(v, torch.Generator().manual_seed(seqs + length))
    q_rows = q.permute(0, 2, 1, 3).reshape(seqs * length, heads, d).contiguous()  # the step's tokens
    scale = d**-0.5
    # What the engine launches: every sequence of the step at once.
    seq_rows = torch.tensor([[i * length, length, 0, 0] for i in range(seqs)], dtype=torch.int32, device=dev)
    out = torch.empty(seqs * length, heads, d, dtype=dtype, device=dev)
    lse = torch.empty(seqs * length, heads, dtype=torch.float32, device=dev)

    def ours():
        paged_prefill_batch(q_rows, kc, vc, table, seq_rows, length, out, lse, BLOCK, scale)
        return out

    def per_sequence(module):  # the earlier kernels: one launch per sequence
        return [
            module(
                q_rows[i * length : (i + 1) * length],
                kc,
                vc,
                table[i].contiguous(),
                0,
                0,
                length,
                BLOCK,
                scale,
            )
            for i in range(seqs)
        ]

    k_sdpa, v_sdpa = sdpa_inputs(k, v, heads)
    ref = lambda: sdpa(q, k_sdpa, v_sdpa, True)  # noqa: E731
    err = rel_err(ours().view(seqs, length, heads, d).transpose(1, 2), ref())
    sides = {"sdpa": (ref, True), "graph": (ours, True), "eager": (ours, False)}
    if before is not None:
        sides["old"] = (lambda: per_sequence(before.paged_prefill.paged_prefill_attention), False)
    return {**timed_sides(sides), "err": err}


DECODE_VARIANTS = [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2), (32, 4, 3)]  # TILE_N, warps, stages
PREFILL_VARIANTS = [  # BLOCK_M, TILE_N, warps, stages
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 128, 8, 3),
    (64, 64, 4, 3),
    (128, 64, 8, 4),
    (128, 32, 4, 3),
]


def sweep() -> list[str]:
    """Tile shapes, warps and pipeline stages of the two kernels on a few shapes."""
    from parrot.engines.builtin.kernels import paged_decode, paged_prefill

    lines = ["### Sweep: decode (TILE_N, warps, stages), Triton ms (graph)", ""]
    kept = paged_decode.TILE_N, paged_decode.NUM_WARPS, paged_decode.NUM_STAGES
    for shape, seqs, length in [
        ("32/8x128", 1, 16384),
        ("32/8x128", 32, 4096),
        ("32/8x128", 128, 16384),
        ("9/3x64", 8, 4096),
    ]:
        dims = _dims(shape)
        cells = []
        for variant in DECODE_VARIANTS:
            paged_decode.TILE_N, paged_decode.NUM_WARPS, paged_decode.NUM_STAGES = variant
            r = decode_case(seqs, length, *dims, torch.bfloat16, None)
            cells.append(f"{variant}: {r['graph'][0]:.3f} (SDPA {r['sdpa'][0]:.3f})")
        lines.append(f"- {shape} {seqs}x{length}: " + "; ".join(cells))
        print(lines[-1], flush=True)
    paged_decode.TILE_N, paged_decode.NUM_WARPS, paged_decode.NUM_STAGES = kept
    lines += ["", "### Sweep: prefill (BLOCK_M, TILE_N, warps, stages), Triton ms (graph)", ""]
    kept = paged_prefill.BLOCK_M, paged_prefill.TILE_N, paged_prefill.NUM_WARPS, paged_prefill.NUM_STAGES
    for shape, seqs, length in [
        ("9/3x64", 1, 4096),
        ("9/3x64", 1, 16384),
        ("32/8x128", 1, 4096),
        ("32/8x128", 1, 16384),
    ]:
        dims = _dims(shape)
        cells = []
        for variant in PREFILL_VARIANTS:
            paged_prefill.BLOCK_M, paged_prefill.TILE_N, paged_prefill.NUM_WARPS, paged_prefill.NUM_STAGES = (
                variant
            )
            try:
                r = prefill_case(seqs, length, *dims, torch.bfloat16, None)
                cells.append(f"{variant}: {r['graph'][0]:.3f} (SDPA {r['sdpa'][0]:.3f})")
            except Exception as exc:  # a variant that does not fit (shared memory): say so, go on
                cells.append(f"{variant}: {type(exc).__name__}")
        lines.append(f"- {shape} {seqs}x{length}: " + "; ".join(cells))
        print(lines[-1], flush=True)
    paged_prefill.BLOCK_M, paged_prefill.TILE_N, paged_prefill.NUM_WARPS, paged_prefill.NUM_STAGES = kept
    return lines


def _dims(shape: str) -> tuple[int, int, int]:
    heads, rest = shape.split("/")
    kv_heads, d = rest.split("x")
    return int(heads), int(kv_heads), int(d)


def table_lines(title, rows, before):
    lines = [
        f"### {title}",
        "",
        "| heads | dtype | seqs | keys | SDPA flash ms | Triton ms (graph) | SDPA / Triton "
        + "| Triton ms (eager) "
        + ("| before ms (eager) | before / now (eager) " if before else "")
        + "| rel. error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: "
        + ("| ---: | ---: " if before else "")
        + "| ---: |",
    ]
    for (shape, dtype, seqs, length), r in rows:
        line = (
            f"| {shape} | {dtype} | {seqs} | {length} | {ms_cell(r['sdpa'])} | {ms_cell(r['graph'])} "
            f"| {r['sdpa'][0] / r['graph'][0]:.2f}x | {ms_cell(r['eager'])} "
        )
        if before:
            line += f"| {ms_cell(r['old'])} | {r['old'][0] / r['eager'][0]:.2f}x "
        lines.append(line + f"| {r['err']:.1e} |")
    return lines


def ms_cell(timing: tuple[float, float, float]) -> str:
    """median (min-max)"""
    return f"{timing[0]:.3f} ({timing[1]:.3f}-{timing[2]:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=["9/3x64", "32/8x128"])
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--keys", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--prefill", nargs="+", default=["1x1024", "1x4096", "1x16384", "8x1024"])
    parser.add_argument("--before", type=Path, help="a folder holding a package kernels_before")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="only the variants of tiles, warps, stages")
    parser.add_argument("--smoke", action="store_true", help="tiny run on the CPU, under TRITON_INTERPRET=1")
    args = parser.parse_args()
    global SMOKE
    SMOKE = args.smoke
    before = None
    if args.before:
        sys.path.insert(0, str(args.before))
        before = importlib.import_module("kernels_before")
        importlib.import_module("kernels_before.paged_decode")
        importlib.import_module("kernels_before.paged_prefill")
    decode, prefill = [], []
    if args.sweep:
        print("\n".join(sweep()))
        return
    for shape in args.heads:
        dims = _dims(shape)
        for name in args.dtypes:
            dtype = getattr(torch, name)
            for seqs in args.seqs:
                for length in args.keys:
                    row = decode_case(seqs, length, *dims, dtype, before)
                    decode.append(((shape, name, seqs, length), row))
                    print("decode", shape, name, seqs, length, row, flush=True)
            for case in args.prefill:
                seqs, length = (int(x) for x in case.split("x"))
                row = prefill_case(seqs, length, *dims, dtype, before)
                prefill.append(((shape, name, seqs, length), row))
                print("prefill", shape, name, seqs, length, row, flush=True)
    lines = [
        "## Paged attention kernels against SDPA on a GPU (`benchmarks/gpu_kernels.py`)",
        "",
        f"Machine: {machine()}. One layer; heads are query/KV heads x head_dim; the kernels read "
        f"{BLOCK}-key blocks scattered through the cache, SDPA (flash backend, GQA) the same keys "
        "stored contiguously. Each round is the median of `triton.testing.do_bench` (L2 flushed "
        f"before each run) over CUDA-graph replays; {ROUNDS} rounds, the sides alternating; median "
        "(min-max) of the rounds, ratios of the medians. 'eager' times the Python call, launches "
        "included. SDPA / Triton above 1 means the kernel is faster; the target is 0.8x or more. "
        "The error is the relative Frobenius distance to SDPA's output.",
        "",
        *table_lines("Decode: one query token per sequence", decode, before),
        "",
        *table_lines("Prefill: causal, every key new", prefill, before),
    ]
    table = "\n".join(lines)
    if FLASH_GQA is False:
        table += "\n\nSDPA's flash backend took no GQA here: its keys were repeated per query head."
    print(table)
    if not (args.no_write or SMOKE):
        write_section("gpu-kernels-cuda", table)


if __name__ == "__main__":
    main()
