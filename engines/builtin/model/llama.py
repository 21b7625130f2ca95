"""The decoder of every supported family over a paged KV cache.

Llama, Mistral, Qwen2 and the families that vary it: Qwen3 (per-head q/k RMSNorm), Gemma 3
(scaled embeddings, (1 + weight) norms around both blocks, GeGLU, sliding-window layers
with their own rope, a query scale of its own, optional final soft-capping) and Phi-3 /
Phi-4-mini (partial rotary, long-rope). GQA, RoPE with scaling, tied embeddings. q/k/v
and gate/up projections are fused into one matrix each at load time, so a layer is a
handful of large matmuls. What a family changes is read from :class:`ModelConfig`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from parrot.engines.builtin.attention.base import AttentionBackend, AttentionBatch, LayerAttention
from parrot.engines.builtin.attention.window import windowed
from parrot.engines.builtin.model.blas_linear import MatmulRoute
from parrot.engines.builtin.model.cpu_paths import DenseChoice
from parrot.engines.builtin.model.hf_weights import load_hf_weights
from parrot.engines.builtin.model.int_dot import IntDotChoice
from parrot.engines.builtin.model.layers import MLP, RMSNorm
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model.rope import RotaryEmbedding

Rotary = tuple[torch.Tensor, torch.Tensor]  # cos, signed sin [num_tokens, 1, rotary dims]


class Attention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, rope: RotaryEmbedding, backend: AttentionBackend
    ) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.rope = rope
        self.backend = backend
        self.scoring = LayerAttention(scale=config.attn_scale)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        rotary: Rotary,
        batch: AttentionBatch,
        k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # [n, (heads + 2 * kv_heads) * head_dim]
        qk_size = self.sizes[0] + self.sizes[1]
        qk = qkv[:, :qk_size].view(n, -1, self.head_dim)
        if self.qk_norm:
            q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        # Queries and keys sit side by side: rotate them in one pass.
        q, k = self.rope(rotary, qk).split((self.num_heads, self.num_kv_heads), dim=1)
        v = qkv[:, qk_size:].view(n, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, k_cache, v_cache, batch, self.scoring)  # [n, heads, head_dim]
        return self.o_proj(out.reshape(n, -1))


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, rope: RotaryEmbedding, backend: AttentionBackend
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer, rope, backend)
        # Llama layout: the MLP's input norm is called post_attention_layernorm. Gemma norms
        # the attention output with it, and has a norm before and after the MLP.
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gemma_norms = config.gemma_norms
        if config.gemma_norms:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rotary, batch, k_cache, v_cache) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), rotary, batch, k_cache, v_cache)
        if not self.gemma_norms:
            x = x + attn
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.layer_windows = [config.window(i) for i in range(config.num_layers)]
        self.windows = set(self.layer_windows) - {None}
        rotary_dim = config.rotary_dim or config.head_dim
        self.rope = RotaryEmbedding(
            rotary_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        # Gemma 3: sliding layers rotate by their own theta
        self.local_rope = (
            RotaryEmbedding(
                rotary_dim, config.max_position_embeddings, config.local_rope_theta, config.local_rope_scaling
            )
            if config.has_local_rope
            else None
        )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # a buffer, so that it takes the model's dtype like transformers' (Gemma)
        scale = torch.tensor(config.embed_scale or 1.0)
        self.register_buffer("embed_scale", scale if config.embed_scale else None, persistent=False)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, self.rope, backend) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        # An LM head that replaces the float one: packed by a weight format, or on BLAS.
        self.packed_head: nn.Module | None = None
        # Set when float32 linears run on numpy's BLAS: the runner routes each step by its rows.
        self.matmul_route: MatmulRoute | None = None
        self.dense_choice: DenseChoice | None = None  # packed weights' dense copies (build.py)
        self.int_dot_choice: IntDotChoice | None = None  # ... and int8 activations
        self._cache_views: tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        batch: AttentionBatch,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_slots, num_kv_heads, head_dim]
    ) -> torch.Tensor:  # [num_tokens, hidden] final-normed hidden states
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rotary = self.rope.lookup(positions)
        local = rotary if self.local_rope is None else self.local_rope.lookup(positions)
        # one narrowed batch per window size, shared by the layers of that window
        batches = {None: batch} | {w: windowed(batch, positions, w) for w in self.windows}
        caches = self._layer_caches(kv_cache)
        for layer, window, (k_cache, v_cache) in zip(self.layers, self.layer_windows, caches, strict=True):
            x = layer(x, rotary if window is None else local, batches[window], k_cache, v_cache)
        return self.norm(x)

    def _layer_caches(self, kv_cache: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) views of the cache, made once per cache tensor, not per step."""
        if self._cache_views is None or self._cache_views[0] is not kv_cache:
            views = [(kv_cache[i, 0], kv_cache[i, 1]) for i in range(len(self.layers))]
            self._cache_views = (kv_cache, views)
        return self._cache_views[1]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab] fp32
        if self.packed_head is not None:
            logits = self.packed_head(hidden).float()
        else:
            logits = F.linear(hidden, self.head_weight()).float()
        cap = self.config.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def head_weight(self) -> torch.Tensor:  # [vocab, hidden]
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_head(self, head: nn.Module) -> None:
        """Compute logits with ``head`` (a packed linear) instead of the float head weight."""
        self.packed_head = head

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load transformers-named weights, fusing q/k/v and gate/up projections."""
        load_hf_weights(self, state)
