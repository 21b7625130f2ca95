"""Weight-only quantized linear layers for the CPU, on torch's packed-weight kernels.

Two formats, each a drop-in for ``nn.Linear``. The kernels are fast on the CPU only with
bfloat16 inputs (measured here: float32 inputs take 20-50x longer), so a layer hands them
its input in bfloat16 and returns the result in the input's dtype; the rest of the model
(norms, rotary, attention, residuals) keeps computing in the model's dtype.

- :class:`Int8Linear`: one symmetric int8 scale per output row, on
  ``aten._weight_int8pack_mm``;
- :class:`Int4Linear`: 4-bit codes with a scale and a zero point per group of input
  columns, on ``aten._weight_int4pack_mm_for_cpu``. Its dequantization is
  ``(code - 8) * scale + zero``, which represents llama.cpp's Q4_0 (``d * (q - 8)``) and
  Q4_1 (``d * q + m``) blocks of 32 exactly, so a GGUF's own 4-bit weights run as they are.

The kernels' shape rules (checked by :func:`int4_fits`): int4 needs the output size
divisible by 16 and the input size by the group size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

INT4_GROUP_SIZES = (32, 64, 128, 256)
KERNEL_DTYPE = torch.bfloat16  # what the packed kernels compute in


@dataclass(frozen=True)
class Int4Codes:
    """4-bit weights before packing: ``w[n, k] = (codes[n, k] - 8) * scale[n, g] + zero[n, g]``."""

    codes: torch.Tensor  # [out, in] int32 in 0..15
    scale: torch.Tensor  # [out, in // group] float32
    zero: torch.Tensor  # [out, in // group] float32
    group_size: int

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        g = self.group_size
        scale = self.scale.repeat_interleave(g, dim=1)
        zero = self.zero.repeat_interleave(g, dim=1)
        return (self.codes.float() - 8) * scale + zero

    def rows(self, index: torch.Tensor) -> Int4Codes:
        return Int4Codes(self.codes[index], self.scale[index], self.zero[index], self.group_size)

    @staticmethod
    def cat(parts: list[Int4Codes]) -> Int4Codes:
        if len({p.group_size for p in parts}) != 1:
            raise ValueError("int4 parts of one matrix must share a group size")
        return Int4Codes(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.zero for p in parts]),
            parts[0].group_size,
        )


def int4_fits(out_features: int, in_features: int, group_size: int) -> bool:
    return out_features % 16 == 0 and in_features % group_size == 0


def quantize_int4(weight: torch.Tensor, group_size: int) -> Int4Codes:
    """Asymmetric min/max int4 per group of ``group_size`` input columns."""
    out_features, in_features = weight.shape
    w = weight.float().view(out_features, in_features // group_size, group_size)
    lo, hi = w.amin(-1), w.amax(-1)  # [out, groups]
    scale = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((w - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
    # A code q stands for lo + q * scale = (q - 8) * scale + (lo + 8 * scale).
    return Int4Codes(codes.view(out_features, in_features), scale, lo + 8 * scale, group_size)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (codes [out, in] int8, scales [out] float32)."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # [out]
    codes = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return codes, scale


class PackedLinear(nn.Module):
    """A linear whose weights are packed for a weight-only kernel (subclasses: the format).

    From ``dense_rows`` rows on (0: never), it multiplies by a dense copy of its
    de-quantized weights instead: the packed kernels' cost grows with the rows (int4 takes
    2.2x its 1-row time at 4 rows), a dense matmul's barely does, so past some rows the
    larger dense weights win (whole decode steps of the default model: even at 16 rows,
    1.7x faster at 64). Small batches (decode) stay on the packed weights. The copy is
    bfloat16 or float32, whichever the CPU multiplies faster (``cpu_paths``).
    """

    def __init__(self, out_features: int, in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.register_buffer("bias", None if bias is None else bias.clone())
        self.register_buffer("dense", None)  # [out, in] bfloat16 or float32, only with dense_rows
        self.dense_rows = 0
        self.int_rows = 0  # steps of at most this many rows: int8 activations (int_dot.py)
        self.int_weights: tuple = ()  # what the extension's product takes (int_dot.int_weights)
        self.int_product = None  # the extension's int4_rows or int8_rows

    def keep_dense_copy(
        self, weight: torch.Tensor, from_rows: int, dtype: torch.dtype = KERNEL_DTYPE
    ) -> None:
        """Use ``weight`` [out, in] (this layer's de-quantized weights) in ``dtype`` from
        ``from_rows`` rows on."""
        if from_rows > 0:
            self.dense = weight.to(dtype).contiguous()
            self.dense_rows = from_rows

    def use_int8_activations(self, rows: int, weights: tuple, extension) -> None:
        """Steps of at most ``rows`` rows multiply on ``extension`` with int8 activations."""
        self.int_rows, self.int_weights = rows, weights
        self.int_product = extension.int4_rows if isinstance(self, Int4Linear) else extension.int8_rows

    def packed_mm(self, rows: torch.Tensor) -> torch.Tensor:  # [rows, in] bf16 -> [rows, out] bf16
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # [rows, in]
        if rows.shape[0] <= self.int_rows:
            out = self.int_product(rows.to(KERNEL_DTYPE).contiguous(), *self.int_weights)
        elif self.dense is not None and rows.shape[0] >= self.dense_rows:
            out = F.linear(rows.to(self.dense.dtype), self.dense)
        else:
            out = self.packed_mm(rows.to(KERNEL_DTYPE))
        out = out.to(x.dtype)  # [rows, out]
        if self.bias is not None:
            out = out + self.bias
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)


class Int8Linear(PackedLinear):
    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(codes.shape[0], codes.shape[1], bias)
        self.register_buffer("weight_int8", codes.contiguous())  # [out, in] int8
        self.register_buffer("scales", scales.to(KERNEL_DTYPE))  # [out]

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Int8Linear:
        codes, scales = quantize_int8(weight)
        return cls(codes, scales, bias)

    def dequantized(self) -> torch.Tensor:  # [out, in] float32
        return self.weight_int8.float() * self.scales.float()[:, None]

    def packed_mm(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scales)


class Int4Linear(PackedLinear):
    def __init__(self, codes: Int4Codes, bias: torch.Tensor | None) -> None:
        super().__init__(codes.codes.shape[0], codes.codes.shape[1], bias)
        if not int4_fits(self.out_features, self.in_features, codes.group_size):
            raise ValueError(
                f"int4 needs out % 16 == 0 and in % group == 0, got {tuple(codes.codes.shape)}, "
                f"group {codes.group_size}"
            )
        self.group_size = codes.group_size
        # innerKTiles is ignored by the CPU packing: [out, in] int32 -> [out, in // 2] uint8
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.contiguous(), 1)
        self.register_buffer("weight_int4", packed)
        # [in // group, out, 2]: the kernel's layout of (scale, zero) per group and row
        scale_zero = torch.stack([codes.scale.t(), codes.zero.t()], dim=-1).contiguous()
        self.register_buffer("scale_zero", scale_zero.to(KERNEL_DTYPE))

    def packed_mm(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, self.weight_int4, self.group_size, self.scale_zero
        )
