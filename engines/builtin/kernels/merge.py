"""Merge partial attention results over disjoint key sets, exactly, by log-sum-exp.

``merge_into`` updates rows of a running result in place, so sharing at several levels (a
child of a child) is handled by merging once per level. A part may come in several splits
(``[rows, heads, splits, head_dim]``, as the shared-prefix kernel leaves them): they are all
folded in the same pass, so the splits need no reduction of their own."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parrot.engines.builtin.kernels.checks import check, check_power_of_two, check_tensor


@triton.jit
def _merge_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim] float32, updated in place
    lse_ptr,  # [num_tokens, num_heads] float32, updated in place
    rows_ptr,  # [num_rows] which rows of out/lse the parts belong to
    part_out_ptr,  # [num_rows, num_heads, num_splits, head_dim] float32
    part_lse_ptr,  # [num_rows, num_heads, num_splits] float32
    num_splits,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    stride_pt,
    stride_ph,
    stride_psp,
    stride_plt,
    stride_plh,
    stride_plsp,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    i = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(rows_ptr + i).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    sp = tl.arange(0, SPLITS_PAD)
    split_mask = sp < num_splits
    lse_a = tl.load(lse_ptr + row * stride_lt + head * stride_lh)
    lse_b = tl.load(
        part_lse_ptr + i * stride_plt + head * stride_plh + sp * stride_plsp,
        mask=split_mask,
        other=float("-inf"),
    )  # [SPLITS_PAD]
    m = tl.maximum(lse_a, tl.max(lse_b, 0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # nothing seen on either side
    w_a = tl.exp(lse_a - m_safe)
    w_b = tl.exp(lse_b - m_safe)  # [SPLITS_PAD], 0 for padding and empty splits
    a = tl.load(out_ptr + row * stride_ot + head * stride_oh + d)
    b = tl.load(
        part_out_ptr + i * stride_pt + head * stride_ph + sp[:, None] * stride_psp + d[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_DIM]
    total = w_a + tl.sum(w_b, 0)
    merged = (a * w_a + tl.sum(b * w_b[:, None], 0)) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + d, merged)
    tl.store(lse_ptr + row * stride_lt + head * stride_lh, tl.where(total == 0.0, m, m_safe + tl.log(total)))


def merge_into(
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32
    lse: torch.Tensor,  # [num_tokens, num_heads] float32
    rows: torch.Tensor,  # [num_rows] int
    part_out: torch.Tensor,  # [num_rows, num_heads, head_dim] or [num_rows, num_heads, splits, head_dim] f32
    part_lse: torch.Tensor,  # [num_rows, num_heads] or [num_rows, num_heads, splits] float32
    check_values: bool = True,  # False: skip the check that reads ``rows`` (a host sync)
) -> None:
    check_tensor("out", out, 3, (torch.float32,))
    check_tensor("lse", lse, 2, (torch.float32,))
    if part_out.dim() == 3:  # one split
        part_out, part_lse = part_out.unsqueeze(2), part_lse.unsqueeze(2)
    check_tensor("part_out", part_out, 4, (torch.float32,))
    check_tensor("part_lse", part_lse, 3, (torch.float32,), last_dim_contiguous=False)
    check_tensor("rows", rows, 1, (torch.int32, torch.int64), contiguous=True)
    check(part_out.shape[0] == rows.shape[0] == part_lse.shape[0], "one part per row")
    check(
        part_out.shape[1] == out.shape[1]
        and part_out.shape[3] == out.shape[2]
        and part_lse.shape == part_out.shape[:3]
        and lse.shape == out.shape[:2],
        "shapes of out, lse and parts differ",
    )
    check_power_of_two("head_dim", out.shape[2])
    if not rows.numel():
        return
    if check_values:
        check(int(rows.min()) >= 0 and int(rows.max()) < out.shape[0], "rows point outside out")
    splits = part_out.shape[2]
    _merge_kernel[(rows.shape[0], out.shape[1])](
        out,
        lse,
        rows,
        part_out,
        part_lse,
        splits,
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        lse.stride(1),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        part_lse.stride(2),
        SPLITS_PAD=triton.next_power_of_2(splits),
        HEAD_DIM=out.shape[2],
    )
