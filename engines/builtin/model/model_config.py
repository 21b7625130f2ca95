"""Model architecture settings read from a Hugging Face ``config.json``.

One decoder covers every supported family; what sets them apart is a handful of fields
here (q/k norms, Gemma's norm layout and scaled embeddings, sliding-window layers, partial
rotary, final soft-capping), each read from the config the way transformers' modeling file of
that family reads it. Defaults for absent fields follow what transformers itself does with
the same file, so both compute the same model. Rotary settings: rope_config.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parrot.engines.builtin.model.rope_config import (
    FULL,
    LONGROPE,
    ROPE_KINDS,
    SLIDING,
    RopeScaling,
    number,
    rope_params_by_layer_type,
    rope_theta,
)
from parrot.engines.protocol.errors import ModelLoadError

__all__ = ["SUPPORTED", "ModelConfig", "RopeScaling", "read_eos_token_ids"]

# model_type -> the transformers class of a checkpoint of that family (its "architectures")
FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
SUPPORTED = tuple(FAMILIES)
# Exact class names only: a substring match would let e.g. Qwen2MoeForCausalLM through.
ARCHITECTURE_CLASSES = {cls.lower(): model_type for model_type, cls in FAMILIES.items()}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def _architecture(d: dict[str, Any]) -> str:
    model_type = str(d.get("model_type") or "").lower()
    if model_type in SUPPORTED:
        return model_type
    classes = [str(c) for c in d.get("architectures") or []]
    for cls_name in classes:
        if cls_name.lower() in ARCHITECTURE_CLASSES:
            return ARCHITECTURE_CLASSES[cls_name.lower()]
    families = ", ".join(f"{t} ({c})" for t, c in FAMILIES.items())
    raise ModelLoadError(
        f"unsupported model type {model_type or '(none)'!r} (architectures {classes}); "
        f"the builtin engine runs these model types (transformers classes): {families}"
    )


def _int_ids(value: Any, what: str) -> tuple[int, ...]:
    values = value if isinstance(value, list | tuple) else [value]
    try:
        return tuple(int(v) for v in values if v is not None)
    except (TypeError, ValueError):
        raise ModelLoadError(f"{what} must be an integer or a list of integers, got {value!r}") from None


def _optional_number(d: dict[str, Any], key: str) -> float | None:
    return None if d.get(key) is None else number(d[key], key)


def _layer_types(arch: str, d: dict[str, Any], layers: int) -> tuple[str, ...]:
    """Per layer ``full_attention`` or ``sliding_attention``, as transformers assigns them.

    transformers 5 writes ``layer_types``; older files give Gemma 3's pattern (every
    ``sliding_window_pattern``-th layer global) or Qwen's ``use_sliding_window`` with
    ``max_window_layers``. Mistral and Phi-3 window every layer when they have a
    ``sliding_window`` (Mistral 7B v0.1: 4096; Phi-3-mini-4k: 2047).
    """
    types = d.get("layer_types")
    if types is None:
        if arch == "gemma3_text":
            pattern = int(d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 6)
            types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]
        elif arch in ("qwen2", "qwen3") and d.get("use_sliding_window"):
            first = int(d.get("max_window_layers") or 0)
            types = [SLIDING if i >= first else FULL for i in range(layers)]
        elif arch in ("mistral", "phi3") and d.get("sliding_window"):
            types = [SLIDING] * layers
        else:
            return ()
    types = tuple(str(t) for t in types)
    if len(types) != layers or not set(types) <= {FULL, SLIDING}:
        raise ModelLoadError(f"layer_types must name {FULL!r} or {SLIDING!r} for each of {layers} layers")
    if SLIDING in types and not d.get("sliding_window"):
        raise ModelLoadError("sliding-attention layers need a positive 'sliding_window'")
    return types if SLIDING in types else ()


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # a model_type of FAMILIES
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
    qkv_bias: bool  # Qwen2 always; Llama, Qwen3, Gemma 3: attention_bias
    o_bias: bool  # attention_bias covers o_proj too (Llama, Qwen3, Gemma 3); never for Qwen2 / Mistral
    mlp_bias: bool  # Llama only
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = field(default=())
    name: str = "model"  # short display name: folder name or GGUF file stem
    hidden_act: str = "silu"  # the gate's activation: silu (SwiGLU) | gelu_pytorch_tanh (GeGLU)
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k before the rotation
    # Gemma: norms scale by (1 + weight); each layer also norms the attention and MLP outputs
    # (post_attention_layernorm, post_feedforward_layernorm) and the MLP input has its own norm.
    gemma_norms: bool = False
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size)
    attn_scale: float | None = None  # None: head_dim ** -0.5; Gemma: query_pre_attn_scalar ** -0.5
    # Gemma: logits -> cap * tanh(logits / cap). (Gemma 3 has no attention soft-capping: its
    # attn_logit_softcapping is ignored by transformers' Gemma 3 too, q/k norms replaced it.)
    final_softcap: float | None = None
    rotary_dim: int | None = None  # partial rotary: the leading dims of each head rotated; None: all
    # Per layer full_attention | sliding_attention; () when every layer attends in full.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None  # a sliding layer's query sees the keys less than this behind it
    local_rope_theta: float | None = None  # sliding layers' rope, where it differs (Gemma 3)
    local_rope_scaling: RopeScaling = field(default_factory=RopeScaling)

    def window(self, layer: int) -> int | None:
        """How far back the layer attends (None: everything)."""
        if self.layer_types and self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    @property
    def has_local_rope(self) -> bool:
        return self.local_rope_theta is not None

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

        ropes = rope_params_by_layer_type(d)
        rope = ropes[FULL]
        rotary_dim = _rotary_dim(arch, rope, d, head_dim)
        kinds = (*ROPE_KINDS, LONGROPE) if arch == "phi3" else ROPE_KINDS
        layer_types = _layer_types(arch, d, layers)
        local = ropes[SLIDING] if arch == "gemma3_text" and SLIDING in layer_types else None
        act = str(d.get("hidden_activation") or d.get("hidden_act") or "silu")
        if act not in ACTIVATIONS:
            raise ModelLoadError(
                f"unsupported activation {act!r}; the builtin engine runs {list(ACTIVATIONS)}"
            )
        attention_bias = bool(d.get("attention_bias", False))
        gemma = arch == "gemma3_text"
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=number(d.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
            rope_theta=rope_theta(rope, d),
            rope_scaling=RopeScaling.from_hf(rope, max_pos, d, kinds),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),
            # Bias layout as in transformers' modeling files of each family.
            qkv_bias=attention_bias if arch in ("llama", "qwen3", "gemma3_text") else arch == "qwen2",
            o_bias=attention_bias if arch in ("llama", "qwen3", "gemma3_text") else False,
            mlp_bias=bool(d.get("mlp_bias", False)) if arch == "llama" else False,
            bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
            eos_token_ids=_int_ids(d.get("eos_token_id"), "eos_token_id"),
            name=name,
            hidden_act=act,
            qk_norm=arch in ("qwen3", "gemma3_text"),
            gemma_norms=gemma,
            embed_scale=hidden**0.5 if gemma else None,
            attn_scale=number(d.get("query_pre_attn_scalar", 256), "query_pre_attn_scalar") ** -0.5
            if gemma
            else None,
            final_softcap=_optional_number(d, "final_logit_softcapping") if gemma else None,
            rotary_dim=rotary_dim,
            layer_types=layer_types,
            sliding_window=int(d["sliding_window"]) if layer_types else None,
            local_rope_theta=None if local is None else rope_theta(local, {}),
            local_rope_scaling=RopeScaling() if local is None else RopeScaling.from_hf(local, max_pos, d),
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


def _rotary_dim(arch: str, rope: dict[str, Any], d: dict[str, Any], head_dim: int) -> int | None:
    """Rotated dims per head for a partial rotary factor (Phi-3 style), None for all."""
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if partial is None or float(partial) == 1.0:
        return None
    if arch != "phi3":
        raise ModelLoadError(
            f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported for {arch!r}"
        )
    dim = int(head_dim * number(partial, "partial_rotary_factor"))  # transformers' rounding
    if dim <= 0 or dim % 2:
        raise ModelLoadError(
            f"partial_rotary_factor={partial} leaves {dim} rotary dims; need a positive even number"
        )
    return dim
