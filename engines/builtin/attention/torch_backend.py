"""Attention in plain torch over the paged KV cache (CPU and GPU).

Keys and values are gathered from their slots per sequence. Sequences that share a prefix
(a forked parent context, or blocks reused by the prefix cache) attend that prefix once, as
one matrix product for all their queries, and their own suffix separately; the two partial
softmax results are merged exactly with their log-sum-exps.

Every mask of the batch is applied, so a sliding window (narrowed masks) holds on every path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from parrot.engines.builtin.attention.base import PLAIN, AttentionBackend, AttentionBatch, LayerAttention


def merge_partial(
    out_a: torch.Tensor,  # [n, heads, head_dim]
    lse_a: torch.Tensor,  # [n, heads]
    out_b: torch.Tensor,  # [n, heads, head_dim]
    lse_b: torch.Tensor,  # [n, heads]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two softmax-attention results over disjoint key sets into the exact whole."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).unsqueeze(-1)
    w_b = torch.exp(lse_b - lse).unsqueeze(-1)
    return (out_a * w_a + out_b * w_b).to(out_a.dtype), lse


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q, k, v, k_cache, v_cache, batch: AttentionBatch, layer: LayerAttention = PLAIN):
        # (a cache of another dtype than the activations' (--kv-dtype) stores them rounded and
        # is read back in the activations' dtype: .to() is a no-op where they are the same)
        k_cache.index_copy_(0, batch.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.slot_mapping, v.to(v_cache.dtype))
        need_lse = batch.uses_shared_prefix
        d = batch.decode
        if d is not None and not need_lse and d.token_rows.numel() == batch.num_tokens:
            return self._decode(q, k_cache, v_cache, d, False, layer)[0]  # a pure decode step: rows in order
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:2], dtype=torch.float32) if need_lse else None

        if d is not None:
            if d.token_rows.numel() == batch.num_tokens:  # a pure decode step with shared prefixes
                out, lse = self._decode(q, k_cache, v_cache, d, need_lse, layer)
            else:
                o, l_ = self._decode(q.index_select(0, d.token_rows), k_cache, v_cache, d, need_lse, layer)
                out.index_copy_(0, d.token_rows, o)
                if lse is not None:
                    lse.index_copy_(0, d.token_rows, l_)
        for p in batch.prefills:
            rows = slice(p.token_start, p.token_start + p.num_tokens)
            o, l_ = self._prefill(q[rows], k_cache, v_cache, p.kv_slots, p.causal_mask, need_lse, layer)
            out[rows] = o
            if lse is not None:
                lse[rows] = l_
        for g in batch.shared_groups:
            qg = q.index_select(0, g.token_rows)
            o_p, l_p = self._prefix(qg, k_cache, v_cache, g.prefix_blocks, g.block_size, g.key_mask, layer)
            o, merged_lse = merge_partial(
                out.index_select(0, g.token_rows), lse.index_select(0, g.token_rows), o_p, l_p
            )
            out.index_copy_(0, g.token_rows, o)
            lse.index_copy_(0, g.token_rows, merged_lse)  # a deeper level merges into this
        return out

    def _scores(self, raw: torch.Tensor, layer: LayerAttention) -> torch.Tensor:
        """Scaled float32 scores from the raw products q.k."""
        return raw.float() * (layer.scale or self.scale)

    def _grouped(self, q: torch.Tensor) -> torch.Tensor:
        # [n, num_heads, d] -> [n, num_kv_heads, group, d]: query heads sharing a KV head
        return q.view(q.shape[0], self.num_kv_heads, -1, self.head_dim)

    def _decode(self, q, k_cache, v_cache, d, need_lse, layer):
        b = q.shape[0]
        keys = _blocks(k_cache, d.block_table, d.block_size).to(q.dtype)  # [b, L, kvh, d]
        vals = _blocks(v_cache, d.block_table, d.block_size).to(q.dtype)
        if not need_lse and q.dtype == torch.float32:  # one fused kernel when nobody needs the lse
            out = F.scaled_dot_product_attention(
                q.unsqueeze(2),  # [b, heads, 1, d]
                keys.transpose(1, 2),  # [b, kvh, L, d]
                vals.transpose(1, 2),
                attn_mask=d.kv_bias,  # the same bits as the bool mask, without its per-call conversion
                scale=layer.scale or self.scale,
                enable_gqa=True,
            )
            return out.view(b, self.num_heads, self.head_dim), None
        # In float32 for every dtype: on the CPU, SDPA and small matmuls in bfloat16 run 5-15x
        # slower than in float32 at decode shapes (measured), and decode attention is small.
        qg = self._grouped(q).float()  # [b, kvh, g, d]
        keys = keys.permute(0, 2, 3, 1).float()  # [b, kvh, d, L]
        vals = vals.transpose(1, 2).float()  # [b, kvh, L, d]
        scores = self._scores(torch.matmul(qg, keys), layer) + d.kv_bias  # [b, kvh, g, L]
        out, lse = self._softmax_out(scores, vals, b, need_lse)
        return out.to(q.dtype), lse

    def _prefill(self, q, k_cache, v_cache, kv_slots, causal_mask, need_lse, layer):
        n = q.shape[0]
        if not need_lse:
            # torch's fused (flash) kernel, which never holds the [heads, n, L] scores: a chunk
            # of 1,024 prompt tokens after 3,000 others took 79 ms a layer against 400 ms for
            # the products below (which a shared prefix's merge still needs: they give the lse)
            keys = k_cache[kv_slots].to(q.dtype).transpose(0, 1)[None]  # [1, kvh, L, d]
            vals = v_cache[kv_slots].to(q.dtype).transpose(0, 1)[None]
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],  # [1, heads, n, d]
                keys,
                vals,
                attn_mask=causal_mask,  # [n, L] bool (a window narrows it), or None: every key
                scale=layer.scale or self.scale,
                enable_gqa=True,
            )
            return out[0].transpose(0, 1), None  # [n, heads, d]
        qg = self._grouped(q).permute(1, 2, 0, 3)  # [kvh, g, n, d]
        keys = k_cache[kv_slots].to(q.dtype).permute(1, 2, 0)  # [kvh, d, L]
        vals = v_cache[kv_slots].to(q.dtype).transpose(0, 1)  # [kvh, L, d]
        scores = self._scores(torch.matmul(qg, keys.unsqueeze(1)), layer)  # [kvh, g, n, L]
        if causal_mask is not None:
            scores.masked_fill_(~causal_mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # [kvh, g, n, 1]
        probs = torch.exp(scores - lse).to(vals.dtype)
        out = torch.matmul(probs, vals.unsqueeze(1))  # [kvh, g, n, d]
        out = out.permute(2, 0, 1, 3).reshape(n, self.num_heads, self.head_dim)
        lse_out = lse.squeeze(-1).permute(2, 0, 1).reshape(n, self.num_heads) if need_lse else None
        return out, lse_out

    def _prefix(self, q, k_cache, v_cache, prefix_blocks, block_size, key_mask, layer):
        # All queries of the group against one shared prefix: a single [kvh, n*g, P] product.
        n = q.shape[0]
        qg = self._grouped(q).permute(1, 0, 2, 3).reshape(self.num_kv_heads, -1, self.head_dim)
        keys = _blocks(k_cache, prefix_blocks[None], block_size)[0].to(q.dtype)  # [P, kvh, d]
        vals = _blocks(v_cache, prefix_blocks[None], block_size)[0].to(q.dtype)
        keys, vals = keys.permute(1, 2, 0), vals.transpose(0, 1)  # [kvh, d, P], [kvh, P, d]
        scores = self._scores(torch.matmul(qg, keys), layer)  # [kvh, n*g, P]
        if key_mask is not None:  # [n, P] -> the rows of each query's heads
            hidden = ~key_mask.repeat_interleave(scores.shape[1] // n, dim=0)
            scores.masked_fill_(hidden, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        # A query that slid past the whole prefix has lse -inf: its weights become 0, not NaN,
        # and the merge gives this part no weight.
        shift = lse if key_mask is None else lse.clamp_min(torch.finfo(lse.dtype).min)
        out = torch.matmul(torch.exp(scores - shift).to(vals.dtype), vals)  # [kvh, n*g, d]
        out = out.view(self.num_kv_heads, n, -1, self.head_dim).transpose(0, 1)
        lse = lse.view(self.num_kv_heads, n, -1).transpose(0, 1)
        return out.reshape(n, self.num_heads, self.head_dim), lse.reshape(n, self.num_heads)

    def _softmax_out(self, scores, vals, b, need_lse):
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # [b, kvh, g, 1]
        out = torch.matmul(torch.exp(scores - lse).to(vals.dtype), vals)  # [b, kvh, g, d]
        out = out.reshape(b, self.num_heads, self.head_dim)
        return out, (lse.reshape(b, self.num_heads) if need_lse else None)


def _blocks(cache: torch.Tensor, table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Gather whole blocks: cache [slots, kvh, d], table [b, nb] -> [b, nb * block_size, kvh, d]."""
    paged = cache.view(-1, block_size, *cache.shape[1:])  # [num_blocks, block_size, kvh, d]
    gathered = paged.index_select(0, table.reshape(-1))  # [b * nb, block_size, kvh, d]
    return gathered.view(table.shape[0], -1, *cache.shape[1:])
