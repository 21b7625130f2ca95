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


def check_attention_inputs(q, k_cache, v_cache, block_size: int) -> tuple[int, int]:
    """The checks every attention wrapper shares; returns (query heads per KV head, num_blocks).

    q [tokens, heads, head_dim]; k_cache/v_cache [num_blocks * block_size, kv_heads, head_dim].
    """
    check_tensor("q", q, 3, FLOAT_TYPES)
    check_tensor("k_cache", k_cache, 3, FLOAT_TYPES)
    check_tensor("v_cache", v_cache, 3, FLOAT_TYPES)
    same = k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    check(same, "k_cache and v_cache differ in shape or strides")
    check(q.dtype == k_cache.dtype == v_cache.dtype, "q and the caches must share one dtype")
    head_dim = q.shape[2]
    check(k_cache.shape[2] == head_dim, f"head_dim of q ({head_dim}) != cache ({k_cache.shape[2]})")
    check_power_of_two("head_dim", head_dim)
    check_power_of_two("block_size", block_size)
    check(k_cache.shape[0] % block_size == 0, "cache slots are not a whole number of blocks")
    return check_heads(q.shape[1], k_cache.shape[1]), k_cache.shape[0] // block_size
