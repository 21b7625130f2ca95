"""Rotary settings read from a Hugging Face ``config.json``.

Both layouts are accepted: transformers 4 (``rope_theta`` and ``rope_scaling`` with
``type`` or ``rope_type``) and transformers 5 (``rope_parameters`` holding ``rope_theta``
and ``rope_type``, nested per layer type for models whose local and global layers rotate
differently, like Gemma 3). Defaults for absent fields follow what transformers itself does
with the same file, so both compute the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from parrot.engines.protocol.errors import ModelLoadError

ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")
LONGROPE = "longrope"  # Phi-3 / Phi-4-mini only: per-dimension factors, short and long
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer types


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"  # default | linear | dynamic | llama3 | yarn | longrope
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    # llama3 / yarn / longrope: the pretraining context; dynamic: the length past which NTK
    # scaling starts
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    # yarn (mscale; None = 0.1 * ln(factor) + 1), longrope (None = sqrt(1 + ln(factor) / ln(original)))
    attention_factor: float | None = None
    truncate: bool = True  # yarn: round the correction range to whole dimensions
    short_factor: tuple[float, ...] = ()  # longrope: per frequency, positions below the original length
    long_factor: tuple[float, ...] = ()  # longrope: per frequency, positions from the original length on

    @classmethod
    def from_hf(
        cls,
        params: dict[str, Any],
        max_positions: int,
        top_level: dict[str, Any],
        kinds: tuple[str, ...] = ROPE_KINDS,
    ) -> RopeScaling:
        """Scaling from a flat rope dict (``rope_parameters`` or ``rope_scaling``).

        ``top_level`` is the whole config: transformers lets a top-level
        ``original_max_position_embeddings`` (Phi-3 style) win over the one in the dict.
        ``kinds`` are the rope types the model's family runs.
        """
        kind = str(params.get("rope_type") or params.get("type") or "default").lower()
        if kind not in kinds:
            raise ModelLoadError(
                f"unsupported rope scaling type {kind!r}; the builtin engine supports {list(kinds)}"
            )
        if kind == "default":
            return cls()
        if kind == LONGROPE:
            return cls._longrope(params, max_positions, top_level)
        if params.get("factor") is None and kind != "yarn":
            raise ModelLoadError(f"rope scaling {kind!r} needs a 'factor'")
        original = top_level.get("original_max_position_embeddings") or params.get(
            "original_max_position_embeddings"
        )
        if kind == "dynamic":
            # transformers scales dynamic NTK relative to max_position_embeddings, whatever
            # the dict says.
            original = max_positions
        elif kind in ("llama3", "yarn"):
            original = original or max_positions
        else:
            original = None
        factor = params.get("factor")
        if factor is None:  # yarn (DeepSeek style): the factor is implied by the two lengths
            factor = max_positions / original
        factor = number(factor, "rope factor")
        if factor <= 0:
            raise ModelLoadError(f"rope scaling factor must be positive, got {factor}")
        attention_factor = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if kind == "yarn" and attention_factor is None and mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        return cls(
            kind=kind,
            factor=factor,
            low_freq_factor=number(params.get("low_freq_factor", 1.0), "low_freq_factor"),
            high_freq_factor=number(params.get("high_freq_factor", 4.0), "high_freq_factor"),
            original_max_position_embeddings=None if original is None else int(original),
            # transformers treats 0 / None as "use the default" here
            beta_fast=number(params.get("beta_fast") or 32.0, "beta_fast"),
            beta_slow=number(params.get("beta_slow") or 1.0, "beta_slow"),
            attention_factor=None if attention_factor is None else float(attention_factor),
            truncate=bool(params.get("truncate", True)),
        )

    @classmethod
    def _longrope(cls, params: dict[str, Any], max_positions: int, top_level: dict[str, Any]) -> RopeScaling:
        """As transformers' ``_compute_longrope_parameters``: the factor defaults to the ratio of
        the two context lengths, the attention factor to the paper's suggestion."""
        original = params.get("original_max_position_embeddings") or top_level.get(
            "original_max_position_embeddings"
        )
        original = int(original or max_positions)
        factor = params.get("factor")
        factor = max_positions / original if factor is None else number(factor, "rope factor")
        attention_factor = params.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        factors = {}
        for key in ("short_factor", "long_factor"):
            value = params.get(key)
            if not isinstance(value, list | tuple) or not value:
                raise ModelLoadError(f"rope scaling 'longrope' needs a list {key!r}")
            factors[key] = tuple(number(v, key) for v in value)
        return cls(
            kind=LONGROPE,
            factor=factor,
            original_max_position_embeddings=original,
            attention_factor=float(attention_factor),
            **factors,
        )


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def number(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ModelLoadError(f"{what} must be a number, got {value!r}") from None


def rope_params_by_layer_type(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat rope settings per layer type (``full_attention``, ``sliding_attention``).

    A transformers 5 file nests ``rope_parameters`` per layer type when they differ; a flat
    dict (or a transformers 4 file, whose ``rope_scaling`` holds the scaling and
    ``rope_theta`` sits at the top level) applies to every layer. Gemma 3's transformers 4
    layout names the local layers' theta ``rope_local_base_freq``; its local layers never scale.
    """
    params = d.get("rope_parameters")
    legacy = d.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        if value is not None and not isinstance(value, dict):
            raise ModelLoadError(f"{key} must be an object, got {value!r}")
    params = params or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        full = {**(legacy or {}), **params.get(FULL, next(iter(params.values())))}
        return {FULL: full, SLIDING: {**(legacy or {}), **params.get(SLIDING, full)}}
    # transformers 5 keeps everything in rope_parameters; a transformers 4 file only has
    # rope_scaling (and rope_theta at the top level).
    flat = {**(legacy or {}), **params}
    local = flat
    if d.get("rope_local_base_freq") is not None:
        local = {"rope_type": "default", "rope_theta": d["rope_local_base_freq"]}
    return {FULL: flat, SLIDING: local}


def rope_theta(params: dict[str, Any], d: dict[str, Any]) -> float:
    return number(params.get("rope_theta") or d.get("rope_theta") or 10000.0, "rope_theta")
