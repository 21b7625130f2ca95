"""Writes a transformers model into a GGUF file as llama.cpp's converter lays it out: its
metadata keys, tensor names and norm convention, float32 tensors and a byte-level BPE
vocabulary, so the engine's GGUF path can be checked on random tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

ARCHES = {"qwen3": "qwen3", "phi3": "phi3", "gemma3_text": "gemma3"}  # model_type -> GGUF architecture


def _rope_theta(config) -> float:  # of the global layers
    params = config.rope_parameters
    params = params.get("full_attention", params)
    return float(params["rope_theta"])


def write_gguf(hf: transformers.PreTrainedModel, path: Path) -> Path:
    from gguf import GGUFWriter, RopeScalingType
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    config = hf.config
    arch = ARCHES[config.model_type]
    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny-" + arch)
    values = {
        "rope_theta": _rope_theta(config),
        "rms_norm_eps": config.rms_norm_eps,
    }
    for gguf_key, hf_key in GGUF_CONFIG_MAPPING[arch].items():
        if hf_key is None:
            continue
        value = values.get(hf_key, getattr(config, hf_key, None))
        if value is None:
            continue
        key = f"{arch}.{gguf_key}"
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    partial = rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
    writer.add_rope_dimension_count(int(head_dim * partial))
    if rope.get("rope_type") == "longrope":  # llama.cpp's Phi-3: factors as tensors
        writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
        for kind in ("long", "short"):
            factors = np.array(rope[f"{kind}_factor"], dtype=np.float32)
            writer.add_tensor(f"rope_factors_{kind}.weight", factors)
    full = rope.get("full_attention", {})
    if full.get("rope_type") == "linear":  # llama.cpp's Gemma 3: the global layers' scaling
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    # A byte-level BPE vocabulary of single characters (no merges).
    symbols = list(bytes_to_unicode().values())[: config.vocab_size]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(symbols)
    writer.add_token_types([1] * len(symbols))
    writer.add_token_scores([0.0] * len(symbols))
    writer.add_token_merges([])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)

    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    names = {hf_name: gguf_name for gguf_name, hf_name in get_gguf_hf_weights_map(hf, processor).items()}
    for hf_name, tensor in hf.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().float()
        if arch == "gemma3" and "norm.weight" in hf_name:
            data = data + 1  # llama.cpp stores Gemma's norms as 1 + weight
        writer.add_tensor(names[hf_name], np.ascontiguousarray(data.numpy(), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_from_gguf(path: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    ).eval()
