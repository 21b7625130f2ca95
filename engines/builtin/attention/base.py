"""The contract between the model and an attention backend.

The model computes q/k/v for all tokens of a step (``[num_tokens, heads, head_dim]``); the
backend stores the new k/v into their slots of the paged cache and attends every query to
the keys its sequence may see. Everything a backend needs about the batch is precomputed
once per step in :class:`AttentionBatch` and shared by all layers.

A sliding-window layer gets the same batch with its masks narrowed to the window and the
window itself recorded (:func:`~parrot.engines.builtin.attention.window.windowed`): the
torch backend reads the masks, the Triton kernels, which bound keys by lengths, the
window. A layer's own score scale travels in :class:`LayerAttention`.
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
class PrefillTables:
    """The step's prefilling sequences as one launch of a kernel reads them (the Triton
    backend), built once per step beside the per-sequence ``PrefillSeq``s."""

    block_tables: torch.Tensor  # [num_seqs, max_blocks] each from the block holding its kv_start
    seqs: torch.Tensor  # [num_seqs, 4] int32: first token row, tokens, q_start, kv_start
    max_tokens: int  # the most tokens of one sequence


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
    # With a sliding window: [num_group_tokens, prefix_len] bool, False where a query may not
    # see a key; the queries' positions; the position of the prefix's first key.
    key_mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    prefix_start: int = 0


@dataclass(frozen=True)
class AttentionBatch:
    num_tokens: int
    block_size: int
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's k/v is stored
    decode: DecodeGroup | None
    prefills: tuple[PrefillSeq, ...]
    shared_groups: tuple[SharedPrefixGroup, ...]
    window: int | None = None  # sliding: a query sees the keys less than this many positions back
    prefill_tables: PrefillTables | None = None  # ``prefills`` for one kernel launch

    @property
    def uses_shared_prefix(self) -> bool:
        return bool(self.shared_groups)


@dataclass(frozen=True)
class LayerAttention:
    """How one layer scores its keys, where it differs from ``q.k / sqrt(head_dim)``."""

    scale: float | None = None  # None: head_dim ** -0.5; Gemma 3: query_pre_attn_scalar ** -0.5


PLAIN = LayerAttention()


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
        layer: LayerAttention = PLAIN,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...
