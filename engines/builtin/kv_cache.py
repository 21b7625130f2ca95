"""The paged KV cache: one pre-allocated tensor for all layers, keys and values."""

from __future__ import annotations

import torch

from parrot.engines.builtin.model.model_config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


def num_blocks_for_budget(config: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int) -> int:
    return max(1, budget_bytes // bytes_per_block(config, block_size, dtype))


def allocate_kv_cache(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]; slot = block * size + offset."""
    return torch.zeros(
        config.num_layers,
        2,
        num_blocks * block_size,
        config.num_kv_heads,
        config.head_dim,
        dtype=dtype,
        device=device,
    )
