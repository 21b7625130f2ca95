"""Token sampling: penalties, temperature, top-k, top-p, seeds; and stop-string checks.

Order as in transformers: repetition penalty (over the whole context), presence/frequency
penalties (OpenAI semantics, over generated tokens), temperature, top-k, top-p, then a draw
from the row's own generator, so a seeded request samples the same tokens whatever else is
in the batch.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import torch

from parrot.engines.protocol.sampling import SamplingParams


class SequenceSampling:
    """Sampling state of one generating sequence (engine thread only)."""

    def __init__(
        self, params: SamplingParams, context_token_ids: Sequence[int], device: torch.device
    ) -> None:
        self.params = params
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.seen: set[int] = set(context_token_ids) if params.repetition_penalty != 1 else set()
        self.counts: Counter[int] = Counter()

    def append(self, token_id: int) -> None:
        self.counts[token_id] += 1
        if self.params.repetition_penalty != 1:
            self.seen.add(token_id)

    def apply_penalties(self, row: torch.Tensor) -> torch.Tensor:  # [vocab] -> [vocab]
        p = self.params
        if p.repetition_penalty != 1 and self.seen:
            idx = torch.tensor(sorted(self.seen), dtype=torch.long, device=row.device)
            vals = row[idx]
            row = row.clone()
            row[idx] = torch.where(vals < 0, vals * p.repetition_penalty, vals / p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self.counts:
            idx = torch.tensor(list(self.counts), dtype=torch.long, device=row.device)
            counts = torch.tensor(list(self.counts.values()), dtype=row.dtype, device=row.device)
            row = row.clone()
            row[idx] -= p.presence_penalty + p.frequency_penalty * counts
        return row


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and the top-p nucleus to -inf (at least one token stays)."""
    if top_k and top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already hold more than top_p of the mass.
        drop = (torch.cumsum(probs, dim=-1) - probs) > top_p
        drop[0] = False
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return row


class Sampler:
    def sample(self, logits: torch.Tensor, seqs: Sequence[SequenceSampling]) -> list[int]:
        """``logits`` [num_seqs, vocab] float32 -> one token id per sequence."""
        if all(s.params.is_greedy and not s.params.has_penalties for s in seqs):
            return logits.argmax(dim=-1).tolist()
        tokens = []
        for row, seq in zip(logits, seqs, strict=True):
            p = seq.params
            row = seq.apply_penalties(row)
            if p.is_greedy:
                tokens.append(int(row.argmax()))
                continue
            row = filter_top_k_top_p(row / p.temperature, p.top_k, p.top_p)
            probs = torch.softmax(row, dim=-1)
            tokens.append(int(torch.multinomial(probs, 1, generator=seq.generator)))
        return tokens


class StopChecker:
    """Finds stop strings in generated text, and what must be held back while streaming."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]

    def check(self, text: str) -> int | None:
        """Index to truncate ``text`` at (the earliest stop string), or None."""
        found = [i for s in self.stops if (i := text.find(s)) >= 0]
        return min(found) if found else None

    def holdback(self, text: str) -> int:
        """Trailing characters that may be the start of a stop string, not to be shown yet."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
