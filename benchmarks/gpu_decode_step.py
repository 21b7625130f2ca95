"""One decode step on a GPU: the builtin engine eager, as a CUDA graph, and transformers.

Two random-weight bfloat16 Llamas, built from their configs (no download): the bundled
default model's shape (SmolLM2-135M) and a 1B-class one (Llama 3.2 1B's shape). For batch
1, 8 and 64, each sequence holding 512 keys, one decode step is timed on each side with
CUDA events: the builtin engine's runner eager (``ModelRunner.run``: inputs, forward,
logits), the same runner replaying its captured graph, and ``transformers`` with a
``DynamicCache`` of the same length (cropped back after every call). Sides alternate in
rounds; the table gives the median (min-max) per step. Correctness: graph vs eager logits,
and the builtin engine's greedy token against transformers' per row (bfloat16 both).

    python benchmarks/gpu_decode_step.py            # CUDA: writes docs/benchmarks.md
    python benchmarks/gpu_decode_step.py --quick    # tiny shapes; runs on the CPU (no graphs)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.cuda_graphs import DEFAULT_SIZES, PAD_BLOCKS, DecodeGraphs
from parrot.engines.builtin.kv_cache import allocate_kv_cache
from parrot.engines.builtin.model.llama import LlamaForCausalLM
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model_runner import ModelRunner

SECTION = "gpu-decode-step-cuda"
BLOCK_SIZE = 16
GRAPH_MAX_LEN = 8192  # EngineConfig.cuda_graph_max_len's default: the graphs' table width
MODELS = {
    "SmolLM2-135M shape": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "1B Llama shape": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}
QUICK = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


class Side:
    """The builtin engine's pieces over one model: a pool of prefilled contexts and runners."""

    def __init__(self, hf, backend: str, device: torch.device, dtype: torch.dtype, num_blocks: int) -> None:
        with tempfile.TemporaryDirectory() as folder:
            hf.config.save_pretrained(folder)
            mc = ModelConfig.from_folder(Path(folder))
        attention = create_backend(backend, mc.num_heads, mc.num_kv_heads, mc.head_dim)
        with torch.device(device):
            self.model = LlamaForCausalLM(mc, attention).to(dtype)
        self.model.load_hf_state_dict(hf.state_dict())
        self.model.eval()
        cache = allocate_kv_cache(mc, num_blocks + PAD_BLOCKS, BLOCK_SIZE, dtype, device)
        self.pool = ContextPool(BlockManager(num_blocks, BLOCK_SIZE), cache)
        self.policy = SharedPrefixPolicy()
        self.eager = ModelRunner(self.model, self.pool, self.policy, device)
        self.contexts: list[Context] = []

    def prefill(self, prompts: torch.Tensor, next_ids: torch.Tensor, per_step: int = 8) -> None:
        """One context per prompt row, its prompt computed; ``next_ids`` appended, not computed."""
        for first in range(0, prompts.shape[0], per_step):
            items = []
            for row in range(first, min(first + per_step, prompts.shape[0])):
                ctx = Context(context_id=row)
                self.pool.contexts[row] = ctx
                self.pool.materialize(ctx)
                ctx.token_ids.extend([*prompts[row].tolist(), int(next_ids[row])])
                assert self.pool.ensure_blocks(ctx, len(ctx.token_ids)), "the benchmark's pool is too small"
                items.append(StepItem(ctx, 0, prompts.shape[1], sample=False))
                self.contexts.append(ctx)
            self.eager.run(items)
            for item in items:
                item.context.num_computed = item.num_tokens

    def decode_items(self, batch: int) -> list[StepItem]:
        """The first ``batch`` contexts decode their appended token (rewriting the same slot)."""
        return [StepItem(ctx, len(ctx.token_ids) - 1, 1, sample=True) for ctx in self.contexts[:batch]]

    def graph_runner(self, sizes: tuple[int, ...], max_len: int, capture: bool) -> ModelRunner:
        graphs = DecodeGraphs(self.model, self.pool, max_len, sizes, self.policy, capture=capture)
        return ModelRunner(self.model, self.pool, self.policy, self.pool.kv_cache.device, graphs)


def hf_model(dims: dict, device: torch.device, dtype: torch.dtype):
    config = transformers.LlamaConfig(**dims, attn_implementation="sdpa")
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(dtype).eval()


class HfDecode:
    """transformers' decode step over a DynamicCache of the prompts, cropped back after each call."""

    def __init__(self, hf, prompts: torch.Tensor, next_ids: torch.Tensor) -> None:
        self.hf = hf
        self.length = prompts.shape[1]
        self.next_ids = next_ids[:, None]
        with torch.inference_mode():
            self.cache = hf(prompts, use_cache=True, logits_to_keep=1).past_key_values
        self()
        assert self.cache.get_seq_length() == self.length, "the cache did not crop back"

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        logits = self.hf(self.next_ids, past_key_values=self.cache, use_cache=True).logits[:, -1]
        self.cache.crop(-1)  # back to the prompt (negative: tokens to drop, in every version)
        return logits


def timed(fn: Callable[[], object], reps: int, device: torch.device) -> list[float]:
    """Milliseconds per call: CUDA events on a GPU, the wall clock on the CPU."""
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def compare(sides: dict[str, Callable[[], object]], rounds: int, reps: int, device) -> dict[str, list[float]]:
    for fn in sides.values():  # warm-up
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            times[name] += timed(fn, reps, device)
    return times


def host_syncs(step: Callable[[], object]) -> str:
    """'none' when ``step`` makes no synchronizing CUDA call (torch's sync debug mode), else the error."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError as error:
        return f"yes: {str(error).splitlines()[0][:60]}"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return "none"


def cell(ms: list[float]) -> str:
    return f"{statistics.median(ms):.3f} ({min(ms):.3f}-{max(ms):.3f})"


def bench_model(
    name: str, dims: dict, batches: tuple[int, ...], sizes: tuple[int, ...], prompt_len: int, args
) -> list[str]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    started = time.perf_counter()
    hf = hf_model(dims, device, dtype)
    biggest = max(batches)
    blocks = biggest * (-(-(prompt_len + 1) // BLOCK_SIZE)) + 8
    side = Side(hf, "triton" if cuda else "torch", device, dtype, blocks)
    prompts = torch.randint(0, dims["vocab_size"], (biggest, prompt_len), device=device)
    next_ids = torch.randint(0, dims["vocab_size"], (biggest,), device=device)
    side.prefill(prompts, next_ids)
    max_len = min(dims["max_position_embeddings"], GRAPH_MAX_LEN)
    prefilled = time.perf_counter()
    graphed = side.graph_runner(sizes, max_len, capture=cuda)
    captured = time.perf_counter() - prefilled
    graph_name = "graph" if cuda else "padded (no graph)"
    built = time.perf_counter() - started
    rows = []
    for batch in batches:
        items = side.decode_items(batch)
        hf_step = HfDecode(hf, prompts[:batch], next_ids[:batch])
        eager_logits = side.eager.run(items).logits
        graph_logits = graphed.run(items).logits
        hf_logits = hf_step().float()
        assert graphed.whole_step.fits(items)
        syncs = "-" if not cuda else host_syncs(partial(graphed.run, items))
        times = compare(
            {"eager": partial(side.eager.run, items), graph_name: partial(graphed.run, items), "hf": hf_step},
            args.rounds,
            args.reps,
            device,
        )
        diff = (graph_logits - eager_logits).abs().max().item()
        same = (graph_logits.argmax(-1) == hf_logits.argmax(-1)).float().mean().item()
        off = (graph_logits - hf_logits).abs().max().item()
        eager_ms, graph_ms, hf_ms = (statistics.median(times[k]) for k in ("eager", graph_name, "hf"))
        rows.append(
            f"| {name} | {batch} | {cell(times['eager'])} | {cell(times[graph_name])} | {cell(times['hf'])} "
            f"| {hf_ms / graph_ms:.2f}x | {eager_ms / graph_ms:.2f}x | {diff:.2e} | {off:.2e} | {same:.0%} "
            f"| {syncs} |"
        )
        print(rows[-1], flush=True)
        del hf_step
    print(f"{name}: built, prefilled and captured in {built:.1f} s (capturing {sizes}: {captured:.1f} s)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test); writes no docs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10, help="timed calls per side per round")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.quick or not cuda:
        models, batches, sizes, prompt_len = {"tiny": QUICK}, (1, 3, 4), (1, 2, 4), 40
        args.rounds, args.reps = min(args.rounds, 2), min(args.reps, 3)
    else:
        models, batches, prompt_len = MODELS, (1, 8, 64), 512
        sizes = DEFAULT_SIZES  # what the engine captures at start
    started = time.perf_counter()
    rows = []
    for name, dims in models.items():
        rows += bench_model(name, dims, batches, sizes, prompt_len, args)
        if cuda:
            torch.cuda.empty_cache()  # the model's memory, freed on return
    graph = "graph" if cuda else "padded, no graph"
    table = "\n".join(
        [
            f"One decode step with {prompt_len} keys per sequence, bfloat16 random weights, milliseconds "
            f"median (min-max) of {args.rounds} x {args.reps} CUDA-event timings per side, sides "
            "alternating (`python benchmarks/gpu_decode_step.py`). eager: `ModelRunner.run` (inputs, "
            "forward, logits); graph: the same with the step replayed as a CUDA graph (the engine's "
            "default sizes captured, a table as wide as cuda_graph_max_len's default); hf: "
            "transformers (sdpa) with a DynamicCache of the same length. "
            "max abs: of the logits; agree: rows whose greedy token equals transformers' (random "
            "weights give near-ties, which bfloat16 rounding breaks either way, more so over a 128K "
            "vocabulary); host sync: "
            "what torch's sync debug mode saw during one graph step (`ModelRunner.run`).",
            "",
            f"| model | batch | eager ms | {graph} ms | transformers ms | hf / graph | eager / graph "
            "| max abs(graph - eager) | max abs(graph - hf) | agree | host sync in the graph step |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Machine: {machine()}; transformers {transformers.__version__}.",
        ]
    )
    if cuda and not args.quick:
        write_section(SECTION, table)
    print(f"\n(total {time.perf_counter() - started:.1f} s)\n")
    print(table)


if __name__ == "__main__":
    main()
