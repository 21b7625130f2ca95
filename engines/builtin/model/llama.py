"""LLaMA-family decoder (Llama, Mistral, Qwen2) over a paged KV cache.

One module covers the family: GQA, RoPE with scaling, RMSNorm, SwiGLU, optional q/k/v
(and o) biases, tied embeddings. q/k/v and gate/up projections are fused into one matrix
each at load time, so a layer is a handful of large matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from parrot.engines.builtin.attention.base import AttentionBackend, AttentionBatch
from parrot.engines.builtin.model.blas_linear import MatmulRoute
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model.rope import RotaryEmbedding
from parrot.engines.protocol.errors import ModelLoadError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.shape = (dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the casts below would be no-ops, each still an op call
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        # Normalize in float32 like transformers, then cast back.
        return F.rms_norm(x.float(), self.shape, self.weight.float(), self.eps).to(x.dtype)


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
        self.rope = rope
        self.backend = backend

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        rotary: tuple[torch.Tensor, torch.Tensor],  # cos, sin [num_tokens, 1, head_dim]
        batch: AttentionBatch,
        k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # [n, (heads + 2 * kv_heads) * head_dim]
        # Queries and keys sit side by side in qkv: rotate them in one pass.
        qk_size = self.sizes[0] + self.sizes[1]
        qk = self.rope(rotary, qkv[:, :qk_size].view(n, -1, self.head_dim))
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        v = qkv[:, qk_size:].view(n, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, k_cache, v_cache, batch)  # [n, heads, head_dim]
        return self.o_proj(out.reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, rope: RotaryEmbedding, backend: AttentionBackend
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer, rope, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rotary, batch, k_cache, v_cache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.rope = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
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
        rotary = self.rope.lookup(positions)
        for layer, (k_cache, v_cache) in zip(self.layers, self._layer_caches(kv_cache), strict=True):
            x = layer(x, rotary, batch, k_cache, v_cache)
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
            return self.packed_head(hidden).float()
        return F.linear(hidden, self.head_weight()).float()

    def head_weight(self) -> torch.Tensor:  # [vocab, hidden]
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_head(self, head: nn.Module) -> None:
        """Compute logits with ``head`` (a packed linear) instead of the float head weight."""
        self.packed_head = head

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load transformers-named weights, fusing q/k/v and gate/up projections."""
        own = self.state_dict()
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

        with torch.no_grad():
            put("embed_tokens.weight", take("model.embed_tokens.weight"))
            put("norm.weight", take("model.norm.weight"))
            if self.lm_head is not None:
                head = state.get("lm_head.weight")
                put("lm_head.weight", head if head is not None else take("model.embed_tokens.weight"))
                done.add("lm_head.weight")
            for i in range(self.config.num_layers):
                src, dst = f"model.layers.{i}.", f"layers.{i}."
                for norm in ("input_layernorm", "post_attention_layernorm"):
                    put(f"{dst}{norm}.weight", take(f"{src}{norm}.weight"))
                attn = f"{src}self_attn."
                put(
                    f"{dst}self_attn.qkv_proj.weight",
                    torch.cat([take(f"{attn}{p}_proj.weight") for p in "qkv"]),
                )
                if self.config.qkv_bias:
                    put(
                        f"{dst}self_attn.qkv_proj.bias",
                        torch.cat([take(f"{attn}{p}_proj.bias") for p in "qkv"]),
                    )
                put(f"{dst}self_attn.o_proj.weight", take(f"{attn}o_proj.weight"))
                if self.config.o_bias:
                    put(f"{dst}self_attn.o_proj.bias", take(f"{attn}o_proj.bias"))
                mlp = f"{src}mlp."
                put(
                    f"{dst}mlp.gate_up_proj.weight",
                    torch.cat([take(f"{mlp}gate_proj.weight"), take(f"{mlp}up_proj.weight")]),
                )
                put(f"{dst}mlp.down_proj.weight", take(f"{mlp}down_proj.weight"))
                if self.config.mlp_bias:
                    put(
                        f"{dst}mlp.gate_up_proj.bias",
                        torch.cat([take(f"{mlp}gate_proj.bias"), take(f"{mlp}up_proj.bias")]),
                    )
                    put(f"{dst}mlp.down_proj.bias", take(f"{mlp}down_proj.bias"))
        ignored = {k for k in state if k not in done and not k.endswith("rotary_emb.inv_freq")}
        if self.config.tie_word_embeddings:
            ignored.discard("lm_head.weight")
        if ignored:
            raise ModelLoadError(f"checkpoint has weights this model does not use: {sorted(ignored)[:5]}")
