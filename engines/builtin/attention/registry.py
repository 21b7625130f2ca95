"""Attention backends by name, so the engine (and later the Triton kernels) plug in by name."""

from __future__ import annotations

from collections.abc import Callable

from parrot.engines.builtin.attention.base import AttentionBackend

BackendFactory = Callable[[int, int, int], AttentionBackend]


def _torch_backend(num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    from parrot.engines.builtin.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend(num_heads, num_kv_heads, head_dim)


# Read-only mapping of names to factories; a new backend adds an entry here.
BACKENDS: dict[str, BackendFactory] = {"torch": _torch_backend}


def available_backends() -> tuple[str, ...]:
    return tuple(BACKENDS)


def default_backend(device: str) -> str:
    """The backend the engine uses when none is forced."""
    return "torch"


def create_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int) -> AttentionBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(BACKENDS)}") from None
    return factory(num_heads, num_kv_heads, head_dim)
