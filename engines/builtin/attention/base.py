"""The contract between the model and an attention backend.

The model computes q/k/v for all tokens of a step (``[num_tokens, heads, head_dim]``); the
backend stores the new k/v into their slots of the paged cache and attends every query to
the keys its sequence may see. Everything a backend needs about the batch is precomputed
once per step in :class:`AttentionBatch` and shared by all layers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeGroup:
    """Sequences with one query token each, attended together over padded gathered KV."""

    token_rows: torch.Tensor  # [num_seqs] rows of the step's token dimension
    # Whole blocks are gathered (16x fewer, 16x larger copies than per-slot indexing).
    block_table: torch.Tensor  # [num_seqs, max_blocks] blocks from the first attended one, padded with 0
    kv_valid: torch.Tensor  # [num_seqs, 1, 1, max_blocks * block_size] bool, False past the end
    # The same as an additive float32 mask (0 or -inf), made once per step rather than per layer
    kv_bias: torch.Tensor  # [num_seqs, 1, 1, max_blocks * block_size]
    kv_lens: torch.Tensor  # [num_seqs] keys attended, counted from the table's first block
    block_size: int


@dataclass(frozen=True)
class PrefillSeq:
    """One sequence with several query tokens: causal inside them, full over the prefix."""

    token_start: int  # first row of its queries in the step's token dimension
    num_tokens: int
    kv_slots: torch.Tensor  # [kv_len] cache slots of the keys it attends
    causal_mask: torch.Tensor | None  # [num_tokens, kv_len] bool, None when all visible
    block_table: torch.Tensor  # [num_blocks] from the block holding position kv_start
    q_start: int  # position of its first query token
    kv_start: int  # position of its first attended key (block aligned)


@dataclass(frozen=True)
class SharedPrefixGroup:
    """Sequences whose block tables start with the same blocks.

    Their queries attend the shared prefix together in one matrix product; their own
    suffix attention (in ``decode``/``prefills``) skips those positions, and the two
    partial results are merged exactly by log-sum-exp.
    """

    token_rows: torch.Tensor  # [num_group_tokens] rows of all queries of the group
    prefix_blocks: torch.Tensor  # [prefix_len // block_size] the shared (full) blocks
    block_size: int
    num_seqs: int


@dataclass(frozen=True)
class AttentionBatch:
    num_tokens: int
    block_size: int
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's k/v is stored
    decode: DecodeGroup | None
    prefills: tuple[PrefillSeq, ...]
    shared_groups: tuple[SharedPrefixGroup, ...]

    @property
    def uses_shared_prefix(self) -> bool:
        return bool(self.shared_groups)


class AttentionBackend(ABC):
    """Stores new KV into the paged cache and computes attention for one layer."""

    name: str

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
        batch: AttentionBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...
