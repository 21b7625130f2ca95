"""Turns one scheduled step into model inputs and the attention metadata of all layers."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from parrot.engines.builtin.attention.base import (
    AttentionBatch,
    DecodeGroup,
    PrefillSeq,
    PrefillTables,
    SharedPrefixGroup,
)
from parrot.engines.builtin.context_pool import Context


@dataclass(frozen=True)
class SharedPrefixPolicy:
    """When the shared-prefix attention path is worth taking.

    The path pays once enough KV reads are saved: ``(seqs - 1) * prefix_tokens``. The
    break-even measured by ``benchmarks/attention_kernels.py`` (docs/benchmarks.md) is the
    default per device: on the CPU torch backend near 3,000 saved tokens per layer (1.06x at
    4 x 1,024 and 8 x 512; 0.8x at 8 x 256 and 4 x 512); on an H200 with the Triton kernels
    near 100k (0.89-0.93x at 8 x 8,192 and 16 x 4,096, 57-61k saved; 1.06-1.32x at 8 x 16,384,
    16 x 8,192, 128 x 1,024 and 32 x 4,096, 115-130k saved), where the path's extra launches
    weigh against reads that are cheap on a GPU.
    """

    enabled: bool = True
    min_seqs: int = 2
    min_prefix_tokens: int = 16
    min_saved_tokens: int | None = None  # None: the device's break-even, MIN_SAVED_TOKENS

    def for_device(self, device: torch.device) -> SharedPrefixPolicy:
        if self.min_saved_tokens is not None:
            return self
        return replace(self, min_saved_tokens=MIN_SAVED_TOKENS.get(device.type, MIN_SAVED_TOKENS["cpu"]))


MIN_SAVED_TOKENS = {"cpu": 3072, "cuda": 98304}


@dataclass
class StepItem:
    """Compute ``num_tokens`` tokens of a context from ``start``; then sample if ``sample``.

    ``num_tokens == 0`` with ``sample`` means the context is fully computed and its stored
    last hidden state is sampled from directly.
    """

    context: Context
    start: int
    num_tokens: int
    sample: bool


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attention: AttentionBatch
    last_rows: list[int]  # per item, the row of its last computed token (-1 if none)


def build_step(
    items: list[StepItem], block_size: int, policy: SharedPrefixPolicy, device: torch.device
) -> StepInputs:
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    last_rows: list[int] = []
    token_start: list[int] = []
    for item in items:
        ctx = item.context
        token_start.append(len(ids))
        end = item.start + item.num_tokens
        ids.extend(ctx.token_ids[item.start : end])
        pos = range(item.start, end)
        positions.extend(pos)
        slots.extend(ctx.blocks[p // block_size] * block_size + p % block_size for p in pos)
        last_rows.append(len(ids) - 1 if item.num_tokens else -1)

    computed = [i for i, item in enumerate(items) if item.num_tokens]
    kv_start = dict.fromkeys(computed, 0)
    groups = _shared_groups(items, computed, block_size, policy.for_device(device), kv_start)

    decode_idx = [i for i in computed if items[i].num_tokens == 1]
    decode = (
        _decode_group(items, decode_idx, token_start, kv_start, block_size, device) if decode_idx else None
    )
    prefill_idx = [i for i in computed if items[i].num_tokens > 1]
    prefills = tuple(
        _prefill_seq(items[i], token_start[i], kv_start[i], block_size, device) for i in prefill_idx
    )
    shared = tuple(
        SharedPrefixGroup(
            token_rows=torch.tensor(
                [r for i in members for r in range(token_start[i], token_start[i] + items[i].num_tokens)],
                dtype=torch.long,
                device=device,
            ),
            prefix_blocks=torch.tensor(
                items[members[0]].context.blocks[first:end], dtype=torch.long, device=device
            ),
            block_size=block_size,
            num_seqs=len(members),
        )
        for members, first, end in groups
    )
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        attention=AttentionBatch(
            num_tokens=len(ids),
            block_size=block_size,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            decode=decode,
            prefills=prefills,
            shared_groups=shared,
            prefill_tables=(
                _prefill_tables(items, prefill_idx, token_start, kv_start, block_size, device)
                if prefill_idx
                else None
            ),
        ),
        last_rows=last_rows,
    )


def takes_shared_prefix(
    items: list[StepItem], block_size: int, policy: SharedPrefixPolicy, device: torch.device
) -> bool:
    """Whether :func:`build_step` (same arguments) would attend some shared prefix once for a group."""
    computed = [i for i, item in enumerate(items) if item.num_tokens]
    return bool(
        _shared_groups(items, computed, block_size, policy.for_device(device), dict.fromkeys(computed, 0))
    )


def stage_decodes(
    items: list[StepItem], block_size: int, vectors: np.ndarray, table: np.ndarray
) -> list[int]:
    """The items' tokens as the whole-step paths read them (CUDA graphs: single-token
    decodes; the fused CPU step: a few tokens an item too), a row a token: ``vectors[:, row]``
    = (token id, position, KV slot, keys attended) and ``table[row]`` starts with the blocks
    from position 0, the row's own key included. A row of an item's later token attends the
    keys of its earlier ones, stored in the same layer before any row attends (causal, as a
    prefill). int64 arrays [4, >= rows] and [>= rows, >= blocks]; other entries are left as
    they are. Returns each item's last row (-1 for an item that computes nothing)."""
    last, row = [], 0
    for item in items:
        blocks = item.context.blocks
        for pos in range(item.start, item.start + item.num_tokens):
            used = pos // block_size + 1
            slot = blocks[pos // block_size] * block_size + pos % block_size
            vectors[:, row] = (item.context.token_ids[pos], pos, slot, pos + 1)
            table[row, :used] = blocks[:used]
            row += 1
        last.append(row - 1 if item.num_tokens else -1)
    return last


def _shared_groups(items, computed, block_size, policy, kv_start) -> list[tuple[list[int], int, int]]:
    """Groups of items whose block tables share blocks, level by level.

    Each group is (members, first block, end block): its members share blocks[first:end]
    (and, for a deeper level, everything before). A child of a child forms a group inside
    its parent's group, so each level is attended once and merged in turn. Members'
    ``kv_start`` ends up at the deepest shared block; their own attention starts there.
    """
    groups: list[tuple[list[int], int, int]] = []
    if not policy.enabled:
        return groups

    def split(members: list[int], level: int) -> None:
        by_next: dict[int, list[int]] = {}
        for i in members:
            # Only blocks wholly before the item's first query can be shared.
            if level < items[i].start // block_size:
                by_next.setdefault(items[i].context.blocks[level], []).append(i)
        for sub in by_next.values():
            if len(sub) < policy.min_seqs:
                continue
            limit = min(items[i].start // block_size for i in sub)
            tables = [items[i].context.blocks for i in sub]
            end = level
            while end < limit and all(t[end] == tables[0][end] for t in tables):
                end += 1
            shared_tokens = (end - level) * block_size
            saved = (len(sub) - 1) * shared_tokens
            if shared_tokens < policy.min_prefix_tokens or saved < policy.min_saved_tokens:
                continue
            groups.append((sub, level, end))
            for i in sub:
                kv_start[i] = end * block_size
            split(sub, end)

    split(computed, 0)
    return groups


def _slots(blocks: list[int], block_size: int, length: int, device) -> torch.Tensor:
    table = torch.tensor(blocks, dtype=torch.long)
    pos = torch.arange(length)
    return (table[pos // block_size] * block_size + pos % block_size).to(device)


def _decode_group(items, idx, token_start, kv_start, block_size, device) -> DecodeGroup:
    first = [kv_start[i] // block_size for i in idx]  # kv_start is block aligned
    ends = [items[i].start + 1 for i in idx]  # kv length after this token
    last = [-(-e // block_size) for e in ends]
    width = max(b - a for a, b in zip(first, last, strict=True))
    table = torch.zeros(len(idx), width, dtype=torch.long)
    for row, i in enumerate(idx):
        blocks = items[i].context.blocks[first[row] : last[row]]
        table[row, : len(blocks)] = torch.tensor(blocks)
    pos = torch.tensor(first)[:, None] * block_size + torch.arange(width * block_size)[None, :]
    valid = pos < torch.tensor(ends)[:, None]  # [b, width * block_size]
    bias = torch.zeros(valid.shape).masked_fill_(~valid, float("-inf"))  # [b, width * block_size]
    return DecodeGroup(
        token_rows=torch.tensor([token_start[i] for i in idx], dtype=torch.long, device=device),
        block_table=table.to(device),
        kv_valid=valid[:, None, None, :].to(device),
        kv_bias=bias[:, None, None, :].to(device),
        kv_lens=torch.tensor([e - a * block_size for a, e in zip(first, ends, strict=True)], device=device),
        block_size=block_size,
    )


def _prefill_tables(items, idx, token_start, kv_start, block_size, device) -> PrefillTables:
    """Built on the host and copied once (a row-by-row fill on a GPU is a launch per row)."""
    blocks = [_prefill_blocks(items[i], kv_start[i], block_size) for i in idx]
    tables = torch.zeros(len(idx), max(map(len, blocks)), dtype=torch.long)
    for row, own in enumerate(blocks):
        tables[row, : len(own)] = torch.tensor(own)
    seqs = [[token_start[i], items[i].num_tokens, items[i].start, kv_start[i]] for i in idx]
    return PrefillTables(
        block_tables=tables.to(device),
        seqs=torch.tensor(seqs, dtype=torch.int32).to(device),
        max_tokens=max(items[i].num_tokens for i in idx),
    )


def _prefill_blocks(item: StepItem, kv_start: int, block_size: int) -> list[int]:
    """The blocks a prefilling item attends: from the one holding ``kv_start`` to its end."""
    return item.context.blocks[kv_start // block_size : -(-(item.start + item.num_tokens) // block_size)]


def _prefill_seq(item: StepItem, token_start: int, kv_start: int, block_size: int, device) -> PrefillSeq:
    end = item.start + item.num_tokens
    slots = _slots(item.context.blocks, block_size, end, device)[kv_start:]
    qpos = torch.arange(item.start, end)
    kpos = torch.arange(kv_start, end)
    mask = (kpos[None, :] <= qpos[:, None]).to(device)
    blocks = _prefill_blocks(item, kv_start, block_size)
    return PrefillSeq(
        token_start=token_start,
        num_tokens=item.num_tokens,
        kv_slots=slots,
        causal_mask=mask,
        block_table=torch.tensor(blocks, dtype=torch.long, device=device),
        q_start=item.start,
        kv_start=kv_start,
    )
