"""Decode steps of the CPU model in one C++ call: the CPU's counterpart of CUDA graphs.

On the CPU a small model's decode step is bound by the op calls of eager torch, not by its
products: at batch 1 the bundled model's packed kernels take about 6 ms of a 13.8 ms step,
the other ~8 ms are some 1,400 small ops (norms, rotary, attention glue, casts, residuals),
each a few microseconds of Python and dispatch (docs/benchmarks.md, issue 25). Here the
whole step runs in ``csrc/decode_step.cpp``: the layers loop in C++, the packed int4/int8
products stay torch's own kernels, and the small ops are plain loops over the step's rows.

The step is part of the engine's C++ extension (native.py: compiled once, where it cannot
be, the engine logs why and runs every step eagerly).

Which steps qualify: every item computes a few tokens at most (a decode, the text
jump-forward forces, a short fill; each token a row attending the keys before it) or none
(it only samples), and the step takes no shared-prefix group (whose prefix the eager path
attends once for the whole group).
Which models: float32 activations on the CPU with packed weights (``gguf``, ``int4``,
``int8``: the defaults there), in the families without Gemma's layout (its norms, GeGLU,
sliding windows): Llama, Mistral, Qwen2, Qwen3, Phi-3. The exact mode keeps the eager path, whose products
are token-identical to transformers'. The fused step computes what the eager one does, in
the same precisions; its float32 sums run in another order, so a bfloat16-rounded kernel
input may differ by one unit in the last place (tests bound the difference). The KV cache
may be float32 or bfloat16 (``--kv-dtype``): keys and values are rounded as the eager step
rounds them when storing, and widened to float32 when read.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, stage_decodes, takes_shared_prefix
from parrot.engines.builtin.context_pool import ContextPool
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.model.llama import LlamaForCausalLM
from parrot.engines.builtin.model.quant import Int4Linear, Int8Linear, PackedLinear
from parrot.engines.builtin.native import load_extension

log = logging.getLogger(__name__)

INT4, INT8 = 0, 1  # the C++ Linear's kinds
# A fused step's rows (tokens) at most, and an item's: jump-forward's forced text and short
# fills stay fused (their rows attend the keys before them, as in a prefill); a longer
# prompt is a prefill for the eager step's attention kernel.
MAX_ROWS, MAX_ITEM_TOKENS = 64, 16
KV_DTYPES = (torch.float32, torch.bfloat16)  # the caches the C++ step reads


def unsupported_reason(model: LlamaForCausalLM, device: torch.device) -> str | None:
    """Why this model's decode steps cannot run fused (None: they can)."""
    config = model.config
    if device.type != "cpu":
        return "not on the CPU"
    if model.embed_tokens.weight.dtype != torch.float32:
        return "activations are not float32"
    if config.gemma_norms or model.embed_scale is not None or model.windows or model.local_rope:
        return f"the {config.name} family's layout (Gemma norms, scaled embeddings or sliding windows)"
    if config.hidden_act != "silu":
        return f"the {config.hidden_act} activation"
    if not all(isinstance(linear, PackedLinear) for layer in model.layers for linear in _projections(layer)):
        return "unpacked weights (--weights exact)"
    return None


class FusedDecodeStep:
    """The model's weights handed to the C++ step once, and the step's inputs built per call."""

    kind = "fused"

    def __init__(
        self, model: LlamaForCausalLM, pool: ContextPool, policy: SharedPrefixPolicy, extension
    ) -> None:
        config = model.config
        self.pool = pool
        self.policy = policy
        self.block_size = pool.block_size
        scale = config.attn_scale or config.head_dim**-0.5
        self.step = extension.DecodeModel(
            config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
            config.intermediate_size, config.rms_norm_eps, scale,
            model.embed_tokens.weight, model.norm.weight, model.rope.cos, model.rope.signed_sin,
        )  # fmt: skip
        for layer in model.layers:
            attn = layer.self_attn
            q_norm = attn.q_norm.weight if attn.qk_norm else None
            k_norm = attn.k_norm.weight if attn.qk_norm else None
            self.step.add_layer(
                layer.input_layernorm.weight, layer.post_attention_layernorm.weight, q_norm, k_norm,
                *(_linear(extension, linear) for linear in _projections(layer)),
            )  # fmt: skip

    def fits(self, items: list[StepItem]) -> bool:
        """Whether this step runs fused: items of a few tokens (decodes, the tokens
        jump-forward forces, a short fill) or none (sampling only), no shared-prefix group.
        A longer prompt is a prefill: the eager step's attention kernel does it better."""
        rows = sum(item.num_tokens for item in items)
        if not rows or rows > MAX_ROWS or any(item.num_tokens > MAX_ITEM_TOKENS for item in items):
            return False
        return not takes_shared_prefix(items, self.block_size, self.policy, torch.device("cpu"))

    def run(self, items: list[StepItem]) -> torch.Tensor:
        """The items' final-normed last hidden rows [len(items), hidden] (garbage for an item
        that computes nothing); the KV of every token is stored."""
        bs = self.block_size
        rows = sum(item.num_tokens for item in items)
        width = max(item.start + item.num_tokens - 1 for item in items if item.num_tokens) // bs + 1
        vectors = np.empty((4, rows), dtype=np.int64)  # ids, positions, slots, kv lens
        table = np.zeros((rows, width), dtype=np.int64)  # [rows, blocks]
        last = stage_decodes(items, bs, vectors, table)
        ids, positions, slots, kv_lens = torch.from_numpy(vectors)
        cache = self.pool.kv_cache
        hidden = self.step.step(ids, positions, slots, torch.from_numpy(table), kv_lens, cache, bs)
        if rows == len(items):  # one token an item: the rows are the items'
            return hidden
        return hidden[torch.tensor([max(row, 0) for row in last])]  # [len(items), hidden]


def _projections(layer) -> tuple:
    """A decoder layer's four products, in the order the C++ layer takes them."""
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _linear(extension, linear: PackedLinear):
    if isinstance(linear, Int4Linear):
        weights = (INT4, linear.weight_int4, linear.scale_zero, linear.group_size)
    elif isinstance(linear, Int8Linear):
        weights = (INT8, linear.weight_int8, linear.scales, 0)
    else:
        raise TypeError(f"no fused product for {type(linear).__name__}")
    fused = extension.Linear(*weights, linear.dense, linear.dense_rows, linear.bias)
    if linear.int_rows:  # (int4: codes, d, m; int8: codes, scales)
        codes, scales, *offsets = linear.int_weights
        fused.use_int8_activations(linear.int_rows, codes, scales, offsets[0] if offsets else None)
    return fused


def fused_decode_step(
    model: LlamaForCausalLM, pool: ContextPool, config: EngineConfig, device: torch.device
) -> FusedDecodeStep | None:
    """The engine's fused step, or None (the reason logged) where it is off or cannot run."""
    reason = "--no-fused-decode" if not config.fused_decode else unsupported_reason(model, device)
    if reason is None and pool.kv_cache.dtype not in KV_DTYPES:
        reason = f"the KV cache is {pool.kv_cache.dtype}"
    if reason is not None:
        log.info("decode steps run eagerly: %s", reason)
        return None
    extension = load_extension()
    return None if extension is None else FusedDecodeStep(model, pool, config.shared_prefix, extension)
