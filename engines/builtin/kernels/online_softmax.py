"""The online-softmax step every attention kernel here shares (device functions).

Scores are kept in base 2 (``exp2`` is the hardware's instruction; the caller folds
``log2(e)`` into the score scale) and turned back into a natural log-sum-exp at the end,
which is what the merges and the callers read.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # multiplies a natural-log score into base 2


@triton.jit
def softmax_tile(q, k, v, allowed, m_i, l_i, acc, qk_scale, EXACT: tl.constexpr):
    """Fold one tile of keys ``k`` / values ``v`` [TILE_N, head_dim] into the running max
    ``m_i``, sum ``l_i`` [rows] (base 2) and output ``acc`` [rows, head_dim] (float32) of the
    queries ``q`` [rows, head_dim]; ``allowed`` [rows or 1, TILE_N] masks keys out.

    The products run in the cache's dtype on the tensor cores with float32 accumulation;
    ``EXACT`` (a float32 cache) asks for IEEE float32 products, since ``tl.dot`` would
    otherwise round float32 operands to TF32 (errors of ~1e-3 on an H200). Tiles must be at
    least 16 wide on every axis (``tl.dot`` on a GPU).
    """
    if EXACT:  # noqa: SIM108 (a branch on a constexpr: one of the two is compiled)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(allowed, s * qk_scale, float("-inf"))  # [rows, TILE_N]
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    if EXACT:  # noqa: SIM108
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + pv


@triton.jit
def finish_base2(m_i, l_i, acc):
    """Normalized output [rows, head_dim] and natural log-sum-exp [rows]; rows that saw no
    key give 0 and -inf (they weigh nothing in a later merge)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    return out, lse
