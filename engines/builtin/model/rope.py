"""Rotary position embeddings (rotate-half layout, as in transformers' LLaMA family).

HF Llama / Mistral / Qwen2 checkpoints, and transformers' GGUF loader (which un-permutes
llama.cpp's interleaved q/k weights), all use the rotate-half layout: dimension ``i`` pairs
with ``i + head_dim // 2``.

Partial rotary (Phi-3 style): the tables cover the leading ``rotary_dim`` dims of each
head and the rest pass through. Long-rope (Phi-3 / Phi-4-mini) uses its short factors for
positions below the pretraining length and its long factors from there on, as vLLM does:
transformers switches every position of a sequence to the long factors once the whole
sequence is longer, which a paged cache (keys rotated once, when stored) cannot follow, so
the two agree exactly while a sequence stays within the pretraining length.

The frequencies of every rope type are computed with the same float32 operations, in the
same order, as ``transformers.modeling_rope_utils``, so in float32 the rotated q/k equal
transformers' bit for bit. The cos/sin tables already include the attention scaling
factor (yarn's mscale), as transformers multiplies it into cos/sin.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from parrot.engines.builtin.model.rope_config import RopeScaling


def _base_inv_freq(head_dim: int, theta: float) -> torch.Tensor:  # [head_dim // 2]
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def inv_freq_and_scale(
    head_dim: int, theta: float, s: RopeScaling, max_positions: int
) -> tuple[torch.Tensor, float]:
    """Frequencies [head_dim // 2] (float32) and the attention scaling factor, per rope type.

    ``max_positions`` is the longest sequence the tables serve. Only "dynamic" uses it:
    transformers recomputes dynamic-NTK frequencies for the current length once a sequence
    grows past ``original_max_position_embeddings`` (its ``max_position_embeddings``). A
    paged engine cannot re-rotate cached keys per step, so the frequencies are fixed for
    ``max_positions``: identical to transformers' (plain rope) while ``max_positions`` does
    not exceed the original length, and exact for sequences of length ``max_positions``
    otherwise.
    """
    base = _base_inv_freq(head_dim, theta)
    if s.kind == "default":
        return base, 1.0
    if s.kind == "linear":
        return base / s.factor, 1.0
    if s.kind == "dynamic":
        original = s.original_max_position_embeddings or max_positions
        seq = max(max_positions, original)
        if seq == original:
            return base, 1.0
        scaled_theta = theta * ((s.factor * seq / original) - (s.factor - 1)) ** (head_dim / (head_dim - 2))
        return _base_inv_freq(head_dim, scaled_theta), 1.0
    if s.kind == "llama3":
        return _llama3(base, s, max_positions), 1.0
    if s.kind == "yarn":
        return _yarn(head_dim, theta, s, max_positions)
    if s.kind == "longrope":
        return _longrope(head_dim, theta, s.short_factor), float(s.attention_factor or 1.0)
    raise ValueError(f"unknown rope type {s.kind!r}")


def _llama3(base: torch.Tensor, s: RopeScaling, max_positions: int) -> torch.Tensor:
    original = s.original_max_position_embeddings or max_positions
    low_wavelen = original / s.low_freq_factor
    high_wavelen = original / s.high_freq_factor
    wavelen = 2 * math.pi / base
    # long wavelengths are interpolated, short ones kept, the band between smoothly blended
    scaled = torch.where(wavelen > low_wavelen, base / s.factor, base)
    smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(head_dim: int, theta: float, s: RopeScaling, max_positions: int) -> tuple[torch.Tensor, float]:
    original = s.original_max_position_embeddings or max_positions
    if s.attention_factor is not None:
        scale = s.attention_factor
    else:
        scale = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0

    def dim_for(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dim_for(s.beta_fast), dim_for(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # avoid a division by zero
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)  # [head_dim // 2]
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (s.factor * pos_freqs)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of each frequency left unscaled
    return interpolation * (1 - keep) + extrapolation * keep, float(scale)


def _longrope(head_dim: int, theta: float, factors: tuple[float, ...]) -> torch.Tensor:
    if len(factors) != head_dim // 2:
        raise ValueError(f"longrope needs {head_dim // 2} factors, got {len(factors)}")
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_angles(
    head_dim: int, theta: float, s: RopeScaling, max_positions: int
) -> tuple[torch.Tensor, float]:
    """Angles [max_positions, head_dim // 2] (float32) and the attention scaling factor."""
    inv_freq, scale = inv_freq_and_scale(head_dim, theta, s, max_positions)
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    if s.kind == "longrope" and s.original_max_position_embeddings is not None:
        start = s.original_max_position_embeddings
        freqs[start:] = torch.outer(t[start:], _longrope(head_dim, theta, s.long_factor))
    return freqs, scale


class RotaryEmbedding(nn.Module):
    """cos/sin tables [max_positions, head_dim] (float32) and the rotation itself.

    The model looks the tables up once per step (:meth:`lookup`) and every layer reuses
    the result (:meth:`forward`); :meth:`rotate` does both for one q/k pair.
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: RopeScaling,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        freqs, scale = rope_angles(head_dim, theta, scaling, max_positions)  # [max_positions, head_dim // 2]
        self.attention_scaling = scale
        self.dim = head_dim  # rotated dims per head; a wider head passes the rest through
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, head_dim]
        self.half = head_dim // 2
        sin = emb.sin() * scale
        self.register_buffer("cos", (emb.cos() * scale).to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)
        # rotate_half(x) * sin == roll(x, half) * signed_sin: negation is exact, so rotating with
        # one roll instead of a negation and a concatenation gives the same bits.
        signed = torch.cat([-sin[:, : self.half], sin[:, self.half :]], dim=-1)
        self.register_buffer("signed_sin", signed.to(device), persistent=False)
        self.max_positions = max_positions

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin [num_tokens, 1, head_dim] for positions [num_tokens] (int64)."""
        return self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)

    def forward(self, rotary: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Rotate x [num_tokens, heads, head_dim] by the tables from :meth:`lookup`.

        Queries and keys may be passed together as one tensor (heads = q heads + kv heads).
        Computed in float32, returned in x's dtype.
        """
        if x.shape[-1] != self.dim:  # partial rotary
            return torch.cat([self(rotary, x[..., : self.dim]), x[..., self.dim :]], dim=-1)
        cos, signed_sin = rotary  # [num_tokens, 1, head_dim] each
        if x.dtype == torch.float32:  # no casts (each would still be an op call)
            return x * cos + x.roll(self.half, dims=-1) * signed_sin
        xf = x.float()
        return (xf * cos + xf.roll(self.half, dims=-1) * signed_sin).to(x.dtype)

    def rotate(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (q, k), each in q's dtype."""
        rotary = self.lookup(positions)
        return self(rotary, q), self(rotary, k).to(q.dtype)
