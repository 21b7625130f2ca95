"""The online-softmax step every attention kernel here shares (device functions)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_dot(a, b, K: tl.constexpr, N: tl.constexpr, EXACT: tl.constexpr):
    """``a`` [M, K] @ ``b`` [K, N], float32 operands and result.

    On a GPU ``tl.dot`` needs K >= 16 (it failed to compile for blocks of 4 or 8 keys), so
    narrower tiles take a broadcast sum (N < 16 too, to be safe on small blocks). ``EXACT``
    (a float32 cache) asks for IEEE float32 products: by default ``tl.dot`` rounds float32
    operands to TF32 on tensor cores, which put errors of ~1e-3 into float32 attention on
    an H200.
    """
    if K < 16 or N < 16:
        # Reduced over the last axis: on an H200 (Triton 3.6) the same sum over the middle
        # axis of a[:, :, None] * b[None, :, :] came out wrong for K = 4 or 8.
        out = tl.sum(a[:, None, :] * tl.trans(b)[None, :, :], axis=2)
    elif EXACT:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, KEYS: tl.constexpr, HEAD_DIM: tl.constexpr, EXACT: tl.constexpr):
    """Fold one tile of scores ``s`` [rows, KEYS] (masked keys at -inf) and values ``v``
    [KEYS, HEAD_DIM] into the running max ``m_i``, sum ``l_i`` [rows] and output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tile_dot(p, v, KEYS, HEAD_DIM, EXACT)


@triton.jit
def finish(m_i, l_i, acc):
    """Normalized output [rows, head_dim] and log-sum-exp [rows]; rows that saw no key
    give 0 and -inf (they weigh nothing in a later merge)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    return out, lse
