"""Model architecture settings read from a Hugging Face ``config.json``.

Both layouts of the rotary settings are accepted: transformers 4 (``rope_theta`` and
``rope_scaling`` with ``type`` or ``rope_type``) and transformers 5 (``rope_parameters``
holding ``rope_theta`` and ``rope_type``). Defaults for absent fields follow what
transformers itself does with the same file, so both compute the same model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parrot.engines.protocol.errors import ModelLoadError

SUPPORTED = ("llama", "mistral", "qwen2")
# Exact class names only: a substring match would let e.g. Qwen2MoeForCausalLM through.
ARCHITECTURE_CLASSES = {
    "llamaforcausallm": "llama",
    "mistralforcausallm": "mistral",
    "qwen2forcausallm": "qwen2",
}
ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"  # default | linear | dynamic | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    # llama3 / yarn: the pretraining context; dynamic: the length past which NTK scaling starts
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn (mscale); None = 0.1 * ln(factor) + 1
    truncate: bool = True  # yarn: round the correction range to whole dimensions

    @classmethod
    def from_hf(cls, params: dict[str, Any], max_positions: int, top_level: dict[str, Any]) -> RopeScaling:
        """Scaling from a flat rope dict (``rope_parameters`` or ``rope_scaling``).

        ``top_level`` is the whole config: transformers lets a top-level
        ``original_max_position_embeddings`` (Phi-3 style) win over the one in the dict.
        """
        kind = str(params.get("rope_type") or params.get("type") or "default").lower()
        if kind not in ROPE_KINDS:
            raise ModelLoadError(
                f"unsupported rope scaling type {kind!r}; the builtin engine supports {list(ROPE_KINDS)}"
            )
        if kind == "default":
            return cls()
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
        factor = _number(factor, "rope factor")
        if factor <= 0:
            raise ModelLoadError(f"rope scaling factor must be positive, got {factor}")
        attention_factor = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if kind == "yarn" and attention_factor is None and mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        return cls(
            kind=kind,
            factor=factor,
            low_freq_factor=_number(params.get("low_freq_factor", 1.0), "low_freq_factor"),
            high_freq_factor=_number(params.get("high_freq_factor", 4.0), "high_freq_factor"),
            original_max_position_embeddings=None if original is None else int(original),
            # transformers treats 0 / None as "use the default" here
            beta_fast=_number(params.get("beta_fast") or 32.0, "beta_fast"),
            beta_slow=_number(params.get("beta_slow") or 1.0, "beta_slow"),
            attention_factor=None if attention_factor is None else float(attention_factor),
            truncate=bool(params.get("truncate", True)),
        )


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _number(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ModelLoadError(f"{what} must be a number, got {value!r}") from None


def _architecture(d: dict[str, Any]) -> str:
    model_type = str(d.get("model_type") or "").lower()
    if model_type in SUPPORTED:
        return model_type
    classes = [str(c) for c in d.get("architectures") or []]
    for cls_name in classes:
        if cls_name.lower() in ARCHITECTURE_CLASSES:
            return ARCHITECTURE_CLASSES[cls_name.lower()]
    raise ModelLoadError(
        f"unsupported model type {model_type or '(none)'!r} (architectures {classes}); "
        f"the builtin engine runs {list(SUPPORTED)}"
    )


def _rope_params(d: dict[str, Any]) -> dict[str, Any]:
    """One flat dict of rope settings from either transformers layout."""
    params = d.get("rope_parameters")
    legacy = d.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        if value is not None and not isinstance(value, dict):
            raise ModelLoadError(f"{key} must be an object, got {value!r}")
    params = params or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        # transformers 5 nests per layer type (full_attention, sliding_attention, ...);
        # this engine has one rope for all layers.
        distinct = {json.dumps(v, sort_keys=True) for v in params.values()}
        if len(distinct) > 1:
            raise ModelLoadError("per-layer-type rope parameters differ; the builtin engine needs one rope")
        params = next(iter(params.values()))
    # transformers 5 keeps everything in rope_parameters; a transformers 4 file only has
    # rope_scaling (and rope_theta at the top level).
    return {**(legacy or {}), **params}


def _int_ids(value: Any, what: str) -> tuple[int, ...]:
    values = value if isinstance(value, list | tuple) else [value]
    try:
        return tuple(int(v) for v in values if v is not None)
    except (TypeError, ValueError):
        raise ModelLoadError(f"{what} must be an integer or a list of integers, got {value!r}") from None


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # llama | mistral | qwen2
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 always; Llama: attention_bias
    o_bias: bool  # Llama's attention_bias covers o_proj too; never for Qwen2 / Mistral
    mlp_bias: bool  # Llama only
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = field(default=())
    name: str = "model"  # short display name: folder name or GGUF file stem

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str) -> ModelConfig:
        """Parse a ``config.json`` dict; raises :class:`ModelLoadError` on anything unsupported."""
        arch = _architecture(d)
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            kv_heads = int(d.get("num_key_value_heads") or heads)
            layers = int(d["num_hidden_layers"])
            inter = int(d["intermediate_size"])
            vocab = int(d["vocab_size"])
            max_pos = int(d["max_position_embeddings"])
            head_dim = int(d.get("head_dim") or 0)
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks the required field {missing.args[0]!r}") from None
        except (TypeError, ValueError) as error:
            raise ModelLoadError(f"config.json has a malformed size field: {error}") from None
        sizes = {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads}
        sizes |= {"num_hidden_layers": layers, "intermediate_size": inter, "vocab_size": vocab}
        sizes |= {"max_position_embeddings": max_pos}
        for key, value in sizes.items():
            if value <= 0:
                raise ModelLoadError(f"config.json field {key!r} must be positive, got {value}")
        if heads % kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            )
        if not head_dim:
            if hidden % heads:
                raise ModelLoadError(
                    f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})"
                )
            head_dim = hidden // heads
        if head_dim % 2:
            raise ModelLoadError(f"head_dim must be even for rotary embeddings, got {head_dim}")

        rope = _rope_params(d)
        partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
        if partial is not None and float(partial) != 1.0:
            raise ModelLoadError(
                f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported"
            )
        theta = _number(rope.get("rope_theta") or d.get("rope_theta") or 10000.0, "rope_theta")
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_number(d.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
            rope_theta=theta,
            rope_scaling=RopeScaling.from_hf(rope, max_pos, d),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # Bias layout as in transformers' modeling files of each family.
            qkv_bias={"llama": attention_bias, "mistral": False, "qwen2": True}[arch],
            o_bias=attention_bias if arch == "llama" else False,
            mlp_bias=bool(d.get("mlp_bias", False)) if arch == "llama" else False,
            bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
            eos_token_ids=_int_ids(d.get("eos_token_id"), "eos_token_id"),
            name=name,
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        """Read ``config.json``; ``generation_config.json`` may add end-of-sequence ids."""
        folder = Path(folder)
        d = _read_json(folder / "config.json", required=True)
        d = {**d, "eos_token_id": list(read_eos_token_ids(folder, d))}
        marker = folder / "parrot_model_name"  # written by the GGUF converter
        name = marker.read_text().strip() if marker.is_file() else folder.name
        return cls.from_hf_dict(d, name)


def read_eos_token_ids(folder: Path, config: dict[str, Any] | None = None) -> tuple[int, ...]:
    """End-of-sequence ids of config.json and generation_config.json together (sorted)."""
    folder = Path(folder)
    if config is None:
        config = _read_json(folder / "config.json", required=False)
    generation = _read_json(folder / "generation_config.json", required=False)
    ids = set(_int_ids(config.get("eos_token_id"), "eos_token_id"))
    ids |= set(_int_ids(generation.get("eos_token_id"), "generation_config eos_token_id"))
    return tuple(sorted(ids))


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelLoadError(f"{path.parent} has no {path.name}")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data
