"""Profile of one decode step of the builtin engine's model (torch.profiler), per weight mode.

Builds the default model as the engine does, fills ``--batch`` contexts, decodes a few
steps to warm up, then profiles ``--steps`` decode steps and prints the ops by self CPU
time, the number of ops per step and the step time. Speed is noisy on a shared machine:
read the op counts and the shares, not the absolute times.

    python benchmarks/decode_profile.py [--batch 1] [--dtype float32] [--weights exact] [--no-fused-decode]
    python benchmarks/decode_profile.py --batch 8 --contexts 32 512 1024   # step times only

``--contexts`` times the steps over contexts of those lengths (attention's share grows with
them), best of 3 runs of ``--steps`` steps each, and prints one line per length instead of
a profile. With ``PYTHONPATH`` at a folder whose ``parrot`` links to another checkout, the
same script times that checkout's engine (as ``benchmarks/cpu_peer.py --before`` does).

Steps run as the engine runs them: fused (one C++ call, fused_decode.py) where the model
allows, unless ``--no-fused-decode``; the profiler then sees the ATen ops inside the call.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.fused_decode import fused_decode_step
from parrot.engines.builtin.kv_cache import allocate_kv_cache
from parrot.engines.builtin.model.build import build_model
from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model_runner import ModelRunner


def make_runner(config: EngineConfig, num_blocks: int = 512) -> ModelRunner:
    folder = resolve_model_folder(config.model, Path(config.cache_dir or default_cache_dir()))
    mc = ModelConfig.from_folder(folder)
    backend = create_backend("torch", mc.num_heads, mc.num_kv_heads, mc.head_dim)
    model = build_model(config, mc, folder, backend)
    cache = allocate_kv_cache(mc, num_blocks, config.block_size, config.torch_kv_dtype(), torch.device("cpu"))
    pool = ContextPool(BlockManager(num_blocks, config.block_size), cache)
    fused = fused_decode_step(model, pool, config, torch.device("cpu"))  # as the engine does
    return ModelRunner(model, pool, SharedPrefixPolicy(), torch.device("cpu"), fused)


def decode_steps(runner: ModelRunner, contexts: list[Context], steps: int) -> float:
    """Seconds per greedy decode step over ``contexts`` (each already computed)."""
    start = time.perf_counter()
    for _ in range(steps):
        items = []
        for ctx in contexts:
            runner.pool.ensure_blocks(ctx, len(ctx.token_ids))
            items.append(StepItem(ctx, ctx.num_computed, len(ctx.token_ids) - ctx.num_computed, True))
        output = runner.run(items)
        for n, ctx in enumerate(contexts):  # what the engine's postprocess step records
            runner.pool.computed(ctx, len(ctx.token_ids), output.last_hidden[n])
        for ctx, token in zip(contexts, output.logits.argmax(-1).tolist(), strict=True):
            runner.pool.append_token(ctx, token)
    return (time.perf_counter() - start) / steps


def prepare(runner: ModelRunner, batch: int, prompt_len: int = 32) -> list[Context]:
    contexts = []
    for i in range(batch):
        ctx = Context(context_id=i + 1, token_ids=[(7 * i + j) % 1000 + 10 for j in range(prompt_len)])
        ctx.materialized = True
        runner.pool.contexts[ctx.context_id] = ctx
        contexts.append(ctx)
    decode_steps(runner, contexts, 1)  # prefill + first token
    return contexts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights", default="exact")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--no-fused-decode", action="store_true", help="every step op by op")
    parser.add_argument("--contexts", type=int, nargs="+", help="time steps over contexts of these lengths")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = EngineConfig(dtype=args.dtype, weights=args.weights, fused_decode=not args.no_fused_decode)
    if args.contexts:
        runner = make_runner(config, num_blocks=args.batch * (max(args.contexts) + 4 * args.steps) // 16 + 64)
        for length in args.contexts:
            contexts = prepare(runner, args.batch, length)
            decode_steps(runner, contexts, 2)  # warm-up
            best = min(decode_steps(runner, contexts, args.steps) for _ in range(3))
            print(f"batch {args.batch}, context {length}: {best * 1e3:.1f} ms per step", flush=True)
            for ctx in contexts:
                runner.pool.free(ctx)
        return
    runner = make_runner(config)
    contexts = prepare(runner, args.batch)
    decode_steps(runner, contexts, 5)  # warm-up
    plain = decode_steps(runner, contexts, args.steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_steps(runner, contexts, args.steps)
    events = prof.key_averages()
    ops = sum(e.count for e in events if e.key.startswith("aten::")) / args.steps
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(
        f"batch {args.batch}, {args.dtype}/{args.weights} ({'fused' if runner.whole_step else 'eager'}): "
        f"{plain * 1e3:.1f} ms per step unprofiled, "
        f"{ops:.0f} aten ops per step (nested ops counted)"
    )


if __name__ == "__main__":
    main()
