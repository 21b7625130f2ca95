"""The online-softmax step every attention kernel here shares (device functions)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc):
    """Fold one tile of scores ``s`` [rows, keys] (masked keys at -inf) and values ``v``
    [keys, head_dim] into the running max ``m_i``, sum ``l_i`` [rows] and output ``acc``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


@triton.jit
def finish(m_i, l_i, acc):
    """Normalized output [rows, head_dim] and log-sum-exp [rows]; rows that saw no key
    give 0 and -inf (they weigh nothing in a later merge)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    return out, lse
