"""Rotary position embeddings (rotate-half layout, as in transformers' LLaMA family)."""

from __future__ import annotations

import math

import torch
from torch import nn

from parrot.engines.builtin.model.config import RopeScaling


def inv_freq_and_scale(
    head_dim: int, theta: float, s: RopeScaling, max_positions: int
) -> tuple[torch.Tensor, float]:
    """Frequencies [head_dim // 2] and the attention scaling factor, per rope type."""
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if s.kind == "default":
        return base, 1.0
    if s.kind == "linear":
        return base / s.factor, 1.0
    if s.kind == "dynamic":
        # NTK-aware scaling evaluated at the longest length this engine serves: exact for
        # sequences that long, and the same rule transformers applies once past the original.
        original = s.original_max_position_embeddings or max_positions
        seq = max(max_positions, original)
        if seq <= original:
            return base, 1.0
        t = theta * ((s.factor * seq / original) - (s.factor - 1)) ** (head_dim / (head_dim - 2))
        return 1.0 / (t ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)), 1.0
    if s.kind == "llama3":
        original = s.original_max_position_embeddings or 8192
        low_wavelen = original / s.low_freq_factor
        high_wavelen = original / s.high_freq_factor
        wavelen = 2 * math.pi / base
        scaled = torch.where(wavelen > low_wavelen, base / s.factor, base)
        smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if s.kind == "yarn":
        original = s.original_max_position_embeddings or max_positions
        scale = (
            s.attention_factor
            if s.attention_factor is not None
            else (0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0)
        )

        def dim_for(rotations: float) -> float:
            return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low = max(math.floor(dim_for(s.beta_fast)), 0)
        high = min(math.ceil(dim_for(s.beta_slow)), head_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv = (base / s.factor) * (1 - extrapolation) + base * extrapolation
        return inv, float(scale)
    raise ValueError(f"unknown rope type {s.kind!r}")


class RotaryEmbedding(nn.Module):
    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling, device=None
    ) -> None:
        super().__init__()
        inv_freq, scale = inv_freq_and_scale(head_dim, theta, scaling, max_positions)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_positions, head_dim // 2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, head_dim]
        self.register_buffer("cos", (emb.cos() * scale).to(device), persistent=False)
        self.register_buffer("sin", (emb.sin() * scale).to(device), persistent=False)
        self.half = head_dim // 2

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, 1, d] for the positions: done once per step, shared by all layers."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def forward(self, rotary: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Rotate x [n, heads, d] (queries and keys may be passed together as one tensor)."""
        cos, sin = rotary  # [n, 1, d] each, from ``lookup``
        x1, x2 = x[..., : self.half], x[..., self.half :]
        rotated = torch.cat((-x2, x1), dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
