"""Options for the CPU decode step, each measured against the default in the same process.

Every option is a model built the way the engine builds it, decoding the same contexts;
rounds alternate the options' order, and each figure is the median (min-max) of the
rounds' ms per decode step. Options (``dtype/weights[/variant]``):

- ``float32/gguf``: the default for a GGUF model (torch's int4 kernel, the Q8_0 head on its
  int8 kernel), decode steps fused into one C++ call (fused_decode.py);
  ``float32/gguf/eager``: the same op by op (the default before the fused step);
  ``float32/exact``: the default before that (float32 weights, decode on BLAS);
- ``bfloat16/gguf``: bfloat16 activations, which saves the int4 kernel's casts;
- ``float32/int8``: the default for safetensors models, run on the GGUF's weights (fused);
- ``float32/gguf/1-thread``: torch on one thread for the whole step;
- ``float32/gguf/onnxruntime``: the int4 linears and the Q8_0 head on ONNX Runtime's
  ``MatMulNBits`` (int8 activations, benchmarks/_ort_linear.py), torch on one thread for the
  rest of the step (its pool and ONNX Runtime's would fight otherwise);
- ``float32/gguf/kv-float32``: the default with a float32 KV cache (the default's is
  bfloat16, ``--kv-dtype``), which would tell at long contexts (``--context 2000``).

    python benchmarks/cpu_options.py [--batches 1 4 16] [--rounds 5] [--steps 15]
    python benchmarks/cpu_options.py --options float32/gguf/kv-float32 --context 2000 \
        --batches 1 4 --rounds 3 --steps 8 --section cpu-kv-dtypes-long
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section
from decode_profile import decode_steps, make_runner, prepare

from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.model.blas_linear import MatmulRoute
from parrot.engines.builtin.model.gguf_weights import GGUFWeights
from parrot.engines.builtin.model.loader import default_model_path

OPTIONS = [
    "float32/gguf",
    "float32/gguf/eager",
    "float32/exact",
    "bfloat16/gguf",
    "float32/int8",
    "float32/gguf/1-thread",
    "float32/gguf/onnxruntime",
]
DEFAULT = "float32/gguf"


def build(option: str, threads: int, num_blocks: int):
    dtype, weights, *variant = option.split("/")
    # ONNX Runtime swaps the linears after the build: the fused step would keep the old ones
    fused = not {"eager", "onnxruntime"} & set(variant)
    kv_dtype = next((v.removeprefix("kv-") for v in variant if v.startswith("kv-")), "auto")
    config = EngineConfig(
        dtype=dtype, weights=weights, num_threads=threads, fused_decode=fused, kv_dtype=kv_dtype
    )
    runner = make_runner(config, num_blocks)
    if variant == ["onnxruntime"]:
        from _ort_linear import swap_to_onnxruntime

        model = runner.model
        gguf = GGUFWeights(default_model_path(), model.config.num_heads, model.config.num_kv_heads)
        swap_to_onnxruntime(model, gguf, threads, config.dense_rows)
        model.matmul_route = MatmulRoute(config.dense_rows - 1, config.blas_keys, threads)
    return runner, (1 if variant == ["1-thread"] else threads)


def measure(args) -> dict[str, dict[int, list[float]]]:
    # every batch's contexts fit, with room for the steps (blocks of 16 tokens)
    tokens = max(args.batches) * (args.context + (args.rounds + 1) * args.steps + 8)
    built = {option: build(option, args.threads, max(512, tokens // 16 + 1)) for option in args.options}
    results: dict[str, dict[int, list[float]]] = {o: {} for o in args.options}
    for batch in args.batches:
        contexts = {}
        for option, (runner, threads) in built.items():
            torch.set_num_threads(threads)
            contexts[option] = prepare(runner, batch, args.context)
            decode_steps(runner, contexts[option], 3)  # warm-up
            results[option][batch] = []
        for n in range(args.rounds):
            order = list(built) if n % 2 == 0 else list(built)[::-1]
            for option in order:
                runner, threads = built[option]
                torch.set_num_threads(threads)
                if runner.model.matmul_route is not None:
                    runner.model.matmul_route.blas = False  # its next step sets the threads again
                results[option][batch].append(1e3 * decode_steps(runner, contexts[option], args.steps))
        for option, (runner, _) in built.items():  # the next batch starts from empty contexts
            for ctx in contexts[option]:
                runner.pool.free(ctx)
        line = ", ".join(f"{o} {statistics.median(results[o][batch]):.1f}" for o in args.options)
        print(f"batch {batch} (ms per step): {line}", flush=True)
    return results


def table(args, results: dict[str, dict[int, list[float]]]) -> str:
    lines = [
        f"## Options for the CPU decode step, contexts of {args.context} tokens "
        "(`benchmarks/cpu_options.py`)",
        "",
        f"Machine: {machine()}. The bundled model, {args.threads} threads unless the option says; "
        f"contexts of {args.context} tokens; ms per decode step over {args.steps} steps, median "
        f"(min-max) of {args.rounds} rounds in one process, the options' order reversed each round; "
        "the ratio is the default's median over the option's (above 1: faster than the default).",
        "",
        "| option | "
        + " | ".join(f"batch {b}, ms" for b in args.batches)
        + " | "
        + " | ".join(f"batch {b} vs default" for b in args.batches)
        + " |",
        "| --- | " + " | ".join("---:" for _ in args.batches * 2) + " |",
    ]
    for option in args.options:
        cells = []
        for b in args.batches:
            v = results[option][b]
            cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
        for b in args.batches:
            ratio = statistics.median(results[DEFAULT][b]) / statistics.median(results[option][b])
            cells.append(f"{ratio:.2f}x")
        lines.append(f"| `{option}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--options", nargs="+", default=OPTIONS)
    parser.add_argument("--context", type=int, default=32, help="tokens in each context before decoding")
    parser.add_argument("--section", default="cpu-options", help="the section of docs/benchmarks.md")
    parser.add_argument("--no-docs", action="store_true", help="print the table only")
    args = parser.parse_args()
    if DEFAULT not in args.options:
        args.options.insert(0, DEFAULT)
    results = measure(args)
    torch.set_num_threads(args.threads)  # as the machine line reports it
    body = table(args, results)
    print(body)
    if not args.no_docs:
        write_section(args.section, body)


if __name__ == "__main__":
    main()
