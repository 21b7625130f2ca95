"""What the CPU offers, and the product that large steps (prompts, big batches) run on.

Quantized weights keep a dense copy for steps of ``dense_rows`` rows or more (see
``quant.PackedLinear``). Which dtype that copy should have depends on the CPU, by a factor
of ten: where the CPU multiplies bfloat16 natively (AVX512_BF16, AMX) a bfloat16 GEMM is
2-2.5x a float32 one (measured here on an AMD EPYC with AVX512_BF16, 256 x 576 x 1536: 1.05
against 2.6 ms); where it does not (AVX2-only laptops, desktops and many cloud VMs) oneDNN
has no bfloat16 kernel and torch falls back to a slow one, 4-5x slower than float32 (the
same shapes with ``ONEDNN_MAX_CPU_ISA=AVX2``: 11.8 against 2.8 ms). So ``auto`` times one
product of the model's largest layer in both dtypes at load and keeps bfloat16 unless
float32 is clearly faster (bfloat16 holds the copy in half the memory).

To see an AVX2 machine's choices on a newer CPU, start the engine with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` (``benchmarks/cpu_peer.py --cpu avx2``
does); ``PARROT_NATIVE_ARCH=haswell`` builds the C++ decode step for AVX2 as well.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

DENSE_DTYPES = ("auto", "bfloat16", "float32")
# the flags of /proc/cpuinfo that decide which kernels are fast
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16")
FLOAT32_MIN_SPEEDUP = 1.25  # auto keeps bfloat16 (half the memory) unless float32 is this much faster
PROBE_ROWS = 256  # rows of the timed product: a prompt chunk's order of size


@dataclass(frozen=True)
class CpuFeatures:
    isa: str  # the vector level torch's own kernels run at: AVX512, AVX2, ... (ATEN_CPU_CAPABILITY lowers it)
    flags: tuple[str, ...]  # which of FLAGS the CPU reports
    onednn_bf16: bool  # oneDNN has bfloat16 kernels for this CPU (ONEDNN_MAX_CPU_ISA lowers it)

    def describe(self) -> str:
        bf16 = "native bfloat16" if self.onednn_bf16 else "no native bfloat16"
        return f"{self.isa} ({', '.join(self.flags) or 'no vector flags read'}; {bf16})"


@functools.cache  # fixed for the process: torch reads its environment once
def cpu_features() -> CpuFeatures:
    return CpuFeatures(
        isa=torch.backends.cpu.get_cpu_capability(),
        flags=tuple(f for f in FLAGS if f in _cpuinfo_flags()),
        onednn_bf16=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    )


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the flags stay unknown, the timing below still decides
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@dataclass(frozen=True)
class DenseChoice:
    """The dtype of the dense copies and why: each dtype's time for one probe product."""

    dtype: torch.dtype
    reason: str  # "asked" or "timed"
    ms: dict[str, float]  # dtype name -> milliseconds of the probe product (timed only)

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        if self.reason == "asked":
            return f"{name} (asked)"
        times = ", ".join(f"{k} {v:.2f} ms" for k, v in self.ms.items())
        return f"{name} (timed {PROBE_ROWS} rows through the largest layer: {times})"

    def as_dict(self) -> dict:
        return {"dtype": str(self.dtype).removeprefix("torch."), "reason": self.reason, "ms": self.ms}


def choose_dense_dtype(choice: str, out_features: int, in_features: int, repeats: int = 3) -> DenseChoice:
    """The dense copies' dtype: the one asked for, or for ``auto`` the faster on this CPU."""
    if choice not in DENSE_DTYPES:
        raise ValueError(f"dense_dtype must be one of {', '.join(DENSE_DTYPES)}, got {choice!r}")
    if choice != "auto":
        return DenseChoice(getattr(torch, choice), "asked", {})
    ms = {n: _product_ms(getattr(torch, n), out_features, in_features, repeats) for n in DENSE_DTYPES[1:]}
    faster = ms["bfloat16"] > FLOAT32_MIN_SPEEDUP * ms["float32"]
    return DenseChoice(torch.float32 if faster else torch.bfloat16, "timed", ms)


def _product_ms(dtype: torch.dtype, out_features: int, in_features: int, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, in_features, generator=generator).to(dtype)  # [rows, in]
    w = torch.randn(out_features, in_features, generator=generator).to(dtype)  # [out, in]
    with torch.inference_mode():
        F.linear(x, w)  # the first call sets up the kernel
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            F.linear(x, w)
            best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 3)


def report(dense: DenseChoice | None, small=None) -> dict:
    """What ``/ping`` says of the CPU and its paths (``dense``: None where no layer keeps a
    copy; ``small``: the int8-activation choice of int_dot.py, None with exact weights)."""
    return {
        **asdict(cpu_features()),
        "dense_copy": None if dense is None else dense.as_dict(),
        "int8_activations": None if small is None else small.as_dict(),
    }
