"""Attention with the Triton kernels: paged decode, paged prefill, shared prefix + merge.

The kernels bound each query's keys by lengths and positions, not by the batch's masks; a
sliding window reaches them as ``batch.window`` (and the shared groups' positions).

The step's tables were built by the engine itself, so the wrappers skip the checks that
read tensor values (``check_values=False``): on a GPU each would be a host sync, and a step
that a CUDA graph replays must have none.
"""

from __future__ import annotations

import torch

from parrot.engines.builtin.attention.base import PLAIN, AttentionBackend, AttentionBatch, LayerAttention
from parrot.engines.builtin.kernels.merge import merge_into
from parrot.engines.builtin.kernels.paged_decode import paged_decode_attention
from parrot.engines.builtin.kernels.paged_prefill import paged_prefill_batch
from parrot.engines.builtin.kernels.shared_prefix import shared_prefix_attention
from parrot.engines.builtin.kernels.store_kv import store_kv


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def forward(self, q, k, v, k_cache, v_cache, batch: AttentionBatch, layer: LayerAttention = PLAIN):
        scale = layer.scale or self.scale
        store_kv(k, v, k_cache, v_cache, batch.slot_mapping, check_values=False)
        d = batch.decode
        if d is not None and d.token_rows.shape[0] == q.shape[0]:
            # Every row decodes, in order (batch.py): the kernel's outputs are the step's, with
            # no gather or scatter around it (four launches a layer fewer in a graph step).
            o, lse = self._decode(q, k_cache, v_cache, batch, scale)
            if not batch.shared_groups:
                return o
            out = o.float()
        else:
            out = q.new_empty(q.shape, dtype=torch.float32)  # [num_tokens, heads, head_dim]
            lse = q.new_empty(q.shape[:2], dtype=torch.float32)  # [num_tokens, heads]
            if d is not None:
                o, l_ = self._decode(q.index_select(0, d.token_rows), k_cache, v_cache, batch, scale)
                out.index_copy_(0, d.token_rows, o.float())
                lse.index_copy_(0, d.token_rows, l_)
        if batch.prefill_tables is not None:  # every prefilling sequence in one launch
            t = batch.prefill_tables
            paged_prefill_batch(
                q,
                k_cache,
                v_cache,
                t.block_tables,
                t.seqs,
                t.max_tokens,
                out,
                lse,
                batch.block_size,
                scale,
                window=batch.window,
            )
        for g in batch.shared_groups:
            part = shared_prefix_attention(
                q.index_select(0, g.token_rows),
                k_cache,
                v_cache,
                g.prefix_blocks,
                g.block_size,
                scale,
                window=batch.window,
                positions=g.positions,
                prefix_start=g.prefix_start,
                partial=True,  # its splits are folded in by the merge
                check_values=False,
            )
            merge_into(out, lse, g.token_rows, *part, check_values=False)
        return out.to(q.dtype)

    @staticmethod
    def _decode(q, k_cache, v_cache, batch: AttentionBatch, scale: float) -> tuple[torch.Tensor, ...]:
        """Paged decode attention of ``q`` [decode rows, heads, head_dim]: out (q's dtype), lse."""
        d = batch.decode
        return paged_decode_attention(
            q, k_cache, v_cache, d.block_table, d.kv_lens, d.block_size, scale,
            window=batch.window, check_values=False,
        )  # fmt: skip
