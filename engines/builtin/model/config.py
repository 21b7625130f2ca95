"""Model architecture settings read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from parrot.engines.protocol.errors import ModelLoadError

SUPPORTED = {"llama", "mistral", "qwen2"}
ROPE_KINDS = {"default", "linear", "dynamic", "llama3", "yarn"}


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"  # default | linear | dynamic | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3 / yarn / dynamic
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None = 0.1 * ln(factor) + 1

    @classmethod
    def from_hf(cls, d: dict | None, max_positions: int) -> RopeScaling:
        if not d:
            return cls()
        kind = d.get("rope_type", d.get("type", "default")) or "default"
        if kind not in ROPE_KINDS:
            raise ModelLoadError(f"unsupported rope scaling type {kind!r}; supported: {sorted(ROPE_KINDS)}")
        return cls(
            kind=kind,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=d.get("original_max_position_embeddings"),
            beta_fast=float(d.get("beta_fast", 32.0)),
            beta_slow=float(d.get("beta_slow", 1.0)),
            attention_factor=d.get("attention_factor"),
        )


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
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = field(default=())
    name: str = "model"

    @classmethod
    def from_hf_dict(cls, d: dict, name: str) -> ModelConfig:
        arch = str(d.get("model_type", "")).lower()
        if arch not in SUPPORTED:
            archs = " ".join(d.get("architectures") or []).lower()
            arch = next((a for a in SUPPORTED if a in archs), arch)
        if arch not in SUPPORTED:
            raise ModelLoadError(
                f"unsupported model type {arch or '(none)'!r}; supported: {sorted(SUPPORTED)}"
            )
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            kv_heads = int(d.get("num_key_value_heads") or heads)
            layers = int(d["num_hidden_layers"])
            inter = int(d["intermediate_size"])
            vocab = int(d["vocab_size"])
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks the field {missing.args[0]!r}") from None
        if heads % kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            )
        max_pos = int(d.get("max_position_embeddings", 2048))
        rope_params = d.get("rope_parameters") or {}
        theta = float(rope_params.get("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = d.get("rope_scaling") or (
            rope_params if rope_params.get("rope_type", "default") != "default" else None
        )
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=RopeScaling.from_hf(scaling, max_pos),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=True if arch == "qwen2" else attention_bias,
            o_bias=False if arch == "qwen2" else attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=name,
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        folder = Path(folder)
        path = folder / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no config.json")
        d = json.loads(path.read_text())
        gen = folder / "generation_config.json"
        if gen.is_file():
            extra = json.loads(gen.read_text()).get("eos_token_id")
            if extra is not None:
                ids = set(
                    d.get("eos_token_id")
                    if isinstance(d.get("eos_token_id"), list)
                    else [d.get("eos_token_id")]
                )
                ids |= set(extra if isinstance(extra, list) else [extra])
                d = {**d, "eos_token_id": sorted(i for i in ids if i is not None)}
        name = (
            (folder / "parrot_model_name").read_text().strip()
            if (folder / "parrot_model_name").is_file()
            else folder.name
        )
        return cls.from_hf_dict(d, name)
