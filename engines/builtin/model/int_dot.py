"""Small steps' packed products with int8 activations (the C++ extension's ``int_dot.h``).

torch's int4/int8 kernels widen each weight to float; on an AVX2-only CPU that is most of a
decode step (the bundled model's batch-1 step with AVX2: 9.1 of 14.5 ms in the int4 kernel,
3.8 in the int8 LM head). llama.cpp quantizes the activations to int8 in blocks of 32 and
multiplies in integers; so does this path, for steps of at most ``int_rows`` rows. It costs
another copy of the int4 codes (in llama.cpp's block layout, as big as torch's packed ones)
and adds llama.cpp's activation rounding (test_weight_formats.py bounds the logits).

``auto`` times both on one layer at load: it takes this path where it is at least
``AUTO_MIN_SPEEDUP`` times faster at one row, up to the largest row count where it stays
``AUTO_EXTEND_SPEEDUP`` times faster (none: it stays off).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from parrot.engines.builtin.model.quant import Int4Codes, Int4Linear, Int8Linear, PackedLinear, quantize_int4

log = logging.getLogger(__name__)

INT_DOT_CHOICES = ("auto", "on", "off")
BLOCK = 32  # activations are quantized in blocks of this many; int4 weights need this group
# Whether to take it at all needs a clear margin at one row (the choice changes the numerics,
# so it must not flip with noise: on AVX-512 the two measure 1.0-1.3x apart, on AVX2 about
# 2x); how far, only that it stays faster at more rows.
AUTO_MIN_SPEEDUP = 1.5
AUTO_EXTEND_SPEEDUP = 1.1
PROBE_ROWS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class IntDotChoice:
    rows: int  # steps of at most this many rows use int8 activations (0: none)
    reason: str  # "asked", "timed" or why it is off
    ms: dict[int, tuple[float, float]]  # rows -> (torch's kernel, int8 activations) ms, timed only

    def describe(self) -> str:
        times = "; ".join(f"{r} rows: {a:.3f} against {b:.3f} ms" for r, (a, b) in self.ms.items())
        return f"up to {self.rows} rows ({self.reason}{': ' + times if times else ''})"

    def as_dict(self) -> dict:
        return {"rows": self.rows, "reason": self.reason, "ms": {str(r): list(v) for r, v in self.ms.items()}}


def int4_layout(codes: Int4Codes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """llama.cpp's block layout of int4 weights: codes [N, K / 2] uint8 (byte j of a block =
    code j | code j + 16 << 4), d and m [N, K / 32] float32 with w = d * code + m."""
    n, k = codes.codes.shape
    blocks = codes.codes.view(n, k // BLOCK, BLOCK)
    packed = (blocks[..., :16] | (blocks[..., 16:] << 4)).to(torch.uint8).reshape(n, k // 2)
    d = codes.scale.float().contiguous()
    return packed.contiguous(), d, (codes.zero.float() - 8 * d).contiguous()


def fits(linear: PackedLinear) -> bool:
    if linear.in_features % BLOCK:
        return False
    return not isinstance(linear, Int4Linear) or linear.group_size == BLOCK


def int_weights(linear: PackedLinear, codes: Int4Codes | None) -> tuple:
    """The tensors the C++ products take: int4 (codes, d, m); int8 (codes, float scales)."""
    if isinstance(linear, Int4Linear):
        return int4_layout(codes)
    assert isinstance(linear, Int8Linear)
    return linear.weight_int8, linear.scales.float().contiguous()


def choose_int_rows(
    choice: str, extension, in_features: int, out_features: int, max_rows: int
) -> IntDotChoice:
    """How many rows a step may have and still take int8 activations (``max_rows``: below
    the dense copies'; ``extension``: None where the C++ extension cannot be built)."""
    if choice not in INT_DOT_CHOICES:
        raise ValueError(f"int8_activations must be one of {', '.join(INT_DOT_CHOICES)}, got {choice!r}")
    if choice == "off" or extension is None:
        return IntDotChoice(0, "off" if choice == "off" else "no C++ extension", {})
    if choice == "on":
        return IntDotChoice(max_rows, "asked", {})
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    codes = quantize_int4(weight, BLOCK)
    layer, packed = Int4Linear(codes, None), int4_layout(codes)
    ms: dict[int, tuple[float, float]] = {}
    rows = 0
    for r in (r for r in PROBE_ROWS if r <= max_rows):
        x = torch.randn(r, in_features, generator=generator).to(torch.bfloat16)
        theirs = _best_ms(lambda x=x: layer.packed_mm(x))
        ours = _best_ms(lambda x=x: extension.int4_rows(x, *packed))
        ms[r] = (theirs, ours)
        if theirs < (AUTO_MIN_SPEEDUP if rows == 0 else AUTO_EXTEND_SPEEDUP) * ours:
            break
        rows = r
    return IntDotChoice(rows, "timed", ms)


def _best_ms(fn, repeats: int = 5) -> float:
    with torch.inference_mode():
        fn()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 4)
