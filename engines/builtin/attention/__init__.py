"""Attention backends of the builtin engine."""

from parrot.engines.builtin.attention.base import (
    AttentionBackend,
    AttentionBatch,
    DecodeGroup,
    PrefillSeq,
    SharedPrefixGroup,
)
from parrot.engines.builtin.attention.registry import available_backends, create_backend

__all__ = [
    "AttentionBackend",
    "AttentionBatch",
    "DecodeGroup",
    "PrefillSeq",
    "SharedPrefixGroup",
    "available_backends",
    "create_backend",
]
