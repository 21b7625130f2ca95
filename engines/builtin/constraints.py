"""Constrained decoding in the step (issue 21): each constrained generation's grammar
state, and the token masks applied to a step's logits before sampling.

A :class:`Constraint` is one generation's llguidance matcher (a ``deep_copy()`` of its
format's compiled template, see :mod:`parrot.engines.builtin.grammars`); it lives in the
job's generation state, so a preempted job keeps it, and it is advanced only by the
postprocess step, token by token, as the context is. :class:`ConstraintMasker` fills the
allowed-token bitmask of the step's constrained rows (in parallel on llguidance's thread
pool when there are several) and sets every other token's logit to -inf; unconstrained
rows are left as they are. The matcher allows the end-of-sequence tokens exactly where the
grammar may end, so a generation stops only with a complete value (or at ``max_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.numpy
import numpy as np
import torch

from parrot.wire.errors import ConstraintError


class Constraint:
    """The grammar state of one generation."""

    def __init__(self, template: llguidance.LLMatcher) -> None:
        self.matcher = template.deep_copy()

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            # llguidance's first line says why; the rest is its parser's internal state
            why = self.matcher.get_error().strip().splitlines()[0]
            raise ConstraintError(f"the output format refused token {token}: {why}")

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (keys, punctuation, the rest of a choice), in the
        tokenization the model would see for that text (llguidance stops short of a token
        that could merge with what comes after it).

        Only the run the grammar takes: llguidance tokenizes forced text with the model's
        tokenizer, which turns an added token's text (Qwen's ``<tool_call>``, Qwen3's
        ``<think>``) into that token, while its grammar matches added tokens only as special
        tokens; from the first one it refuses, the row samples under its mask instead."""
        tokens = self.matcher.compute_ff_tokens()
        return tokens[: self.matcher.validate_tokens(tokens)] if tokens else tokens

    @property
    def stopped(self) -> bool:
        """No token can follow: the value is complete (the generation ends here)."""
        return self.matcher.is_stopped()


class ConstraintMasker:
    """Masks the logits of a step's constrained rows (engine thread only)."""

    def __init__(self, eos_token_ids: frozenset[int]) -> None:
        self._executor = llguidance.LLExecutor()
        self._eos = sorted(eos_token_ids)
        self._bitmask: np.ndarray | None = None  # [rows, words] int32, grown as needed

    def apply(self, logits: torch.Tensor, constraints: Sequence[Constraint | None]) -> torch.Tensor:
        """``logits`` [rows, vocab] with the tokens each constrained row's grammar forbids at
        -inf (in place; returned). Rows whose constraint is None are untouched."""
        rows = [i for i, c in enumerate(constraints) if c is not None]
        if not rows:
            return logits
        vocab = logits.shape[1]
        bitmask = self._buffer(len(rows), vocab)  # [n, words] int32
        if len(rows) == 1:
            llguidance.numpy.fill_next_token_bitmask(constraints[rows[0]].matcher, bitmask, 0)
        else:
            pairs = [(constraints[i].matcher, n) for n, i in enumerate(rows)]
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, bitmask)
        words = bitmask  # [n, words]
        # Bit t % 32 of word t // 32 allows token t: little-endian bytes, little bit order.
        forbidden = np.unpackbits((~words).view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        forbidden = forbidden.view(np.bool_)  # [n, vocab]
        for n in np.flatnonzero(~words.any(axis=1)):  # a matcher in an error state allows
            forbidden[n, self._eos] = False  # nothing: let it end rather than draw from -inf
        if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
            # numpy's masked copy: ~4x torch's masked_fill_ on one CPU thread (16 x 49,152).
            array = logits.numpy()  # [rows, vocab], shares memory with ``logits``
            for n, i in enumerate(rows):
                np.copyto(array[i], -np.inf, where=forbidden[n])
            return logits
        mask = torch.from_numpy(forbidden).to(logits.device)  # [n, vocab]
        with torch.inference_mode():  # the logits are an inference tensor of the model's step
            if len(rows) == len(constraints):
                logits.masked_fill_(mask, float("-inf"))
            else:
                index = torch.tensor(rows, device=logits.device)  # [n]
                logits[index] = logits[index].masked_fill(mask, float("-inf"))
        return logits

    def _buffer(self, rows: int, vocab: int) -> np.ndarray:
        words = (vocab + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < rows or self._bitmask.shape[1] != words:
            self._bitmask = llguidance.numpy.allocate_token_bitmask(max(rows, 8), vocab)
        return self._bitmask[:rows]  # contiguous: the first rows of a row-major buffer
