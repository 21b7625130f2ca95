"""Merge two partial attention results over disjoint key sets, exactly, by log-sum-exp.

``merge_into`` updates rows of a running result in place, so sharing at several levels (a
child of a child) is handled by merging once per level."""

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
    part_out_ptr,  # [num_rows, num_heads, head_dim] float32
    part_lse_ptr,  # [num_rows, num_heads] float32
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    stride_pt,
    stride_ph,
    stride_plt,
    stride_plh,
    HEAD_DIM: tl.constexpr,
):
    i = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(rows_ptr + i).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    lse_a = tl.load(lse_ptr + row * stride_lt + head * stride_lh)
    lse_b = tl.load(part_lse_ptr + i * stride_plt + head * stride_plh)
    m = tl.maximum(lse_a, lse_b)
    w_a = tl.exp(lse_a - m)
    w_b = tl.exp(lse_b - m)
    a = tl.load(out_ptr + row * stride_ot + head * stride_oh + d)
    b = tl.load(part_out_ptr + i * stride_pt + head * stride_ph + d)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + d, (a * w_a + b * w_b) / (w_a + w_b))
    tl.store(lse_ptr + row * stride_lt + head * stride_lh, m + tl.log(w_a + w_b))


def merge_into(
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32
    lse: torch.Tensor,  # [num_tokens, num_heads] float32
    rows: torch.Tensor,  # [num_rows] int
    part_out: torch.Tensor,  # [num_rows, num_heads, head_dim] float32
    part_lse: torch.Tensor,  # [num_rows, num_heads] float32
) -> None:
    check_tensor("out", out, 3, (torch.float32,))
    check_tensor("lse", lse, 2, (torch.float32,))
    check_tensor("part_out", part_out, 3, (torch.float32,))
    check_tensor("part_lse", part_lse, 2, (torch.float32,))
    check_tensor("rows", rows, 1, (torch.int32, torch.int64), contiguous=True)
    check(part_out.shape[0] == rows.shape[0] == part_lse.shape[0], "one part per row")
    check(
        part_out.shape[1:] == out.shape[1:] and lse.shape == out.shape[:2],
        "shapes of out, lse and parts differ",
    )
    check_power_of_two("head_dim", out.shape[2])
    if rows.numel():
        check(int(rows.min()) >= 0 and int(rows.max()) < out.shape[0], "rows point outside out")
        _merge_kernel[(rows.shape[0], out.shape[1])](
            out,
            lse,
            rows,
            part_out,
            part_lse,
            out.stride(0),
            out.stride(1),
            lse.stride(0),
            lse.stride(1),
            part_out.stride(0),
            part_out.stride(1),
            part_lse.stride(0),
            part_lse.stride(1),
            HEAD_DIM=out.shape[2],
        )
