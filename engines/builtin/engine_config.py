"""Engine configuration: one frozen dataclass built from CLI flags and PARROT_* variables."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch

from parrot.engines.builtin.batch import SharedPrefixPolicy
from parrot.engines.builtin.grammars import GrammarLimits
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.engines.builtin.model.cpu_paths import DENSE_DTYPES
from parrot.engines.builtin.model.int_dot import INT_DOT_CHOICES
from parrot.wire.tool_syntax import TOOL_FORMATS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """'2GiB', '512MB', '1e9' style sizes in bytes."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 512MiB, 2GiB)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_DTYPES = ("auto", "float32", "bfloat16")
WEIGHT_FORMATS = ("auto", "exact", "int8", "int4", "gguf")
CPU_MATMULS = ("auto", "torch", "blas")
# The environment variables ``EngineConfig.from_env`` reads, and the field each sets.
ENV_FIELDS = {
    "PARROT_MODEL": "model",
    "PARROT_DEVICE": "device",
    "PARROT_DTYPE": "dtype",
    "PARROT_KV_DTYPE": "kv_dtype",
    "PARROT_WEIGHTS": "weights",
    "PARROT_KV_CACHE_MEMORY": "kv_cache_bytes",  # a size: "2GiB", "512m"
    "PARROT_ATTENTION_BACKEND": "attention_backend",
    "PARROT_CPU_MATMUL": "cpu_matmul",
    "PARROT_DENSE_DTYPE": "dense_dtype",
    "PARROT_INT8_ACTIVATIONS": "int8_activations",
    "PARROT_CACHE_DIR": "cache_dir",
    "PARROT_TOOL_FORMAT": "tool_format",
}


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF folder or .gguf file; None = the bundled default model
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on CUDA) | float32 | bfloat16 | float16
    # exact (the checkpoint's weights in dtype) | int8 | int4 | gguf (a GGUF file's own 4-bit
    # weights): packed weights for torch's CPU kernels; activations stay in dtype. auto (the
    # default) is resolved when the config is made (see ``_default_weights``) and never stays.
    weights: str = "auto"
    # quantized weights: from this many rows in a step on, multiply by a dense copy of the
    # de-quantized weights (0 = never, saving the copy's memory). Measured on the default model
    # (gguf, 1 thread, whole decode steps): no difference at 16 rows, 1.7x faster at 64.
    dense_rows: int = 32
    # the copy's dtype: auto (bfloat16 where the CPU multiplies it natively, else float32,
    # timed at load: model/cpu_paths.py) | bfloat16 | float32
    dense_dtype: str = "auto"
    # quantized weights, steps of fewer rows than dense_rows: quantize the activations to int8
    # and multiply in integers, as llama.cpp (model/int_dot.py): auto (where it times faster
    # at load: AVX2-only CPUs) | on | off
    int8_activations: str = "auto"
    block_size: int = 16
    kv_cache_bytes: int = 2 * 2**30
    # The KV cache's element type: auto | float32 | bfloat16. auto: bfloat16 for packed weights
    # on the CPU (the defaults there: twice the tokens in the same memory at the same speed,
    # logits as close to the exact model's, measured), else the activations' dtype (exact
    # weights stay token-identical to transformers). Keys and values are rounded once when
    # stored; attention computes in float32.
    kv_dtype: str = "auto"
    max_model_len: int | None = None  # defaults to the model's max_position_embeddings
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    shared_prefix: SharedPrefixPolicy = field(default_factory=SharedPrefixPolicy)
    attention_backend: str | None = None  # None: the registry's default for the device
    cache_dir: str | None = None  # converted models; default ~/.cache/parrot/models
    num_threads: int | None = None  # torch intra-op threads on CPU
    # float32/exact on the CPU: which library multiplies small steps' linears. blas: numpy's
    # BLAS (2.2x torch's MKL per decode step here: 538 MB of weights at 43 GB/s, not 16);
    # torch; auto: BLAS where a one-row product through the LM head measures faster at load.
    cpu_matmul: str = "auto"
    blas_rows: int = 64  # steps of at most this many rows use BLAS; larger ones (prefill) torch
    blas_keys: int = 8192  # ... and attending at most this many keys in all (long contexts: torch)
    # Output formats (issue 21): size, compile time and cache limits; jump-forward fills the
    # tokens a grammar forces in one step instead of decoding them one by one (--no-jump-forward).
    grammar: GrammarLimits = field(default_factory=GrammarLimits)
    jump_forward: bool = True
    # CUDA (Triton backend, no sliding windows): decode-only steps of up to the largest of these
    # sizes replay a CUDA graph captured at load, padded to the next size; () captures none.
    # Graphs serve contexts up to cuda_graph_max_len tokens (the block table's fixed width: the
    # decode kernel walks it whole, so a 128K-wide table would cost every step); longer ones
    # run eagerly.
    cuda_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    cuda_graph_max_len: int = 8192
    # CPU, packed weights: decode-only steps run whole in one C++ call (fused_decode.py), 1.9x
    # faster at batch 1 on the default model; False runs every step op by op (eagerly).
    fused_decode: bool = True
    # Tools in chats (issue 36): auto asks for and reads calls in the model's own syntax where
    # its chat template writes one Parrot knows (wire/tool_syntax.py), else in Parrot's generic
    # format; generic always uses the generic format.
    tool_format: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size > 1024:
            raise ValueError(f"block_size must be in 1..1024, got {self.block_size}")
        if self.kv_cache_bytes < 1:
            raise ValueError("the KV cache memory budget must be positive")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.torch_kv_dtype() != self.torch_dtype() and self.torch_device().type != "cpu":
            raise ValueError("a KV cache dtype other than the model's runs on the CPU only")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")
        if self.weights == "auto":
            object.__setattr__(self, "weights", self._default_weights())
        if self.cpu_matmul not in CPU_MATMULS:
            raise ValueError(f"cpu_matmul must be one of {', '.join(CPU_MATMULS)}, got {self.cpu_matmul!r}")
        if self.cpu_matmul == "blas" and not self._float32_exact_on_cpu():
            raise ValueError("--cpu-matmul blas runs float32 exact weights on the CPU only")
        if self.blas_rows < 1 or self.blas_keys < 1:
            got = f"{self.blas_rows} and {self.blas_keys}"
            raise ValueError(f"blas_rows and blas_keys must be positive, got {got}")
        if self.dense_rows < 0:
            raise ValueError(f"dense_rows must be 0 (never) or positive, got {self.dense_rows}")
        if self.int8_activations not in INT_DOT_CHOICES:
            choices = ", ".join(INT_DOT_CHOICES)
            raise ValueError(f"int8_activations must be one of {choices}, got {self.int8_activations!r}")
        if self.dense_dtype not in DENSE_DTYPES:
            choices = ", ".join(DENSE_DTYPES)
            raise ValueError(f"dense_dtype must be one of {choices}, got {self.dense_dtype!r}")
        if self.weights != "exact":
            if self.torch_device().type != "cpu":
                raise ValueError(f"--weights {self.weights} runs on the CPU only (use exact on GPUs)")
            if self.weights == "gguf" and self.model is not None and not self.model.lower().endswith(".gguf"):
                raise ValueError("--weights gguf needs a .gguf model file (or the default model)")
        if self.tool_format not in TOOL_FORMATS:
            choices = ", ".join(TOOL_FORMATS)
            raise ValueError(f"tool_format must be one of {choices}, got {self.tool_format!r}")
        if any(size < 1 for size in self.cuda_graph_batch_sizes) or self.cuda_graph_max_len < 1:
            raise ValueError("CUDA graph batch sizes and cuda_graph_max_len must be positive")
        if self.scheduler.max_batched_tokens < 1 or self.scheduler.max_running < 1:
            raise ValueError("max_batched_tokens and max_running must be positive")

    def _default_weights(self) -> str:
        """The fastest weight format of documented fidelity for this model and device.

        On the CPU, a GGUF model (the bundled one too) runs its own quantization, as llama.cpp
        does; a safetensors model runs int8 (one scale per output row: logits within a few
        percent of exact, 1.7x its batch-1 decode here). GPUs run the checkpoint's weights. Only
        ``exact`` is token-identical to transformers: pin it where that matters.
        """
        if self.torch_device().type != "cpu":
            return "exact"
        return "gguf" if self.model is None or self.model.lower().endswith(".gguf") else "int8"

    def _float32_exact_on_cpu(self) -> bool:
        on_cpu = self.torch_device().type == "cpu"
        return self.weights == "exact" and on_cpu and self.torch_dtype() == torch.float32

    def uses_cpu_matmul_choice(self) -> bool:
        """Whether the float32 linears may go to BLAS (``cpu_matmul`` then says whether they do)."""
        return self.cpu_matmul != "torch" and self._float32_exact_on_cpu()

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    def torch_kv_dtype(self) -> torch.dtype:
        # (resolved here, not when the config is made: a config copied with other weights
        # gets its own default)
        if self.kv_dtype != "auto":
            return getattr(torch, self.kv_dtype)
        packed_on_cpu = self.weights != "exact" and self.torch_device().type == "cpu"
        return torch.bfloat16 if packed_on_cpu else self.torch_dtype()

    @classmethod
    def from_env(cls, **overrides) -> EngineConfig:
        """Defaults, then PARROT_* environment variables, then explicit overrides (CLI flags)."""
        values: dict = {field: os.environ[name] for name, field in ENV_FIELDS.items() if name in os.environ}
        if "kv_cache_bytes" in values:
            values["kv_cache_bytes"] = parse_size(values["kv_cache_bytes"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
