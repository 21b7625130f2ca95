"""Small steps' packed products with int8 activations (the C++ extension's ``int_dot.h``).

torch's int4/int8 kernels widen each weight to float; on an AVX2-only CPU that is most of a
decode step (the bundled model's batch-1 step with AVX2: 9.1 of 14.5 ms in the int4 kernel,
3.8 in the int8 LM head). llama.cpp quantizes the activations to int8 in blocks of 32 and
multiplies in integers; so does this path, for steps of at most ``int_rows`` rows. It costs
another copy of the int4 codes (in llama.cpp's block layout, as big as torch's packed ones)
and adds llama.cpp's activation rounding (test_weight_formats.py bounds the logits).

``auto`` times both on one layer at load: it takes this path where all the probes together
run ``AUTO_MIN_SPEEDUP`` times faster, up to the largest row count where it stays
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
# Whether to take it at all: all the probes' time against torch's, with a clear margin (the
# choice changes the numerics, so it must not flip with noise: with VNNI, AVX-512's dpbusd,
# they measure 1.32-1.40x here on 2 threads, 1.51-1.57x on one; with AVX2 about 2x); how far:
# up to the largest probe from which down every probe stays faster.
AUTO_MIN_SPEEDUP = 1.15
AUTO_EXTEND_SPEEDUP = 1.1
PROBE_ROWS = (1, 2, 4, 8, 16)  # and the most rows the path may take, when it is more


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


def group_order(in_features: int, size: int = 4) -> torch.Tensor:
    """The positions of a row's values in the extension's group order (``int_dot.h``'s
    ``Groups``): blocks of 32 in groups of ``size`` (what is left: a pair, then a block alone);
    in a group of n blocks, chunk c holds values c * 32/n .. of each of its blocks in turn."""
    blocks = in_features // BLOCK
    whole = blocks // size * size
    sizes = [size] * (whole // size)
    if size == 4 and blocks - whole >= 2:
        sizes.append(2)
    sizes += [1] * (blocks - sum(sizes))
    order, g0 = [], 0
    for n in sizes:
        width = BLOCK // n
        for c in range(n):
            for b in range(n):
                start = (g0 + b) * BLOCK + c * width
                order.extend(range(start, start + width))
        g0 += n
    return torch.tensor(order)


def int4_layout(codes: Int4Codes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int4 weights as the extension reads them: codes [N, K / 2] uint8 in group order
    (:func:`group_order`), each 32 bytes the low nibbles of a chunk and the high ones of the
    next (a block alone: its 16 bytes, values 0-15 low and 16-31 high), and d and m
    [N, K / 32] float32 with w = d * code + m."""
    n, k = codes.codes.shape
    grouped = codes.codes[:, group_order(k)]
    blocks = k // BLOCK
    alone = blocks % 2  # (a block alone is always the last: groups of 4 and a pair are even)
    paired = grouped[:, : (blocks - alone) * BLOCK].reshape(n, -1, 2, BLOCK)
    parts = [(paired[:, :, 0] | (paired[:, :, 1] << 4)).reshape(n, -1)]
    if alone:
        last = grouped[:, -BLOCK:]
        parts.append(last[:, :16] | (last[:, 16:] << 4))
    packed = torch.cat(parts, dim=1).to(torch.uint8)
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
    if max_rows < 1:
        return IntDotChoice(0, "every step takes the dense copies", {})
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    codes = quantize_int4(weight, BLOCK)
    layer, packed = Int4Linear(codes, None), int4_layout(codes)
    ms: dict[int, tuple[float, float]] = {}
    for r in probe_rows(max_rows):
        x = torch.randn(r, in_features, generator=generator).to(torch.bfloat16)
        theirs = best_ms(lambda x=x: layer.packed_mm(x))
        ms[r] = (theirs, best_ms(lambda x=x: extension.int4_rows(x, *packed)))
    return IntDotChoice(rows_taken(ms), "timed", ms)


def probe_rows(max_rows: int) -> list[int]:
    return [r for r in PROBE_ROWS if r < max_rows] + [max_rows]


def rows_taken(ms: dict[int, tuple[float, float]]) -> int:
    """The rows the path takes, from the probes' times (rows -> (torch's, ours) ms)."""
    if sum(theirs for theirs, _ in ms.values()) < AUTO_MIN_SPEEDUP * sum(ours for _, ours in ms.values()):
        return 0
    rows = 0
    for r, (theirs, ours) in sorted(ms.items()):
        if theirs < AUTO_EXTEND_SPEEDUP * ours:
            break
        rows = r
    return rows


def best_ms(fn, repeats: int = 5) -> float:
    """The best of ``repeats`` timed calls of ``fn`` (after one untimed), in ms."""
    with torch.inference_mode():
        fn()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 4)
