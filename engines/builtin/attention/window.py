"""Sliding-window attention as narrower masks of the step's batch (and the window itself,
for kernels that bound keys by positions rather than read masks).

A sliding layer's query at position ``q`` sees the keys at ``k`` with ``q - k < window``
(transformers' ``sliding_window_overlay``). The window does not change which blocks are
gathered or how a step is split (decode, prefill, shared prefixes): the step's masks are
narrowed once per step and every sliding layer uses the narrowed batch. A shared prefix
a query has slid past entirely contributes nothing to its merged result (its part's
log-sum-exp is -inf).
"""

from __future__ import annotations

import dataclasses

import torch

from parrot.engines.builtin.attention.base import (
    AttentionBatch,
    DecodeGroup,
    PrefillSeq,
    SharedPrefixGroup,
)


def windowed(batch: AttentionBatch, positions: torch.Tensor, window: int) -> AttentionBatch:
    """``batch`` with every mask narrowed to keys less than ``window`` positions behind the query.

    ``positions`` [num_tokens] are the step's query positions.
    """
    decode = None if batch.decode is None else _decode(batch.decode, window)
    prefills = tuple(_prefill(p, window) for p in batch.prefills)
    starts = _prefix_starts(batch.shared_groups)
    shared = tuple(
        _shared(g, positions, start, window) for g, start in zip(batch.shared_groups, starts, strict=True)
    )
    return dataclasses.replace(batch, decode=decode, prefills=prefills, shared_groups=shared, window=window)


def _decode(d: DecodeGroup, window: int) -> DecodeGroup:
    # Key j of a row's gathered blocks lies kv_lens - 1 - j positions behind its query.
    j = torch.arange(d.kv_valid.shape[-1], device=d.kv_valid.device)
    recent = j[None, :] >= (d.kv_lens[:, None] - window)  # [b, L]
    valid = d.kv_valid & recent[:, None, None, :]
    bias = torch.zeros(valid.shape, dtype=d.kv_bias.dtype, device=valid.device).masked_fill_(
        ~valid, float("-inf")
    )
    return dataclasses.replace(d, kv_valid=valid, kv_bias=bias)


def _prefill(p: PrefillSeq, window: int) -> PrefillSeq:
    device = p.kv_slots.device
    qpos = torch.arange(p.q_start, p.q_start + p.num_tokens, device=device)
    kpos = torch.arange(p.kv_start, p.kv_start + p.kv_slots.numel(), device=device)
    recent = (qpos[:, None] - kpos[None, :]) < window
    mask = recent if p.causal_mask is None else p.causal_mask & recent
    return dataclasses.replace(p, causal_mask=mask)


def _shared(g: SharedPrefixGroup, positions: torch.Tensor, start: int, window: int) -> SharedPrefixGroup:
    qpos = positions.index_select(0, g.token_rows)  # [num_group_tokens]
    kpos = start + torch.arange(g.prefix_blocks.numel() * g.block_size, device=qpos.device)
    recent = (qpos[:, None] - kpos[None, :]) < window
    mask = recent if g.key_mask is None else g.key_mask & recent
    return dataclasses.replace(g, key_mask=mask, positions=qpos, prefix_start=start)


def _prefix_starts(groups: tuple[SharedPrefixGroup, ...]) -> list[int]:
    """Position of each group's first prefix key.

    Groups come parent first (batch.py nests a fork of a fork inside its parent's group),
    and a nested group's prefix starts where its parent's ends; its parent is the nearest
    earlier group holding its queries. A top-level group starts at position 0.
    """
    starts: list[int] = []
    rows = [set(g.token_rows.tolist()) for g in groups]
    for i in range(len(groups)):
        start = 0
        for j in range(i - 1, -1, -1):
            if rows[i] <= rows[j]:
                start = starts[j] + groups[j].prefix_blocks.numel() * groups[j].block_size
                break
        starts.append(start)
    return starts
