"""Precondition checks shared by the kernel wrappers: clear errors instead of bad launches."""

from __future__ import annotations

import torch


class KernelInputError(ValueError):
    """A kernel wrapper was given inputs the kernel cannot handle."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise KernelInputError(message)


def check_tensor(
    name: str,
    t: torch.Tensor,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    contiguous: bool = False,
    last_dim_contiguous: bool = True,
) -> None:
    check(isinstance(t, torch.Tensor), f"{name} must be a tensor, got {type(t).__name__}")
    check(t.dim() == ndim, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    check(t.dtype in dtypes, f"{name} must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None:
        check(t.device == device, f"{name} is on {t.device}, expected {device}")
    if contiguous:
        check(t.is_contiguous(), f"{name} must be contiguous")
    elif last_dim_contiguous and t.numel():
        check(t.stride(-1) == 1, f"{name} must be contiguous in its last dimension")


def check_block_table(name: str, table: torch.Tensor, num_blocks: int) -> None:
    check_tensor(name, table, table.dim(), (torch.int32, torch.int64), contiguous=True)
    if table.numel():
        low, high = int(table.min()), int(table.max())
        check(
            low >= 0 and high < num_blocks,
            f"{name} holds block ids {low}..{high}, outside 0..{num_blocks - 1}",
        )


def check_heads(num_heads: int, num_kv_heads: int) -> int:
    check(
        num_kv_heads > 0 and num_heads % num_kv_heads == 0,
        f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})",
    )
    return num_heads // num_kv_heads


def check_power_of_two(name: str, value: int) -> None:
    check(value > 0 and value & (value - 1) == 0, f"{name} must be a power of two, got {value}")


FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
