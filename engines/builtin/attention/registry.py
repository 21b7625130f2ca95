"""Attention backends by name, so the engine (and later the Triton kernels) plug in by name."""

from __future__ import annotations

import os
from collections.abc import Callable

from parrot.engines.builtin.attention.base import AttentionBackend

BackendFactory = Callable[[int, int, int], AttentionBackend]


def _torch_backend(num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    from parrot.engines.builtin.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend(num_heads, num_kv_heads, head_dim)


def _triton_backend(num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    # Imported on use: importing triton fixes its mode (compiled or TRITON_INTERPRET=1).
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "the triton attention backend needs a CUDA GPU (or TRITON_INTERPRET=1 to interpret the "
            "kernels on the CPU, slowly)"
        )
    from parrot.engines.builtin.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(num_heads, num_kv_heads, head_dim)


# Read-only mapping of names to factories; a new backend adds an entry here.
BACKENDS: dict[str, BackendFactory] = {"torch": _torch_backend, "triton": _triton_backend}


def available_backends() -> tuple[str, ...]:
    return tuple(BACKENDS)


def default_backend(device: str) -> str:
    """The backend the engine uses when none is forced: the Triton kernels on CUDA."""
    if device == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch"
        return "triton"
    return "torch"


def create_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(BACKENDS)}") from None
    return factory(num_heads, num_kv_heads, head_dim)
