"""``parrot engine``: serve one model with the builtin engine over HTTP."""

from __future__ import annotations

import argparse

from parrot.cli.server_flags import add_server_arguments, server_limits_from_args
from parrot.engines.builtin.attention import available_backends
from parrot.engines.builtin.batch import SharedPrefixPolicy
from parrot.engines.builtin.engine_config import CPU_MATMULS, DTYPES, KV_DTYPES, EngineConfig, parse_size
from parrot.engines.builtin.grammars import GrammarLimits
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.engines.builtin.model.cpu_paths import DENSE_DTYPES
from parrot.engines.builtin.model.int_dot import INT_DOT_CHOICES
from parrot.wire.tool_syntax import TOOL_FORMATS


def add_parser(commands) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "engine", help="run a builtin engine (Fill/Generate + OpenAI API)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9001)
    p.add_argument(
        "--model",
        default=None,
        help="a Hugging Face hub id (org/name), a model folder or a .gguf file "
        "(default: bundled SmolLM2-135M)",
    )
    p.add_argument("--device", default=None, help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default=None, choices=DTYPES)
    p.add_argument(
        "--weights",
        default=None,
        choices=["auto", "exact", "int8", "int4", "gguf"],
        help="weight format: auto (default: on the CPU a .gguf model's own quantization, int8 for "
        "a safetensors folder; exact on GPUs), exact (token-identical to transformers), int8, int4, "
        "or gguf (a .gguf model's own 4-bit weights)",
    )
    p.add_argument(
        "--dense-rows",
        type=int,
        default=None,
        help="quantized weights: steps of this many rows or more use a dense copy (0: never)",
    )
    p.add_argument(
        "--dense-dtype",
        default=None,
        choices=DENSE_DTYPES,
        help="the dense copy's dtype (default auto: bfloat16 where the CPU multiplies it natively, "
        "else float32; timed at start)",
    )
    p.add_argument(
        "--int8-activations",
        default=None,
        choices=INT_DOT_CHOICES,
        help="quantized weights, small steps: int8 activations and integer products, as llama.cpp "
        "(default auto: where timed faster at start, as with VNNI or on AVX2-only CPUs)",
    )
    p.add_argument(
        "--tool-format",
        default=None,
        choices=TOOL_FORMATS,
        help="tools in chats: auto (default) asks for calls in the model's own syntax where its chat "
        "template writes one (Qwen2.5/3, Hermes: <tool_call>; Llama 3.1+: JSON; Mistral Nemo: "
        "[TOOL_CALLS]), else in Parrot's generic JSON format; generic always uses the generic format",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-memory", type=parse_size, default=None, help="KV cache budget, e.g. 2GiB")
    p.add_argument(
        "--kv-dtype",
        default=None,
        choices=KV_DTYPES,
        help="KV cache element type (default auto: bfloat16 for packed weights on the CPU, which "
        "holds twice the tokens of float32; else the model's dtype)",
    )
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-batched-tokens", type=int, default=1024, help="token budget of one step")
    p.add_argument("--max-running", type=int, default=64, help="jobs batched together at most")
    p.add_argument(
        "--latency-max-batch",
        type=int,
        default=None,
        help="while a latency-critical job runs, sequences per step at most (default: no cap)",
    )
    p.add_argument(
        "--background-max-batched-tokens",
        type=int,
        default=32,
        help="tokens of a background fill (a ServeCore's fill-ahead) in a step other jobs use",
    )
    p.add_argument(
        "--latency-max-prefill-tokens",
        type=int,
        default=None,
        help="while a latency-critical job runs, prompt tokens of other jobs per step at most "
        "(their decodes go on; default: no cap)",
    )
    p.add_argument("--attention-backend", default=None, choices=available_backends())
    p.add_argument("--no-shared-prefix", action="store_true", help="disable shared-prefix attention")
    p.add_argument("--shared-prefix-min-seqs", type=int, default=2)
    p.add_argument("--shared-prefix-min-tokens", type=int, default=16)
    p.add_argument(
        "--shared-prefix-min-saved",
        type=int,
        default=None,
        help="take the shared-prefix path when (seqs - 1) * prefix tokens reaches this "
        "(default: the device's measured break-even, 3072 on the CPU, 98304 on a GPU)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--cpu-matmul",
        default=None,
        choices=CPU_MATMULS,
        help="float32 exact weights on the CPU: multiply decode steps on numpy's BLAS or torch "
        "(default auto: BLAS where it measures faster at start)",
    )
    p.add_argument(
        "--max-format-chars",
        type=int,
        default=None,
        help="largest output format (JSON schema, regex, grammar) in characters; larger get 413 "
        "(default 65536)",
    )
    p.add_argument(
        "--format-compile-timeout",
        type=float,
        default=None,
        help="seconds a format may take to compile; longer is a 400 (default 10)",
    )
    p.add_argument("--format-cache-size", type=int, default=None, help="compiled formats kept (default 64)")
    p.add_argument(
        "--no-jump-forward",
        action="store_true",
        help="decode the tokens a format forces one by one (default: fill them in one step)",
    )
    p.add_argument(
        "--cuda-graphs",
        type=parse_graph_sizes,
        default=None,
        metavar="SIZES",
        help="CUDA: decode steps of up to these batch sizes replay captured graphs, e.g. 1,2,4,8; "
        "off for none (default 1,2,4,8,16,32,64)",
    )
    p.add_argument(
        "--no-fused-decode",
        action="store_true",
        help="CPU: run decode steps op by op instead of in one C++ call (the fused step, default "
        "with packed weights)",
    )
    add_server_arguments(p)
    p.add_argument(
        "--max-body-bytes",
        type=parse_size,
        default=32 * 2**20,
        help="largest request body accepted, e.g. 32MiB (default); larger ones get 413",
    )
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig.from_env(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        weights=args.weights,
        dense_rows=args.dense_rows,
        dense_dtype=args.dense_dtype,
        int8_activations=args.int8_activations,
        tool_format=args.tool_format,
        block_size=args.block_size,
        kv_cache_bytes=args.kv_cache_memory,
        kv_dtype=args.kv_dtype,
        max_model_len=args.max_model_len,
        scheduler=SchedulerConfig(
            max_batched_tokens=args.max_batched_tokens,
            max_running=args.max_running,
            latency_max_batch=args.latency_max_batch,
            latency_max_prefill_tokens=args.latency_max_prefill_tokens,
            background_max_batched_tokens=args.background_max_batched_tokens,
        ),
        shared_prefix=SharedPrefixPolicy(
            enabled=not args.no_shared_prefix,
            min_seqs=args.shared_prefix_min_seqs,
            min_prefix_tokens=args.shared_prefix_min_tokens,
            min_saved_tokens=args.shared_prefix_min_saved,
        ),
        attention_backend=args.attention_backend,
        num_threads=args.threads,
        cpu_matmul=args.cpu_matmul,
        grammar=GrammarLimits.given(
            max_format_chars=args.max_format_chars,
            compile_timeout_s=args.format_compile_timeout,
            cache_size=args.format_cache_size,
        ),
        jump_forward=not args.no_jump_forward,
        cuda_graph_batch_sizes=args.cuda_graphs,
        fused_decode=not args.no_fused_decode,
    )


def parse_graph_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8); 'off' -> ()."""
    if text.strip().lower() in ("off", "none", "0", ""):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of batch sizes: {text!r}") from None


def run(args: argparse.Namespace) -> None:
    """Bind the port at once and load the model meanwhile (``/healthz`` answers 503
    ``loading`` with the stage): a failed load stops the server and exits with its error."""
    from parrot.engines.builtin.loading import EngineLoader
    from parrot.engines.builtin.server.app import create_app
    from parrot.engines.protocol import server

    loader = EngineLoader(config_from_args(args))
    limits = server_limits_from_args(args)
    app = create_app(loader, max_body_bytes=args.max_body_bytes)
    ready = f"parrot engine: listening on http://{args.host}:{args.port}; loading the model (GET /healthz)"
    server.run(
        app, args.host, args.port, limits, ready_message=ready, stop=loader.failed, log_level="warning"
    )
    if loader.error is not None:
        raise SystemExit(f"parrot engine: the model did not load: {loader.error}")
