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
        if q.device.type == "cpu":  # the flash kernel gives the lse: 0.8 against 1.2 ms a layer
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qg, keys.transpose(1, 2).float(), vals.transpose(1, 2).float(), attn_mask=d.kv_bias,
                scale=layer.scale or self.scale,
            )  # fmt: skip
            lse = lse.reshape(b, self.num_heads) if need_lse else None  # a row always sees its own key
            return out.reshape(b, self.num_heads, self.head_dim).to(q.dtype), lse
        keys = keys.permute(0, 2, 3, 1).float()  # [b, kvh, d, L]
        vals = vals.transpose(1, 2).float()  # [b, kvh, L, d]
        scores = self._scores(torch.matmul(qg, keys), layer) + d.kv_bias  # [b, kvh, g, L]
        out, lse = self._softmax_out(scores, vals, b, need_lse)
        return out.to(q.dtype), lse

    def _prefill(self, q, k_cache, v_cache, kv_slots, causal_mask, need_lse, layer):
        if not need_lse:
            # torch's fused (flash) kernel, which never holds the [heads, n, L] scores: a chunk
            # of 1,024 prompt tokens after 3,000 others took 79 ms a layer against 400 ms for
            # the explicit products (which a shared prefix's merge needs where no kernel gives
            # the lse: see _with_lse)
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
        keys = k_cache[kv_slots].to(q.dtype).transpose(0, 1)  # [kvh, L, d]
        vals = v_cache[kv_slots].to(q.dtype).transpose(0, 1)
        return self._with_lse(q, keys, vals, causal_mask, layer)

    def _prefix(self, q, k_cache, v_cache, prefix_blocks, block_size, key_mask, layer):
        # All queries of the group against one shared prefix, as one sequence of queries.
        keys = _blocks(k_cache, prefix_blocks[None], block_size)[0].to(q.dtype)  # [P, kvh, d]
        vals = _blocks(v_cache, prefix_blocks[None], block_size)[0].to(q.dtype)
        return self._with_lse(q, keys.transpose(0, 1), vals.transpose(0, 1), key_mask, layer)

    def _with_lse(self, q, keys, vals, mask, layer, kernel: bool | None = None):
        """Attention of queries q [n, heads, d] over keys and values [kvh, L, d] (mask [n, L]
        bool, or None: every key) with its log-sum-exp [n, heads], which a merge needs.

        The query heads that share a KV head are folded into its rows ([kvh, n * g, d]), so
        that it is one plain product per KV head. On the CPU torch's flash kernel gives the
        log-sum-exp too, without holding the [kvh, n * g, L] scores: at the sizes of 32
        users' questions behind a 1,536-token prompt (2,904 rows x 1,024 keys, 3 KV heads)
        32 ms against 218 ms for the products, which made such a step 3x slower a token than
        a plain prefill. A query that sees no key (one that slid past the whole prefix) gets
        lse -inf: the merge gives this part no weight. ``kernel``: the flash kernel (None: on
        the CPU; a test takes the products there too)."""
        n, g = q.shape[0], self.num_heads // self.num_kv_heads
        qg = self._grouped(q).permute(1, 0, 2, 3).reshape(self.num_kv_heads, n * g, self.head_dim)
        rows = None if mask is None else mask.repeat_interleave(g, dim=0)  # [n * g, L]
        scale = layer.scale or self.scale
        if q.device.type == "cpu" if kernel is None else kernel:
            bias = None  # the kernel takes an additive mask of the queries' dtype
            if rows is not None:
                bias = torch.zeros(rows.shape, dtype=q.dtype).masked_fill_(~rows, float("-inf"))[None, None]
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qg[None], keys[None], vals[None], attn_mask=bias, scale=scale
            )
            out, lse = out[0], lse[0]  # [kvh, n * g, d], [kvh, n * g]
            if rows is not None:
                lse = lse.masked_fill(~rows.any(-1), float("-inf"))  # the kernel says 0 there
        else:
            scores = self._scores(torch.matmul(qg, keys.transpose(1, 2)), layer)  # [kvh, n * g, L]
            if rows is not None:
                scores.masked_fill_(~rows, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)
            shift = lse if rows is None else lse.clamp_min(torch.finfo(lse.dtype).min)  # 0 weights, not NaN
            out = torch.matmul(torch.exp(scores - shift[..., None]).to(vals.dtype), vals)
        out = out.view(self.num_kv_heads, n, g, self.head_dim).transpose(0, 1)
        lse = lse.view(self.num_kv_heads, n, g).transpose(0, 1)
        return out.reshape(n, self.num_heads, self.head_dim).to(q.dtype), lse.reshape(n, self.num_heads)

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
