"""Random tiny models of the families beyond Llama/Mistral/Qwen2 (Qwen3, Phi-3 / Phi-4-mini,
Gemma 3) for the tests against transformers, and our engine's logits and greedy tokens on
them."""

from __future__ import annotations

import torch
import transformers
from test_model_correctness import SMALL, load_ours, run_chunks

from parrot.engines.builtin.context_pool import Context

TOKENS = 45  # longer than the Gemma configs' window, over blocks of 4
CHUNKS = [17, 20, 1, 1, 1, 1, 1, 1, 1, 1]
GEMMA = dict(SMALL, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
FAMILIES = {
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=24, tie_word_embeddings=False),
    "qwen3-tied-bias": lambda: transformers.Qwen3Config(
        **SMALL, head_dim=16, tie_word_embeddings=True, attention_bias=True
    ),
    "phi3": lambda: transformers.Phi3Config(**SMALL, pad_token_id=0, eos_token_id=1, bos_token_id=2),
    "phi4-mini-partial-longrope": lambda: transformers.Phi3Config(
        **{**SMALL, "max_position_embeddings": 512},
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
        partial_rotary_factor=0.75,
        original_max_position_embeddings=64,  # the sequences stay below: the short factors
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(6)],
            "long_factor": [2.0 + i for i in range(6)],
        },
    ),
    "gemma3": lambda: transformers.Gemma3TextConfig(**GEMMA, query_pre_attn_scalar=24),
    "gemma3-softcap-linear-rope": lambda: transformers.Gemma3TextConfig(
        **GEMMA,
        attn_logit_softcapping=2.0,  # ignored by transformers' Gemma 3, and so by the engine
        final_logit_softcapping=3.0,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


def random_hf(config) -> transformers.PreTrainedModel:
    """A transformers model with random weights everywhere, norms and biases included, so a
    norm or bias the engine skipped (or Gemma's 1 + weight) shows in the logits."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_(0.0, 0.3)
            else:
                param.normal_(0.0, 0.15)
    return hf


def our_logits(folder, tokens: list[int], chunks: list[int]) -> torch.Tensor:
    model, pool = load_ours(folder)
    ctx = Context(context_id=1, token_ids=list(tokens), materialized=True)
    pool.contexts[1] = ctx
    return run_chunks(model, pool, ctx, chunks)


def our_greedy(folder, prompt: list[int], n: int) -> list[int]:
    model, pool = load_ours(folder)
    ctx = Context(context_id=1, token_ids=list(prompt), materialized=True)
    pool.contexts[1] = ctx
    logits = run_chunks(model, pool, ctx, [len(prompt)])
    out = []
    for _ in range(n):
        token = int(logits[-1].argmax())
        out.append(token)
        ctx.token_ids.append(token)
        logits = run_chunks(model, pool, ctx, [1])
    return out


# GGUF files as llama.cpp writes them. transformers' GGUF loader reads no head_dim for Qwen3
# (it takes its default, 128, which every released Qwen3 has) and no query_pre_attn_scalar or
# layer pattern for Gemma 3 (its defaults again), so the configs here keep to what survives.
GGUF_FAMILIES = {
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=128, tie_word_embeddings=False),
    "phi3": FAMILIES["phi3"],
    "gemma3": lambda: transformers.Gemma3TextConfig(**{**GEMMA, "layer_types": None}),
}
