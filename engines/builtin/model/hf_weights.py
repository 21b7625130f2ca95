"""transformers-named checkpoint weights into the engine's decoder, per family.

q/k/v and gate/up are stored fused in the decoder: Phi-3 checkpoints hold them fused
already, the other families' are concatenated here. Gemma's norms scale by
``(1 + weight)``; the 1 is added here (in float32), so the decoder runs one RMSNorm.
"""

from __future__ import annotations

import torch
from torch import nn

from parrot.engines.protocol.errors import ModelLoadError


def load_hf_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (transformers names) into ``model``; every weight must be used."""
    config = model.config
    own = model.state_dict()
    done: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise ModelLoadError(f"weight {name!r} is missing from the checkpoint")
        done.add(name)
        return state[name]

    def put(name: str, tensor: torch.Tensor) -> None:
        if own[name].shape != tensor.shape:
            raise ModelLoadError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(own[name].shape)}"
            )
        own[name].copy_(tensor)

    def put_norm(name: str, tensor: torch.Tensor) -> None:
        put(name, tensor.float() + 1 if config.gemma_norms else tensor)

    def fused(module: str, name: str, parts: tuple[str, ...], kind: str) -> torch.Tensor:
        if config.architecture == "phi3":  # the checkpoint holds it fused, under the fused name
            return take(f"{module}{name}.{kind}")
        return torch.cat([take(f"{module}{part}.{kind}") for part in parts])

    norms = ["input_layernorm", "post_attention_layernorm"]
    if config.gemma_norms:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    with torch.no_grad():
        put("embed_tokens.weight", take("model.embed_tokens.weight"))
        put_norm("norm.weight", take("model.norm.weight"))
        if model.lm_head is not None:
            head = state.get("lm_head.weight")
            put("lm_head.weight", head if head is not None else take("model.embed_tokens.weight"))
            done.add("lm_head.weight")
        for i in range(config.num_layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            for norm in norms:
                put_norm(f"{dst}{norm}.weight", take(f"{src}{norm}.weight"))
            attn = f"{src}self_attn."
            qkv = ("q_proj", "k_proj", "v_proj")
            put(f"{dst}self_attn.qkv_proj.weight", fused(attn, "qkv_proj", qkv, "weight"))
            if config.qkv_bias:
                put(f"{dst}self_attn.qkv_proj.bias", fused(attn, "qkv_proj", qkv, "bias"))
            put(f"{dst}self_attn.o_proj.weight", take(f"{attn}o_proj.weight"))
            if config.o_bias:
                put(f"{dst}self_attn.o_proj.bias", take(f"{attn}o_proj.bias"))
            if config.qk_norm:
                for norm in ("q_norm", "k_norm"):
                    put_norm(f"{dst}self_attn.{norm}.weight", take(f"{attn}{norm}.weight"))
            mlp = f"{src}mlp."
            gate_up = ("gate_proj", "up_proj")
            put(f"{dst}mlp.gate_up_proj.weight", fused(mlp, "gate_up_proj", gate_up, "weight"))
            put(f"{dst}mlp.down_proj.weight", take(f"{mlp}down_proj.weight"))
            if config.mlp_bias:
                put(f"{dst}mlp.gate_up_proj.bias", fused(mlp, "gate_up_proj", gate_up, "bias"))
                put(f"{dst}mlp.down_proj.bias", take(f"{mlp}down_proj.bias"))
    ignored = {k for k in state if k not in done and not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        ignored.discard("lm_head.weight")
    if ignored:
        raise ModelLoadError(f"checkpoint has weights this model does not use: {sorted(ignored)[:5]}")
