"""What transformers' GGUF loader leaves out of a model's config, read back from the file.

transformers maps a fixed set of llama.cpp metadata keys to config fields and ignores the
rest. For two families the rest changes the model: Phi-3 / Phi-4-mini files keep their
rotated dims per head (``rope.dimension_count``, partial rotary) and long-rope factors
(the ``rope_factors_short`` / ``rope_factors_long`` tensors and
``rope.scaling.original_context_length``), and Gemma 3 files their global layers' linear
rope scaling (``rope.scaling.type`` and ``.factor``). Without them the converted model
rotates differently from the checkpoint the file was made from. Their conversion writes
these back into ``config.json`` (in transformers 5's ``rope_parameters`` layout).

Sliding windows likewise: a Phi-3 file's ``attention.sliding_window`` is restored, and a
Mistral file (llama.cpp's "llama" architecture, which has no window) gets none, where
transformers would give it MistralConfig's default of 4096 (right for v0.1 only), so it
runs as llama.cpp runs it.
Qwen3's ``attention.key_length`` is not needed: transformers' default head_dim (128) is
every released Qwen3's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from parrot.engines.builtin.model.model_config import FAMILIES
from parrot.engines.protocol.errors import ModelLoadError

# llama.cpp's general.architecture -> the model_type transformers converts it to
# (Mistral files say "llama" too)
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma3": "gemma3_text",
}
assert set(GGUF_ARCHITECTURES.values()) <= set(FAMILIES)


def check_gguf_architecture(path: Path) -> None:
    """Refuse, before converting it, a GGUF file of a family the engine does not run."""
    from gguf import GGUFReader

    arch = _field(GGUFReader(str(path)), "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} in {path.name}; the builtin engine runs "
            f"{', '.join(GGUF_ARCHITECTURES)} files (model types {', '.join(FAMILIES)})"
        )


def restore_gguf_settings(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a converted model's ``config.json`` dict) with the file's rope settings."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch == "phi3":
        return _phi3(reader, config)
    if arch == "gemma3":
        return _gemma3(reader, config)
    if arch == "llama" and config.get("model_type") == "mistral":
        return {**config, "sliding_window": None}
    return config


def _field(reader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _tensor(reader, name: str) -> list[float] | None:
    tensor = next((t for t in reader.tensors if t.name == name), None)
    return None if tensor is None else np.array(tensor.data, dtype=np.float32).reshape(-1).tolist()


def _phi3(reader, config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    rope = dict(config.get("rope_parameters") or {})
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rotary = _field(reader, "phi3.rope.dimension_count")
    if rotary and int(rotary) != head_dim:
        rope["partial_rotary_factor"] = config["partial_rotary_factor"] = int(rotary) / head_dim
    short, long = _tensor(reader, "rope_factors_short.weight"), _tensor(reader, "rope_factors_long.weight")
    original = _field(reader, "phi3.rope.scaling.original_context_length")
    if short is not None and long is not None:
        # The attention factor llama.cpp stores is the default that transformers derives.
        rope |= {"rope_type": "longrope", "short_factor": short, "long_factor": long}
        if original:
            rope["original_max_position_embeddings"] = config["original_max_position_embeddings"] = int(
                original
            )
    window = _field(reader, "phi3.attention.sliding_window")
    return {**config, "rope_parameters": rope, "sliding_window": int(window) if window else None}


def _gemma3(reader, config: dict[str, Any]) -> dict[str, Any]:
    kind, factor = _field(reader, "gemma3.rope.scaling.type"), _field(reader, "gemma3.rope.scaling.factor")
    if kind != "linear" or not factor or float(factor) == 1.0:
        return config
    rope = dict(config.get("rope_parameters") or {})
    full = dict(rope.get("full_attention") or {})
    rope["full_attention"] = {**full, "rope_type": "linear", "factor": float(factor)}
    return {**config, "rope_parameters": rope}
