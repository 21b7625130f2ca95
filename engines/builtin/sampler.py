"""Token sampling: penalties, temperature, top-k, top-p, seeds; and stop-string checks.

Order as in transformers: repetition penalty (over the whole context), presence/frequency
penalties (OpenAI semantics, over generated tokens), temperature, top-k, top-p, then a draw.
Every row draws its noise from its own generator (exponential race: argmax of probs / q with
q ~ Exp(1)), so a seeded request samples the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from parrot.wire.sampling import SamplingParams
from parrot.wire.tool_syntax import GENERIC, ToolSyntax


class _DeviceTokenIds:
    """A growing list of token ids mirrored on a device; appended ids are copied when read."""

    def __init__(self, token_ids: Sequence[int], device: torch.device) -> None:
        self._device = device
        self._ids = torch.tensor(list(token_ids), dtype=torch.long, device=device)  # [num_ids]
        self._pending: list[int] = []

    def append(self, token_id: int) -> None:
        self._pending.append(token_id)

    def tensor(self) -> torch.Tensor:  # [num_ids]
        if self._pending:
            new = torch.tensor(self._pending, dtype=torch.long, device=self._device)  # [num_pending]
            self._ids = torch.cat([self._ids, new])
            self._pending.clear()
        return self._ids


class SequenceSampling:
    """Sampling state of one generating sequence (engine thread only).

    ``context_token_ids`` (prompt and anything before the generation) is copied; tokens
    sampled later are recorded with :meth:`append`. The generator lives on ``device``, which
    must be the device of the logits given to :meth:`Sampler.sample`.
    """

    def __init__(
        self, params: SamplingParams, context_token_ids: Sequence[int], device: torch.device | str
    ) -> None:
        self.params = params
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        if params.seed is None:
            self.generator.seed()  # a fresh non-deterministic seed
        else:
            self.generator.manual_seed(params.seed)
        self.generated_token_ids: list[int] = []
        # Unique ids of the whole context, for the repetition penalty.
        self._seen: set[int] = set()
        self._seen_ids: _DeviceTokenIds | None = None
        if params.repetition_penalty != 1:
            self._seen = set(context_token_ids)
            self._seen_ids = _DeviceTokenIds(sorted(self._seen), self.device)
        # Generated ids (with repeats), for the presence and frequency penalties.
        self._generated_ids: _DeviceTokenIds | None = None
        if params.presence_penalty != 0 or params.frequency_penalty != 0:
            self._generated_ids = _DeviceTokenIds([], self.device)

    def append(self, token_id: int) -> None:
        """Record a sampled token (it now counts for every penalty)."""
        self.generated_token_ids.append(token_id)
        if self._seen_ids is not None and token_id not in self._seen:
            self._seen.add(token_id)
            self._seen_ids.append(token_id)
        if self._generated_ids is not None:
            self._generated_ids.append(token_id)

    @property
    def counts(self) -> Counter[int]:
        """How often each token was generated."""
        return Counter(self.generated_token_ids)

    def context_ids(self) -> torch.Tensor:  # [num_unique_context_tokens]
        """Unique ids of prompt and generated tokens (empty without a repetition penalty)."""
        if self._seen_ids is None:
            return torch.empty(0, dtype=torch.long, device=self.device)
        return self._seen_ids.tensor()

    def generated_ids(self) -> torch.Tensor:  # [num_generated]
        """Generated ids with repeats (empty without presence/frequency penalties)."""
        if self._generated_ids is None:
            return torch.empty(0, dtype=torch.long, device=self.device)
        return self._generated_ids.tensor()


def _token_counts(ids: Sequence[torch.Tensor], vocab: int, like: torch.Tensor) -> torch.Tensor:
    """How often each token occurs in each row's ids: [len(ids), vocab] with ``like``'s dtype.
    Ids outside the vocabulary (an embedding larger than the LM head) are ignored."""
    lengths = [len(t) for t in ids]
    counts = torch.zeros(len(ids), vocab + 1, dtype=like.dtype, device=like.device)  # [rows, vocab + 1]
    total = sum(lengths)
    if total:
        flat = torch.cat(list(ids)).clamp(max=vocab)  # [total]; out-of-vocab ids land in the spare column
        rows = torch.repeat_interleave(
            torch.arange(len(ids), device=like.device),
            torch.tensor(lengths, device=like.device),
            output_size=total,
        )  # [total]
        counts.index_put_((rows, flat), torch.ones_like(flat, dtype=like.dtype), accumulate=True)
    return counts[:, :vocab]


def _row_values(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:  # [rows, 1]
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)


def apply_penalties(logits: torch.Tensor, seqs: Sequence[SequenceSampling]) -> torch.Tensor:
    """Logits [num_seqs, vocab] with each row's penalties applied, as a new tensor (the input is
    not modified; returned as is when no row has a penalty).

    Repetition penalty as transformers' ``RepetitionPenaltyLogitsProcessor`` over the context:
    a negative logit is multiplied by the penalty, another divided. Presence and frequency
    penalties as OpenAI over generated tokens: ``logit -= presence * (count > 0) + frequency * count``.
    """
    vocab = logits.shape[1]
    repeat = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1]
    counted = [i for i, s in enumerate(seqs) if s.params.presence_penalty or s.params.frequency_penalty]
    if not repeat and not counted:
        return logits
    logits = logits.clone()
    if repeat:
        rows = torch.tensor(repeat, device=logits.device)  # [r]
        sub = logits[rows]  # [r, vocab]
        seen = _token_counts([seqs[i].context_ids() for i in repeat], vocab, sub) > 0  # [r, vocab]
        penalty = _row_values([seqs[i].params.repetition_penalty for i in repeat], sub)  # [r, 1]
        logits[rows] = torch.where(seen, torch.where(sub < 0, sub * penalty, sub / penalty), sub)
    if counted:
        rows = torch.tensor(counted, device=logits.device)  # [c]
        sub = logits[rows]  # [c, vocab]
        counts = _token_counts([seqs[i].generated_ids() for i in counted], vocab, sub)  # [c, vocab]
        presence = _row_values([seqs[i].params.presence_penalty for i in counted], sub)  # [c, 1]
        frequency = _row_values([seqs[i].params.frequency_penalty for i in counted], sub)  # [c, 1]
        logits[rows] = sub - presence * (counts > 0) - frequency * counts
    return logits


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: Sequence[int] | None, top_p: Sequence[float] | None
) -> torch.Tensor:
    """Logits [rows, vocab] with the tokens outside each row's top-k, then outside its top-p
    nucleus, set to -inf (a new tensor). ``top_k[i] == 0`` and ``top_p[i] == 1`` disable a
    filter for row ``i``. The masks are those of transformers' ``TopKLogitsWarper`` (ties with
    the k-th value stay) and ``TopPLogitsWarper`` (the most likely token always stays)."""
    vocab = logits.shape[1]
    neg_inf = float("-inf")
    ordered, order = logits.sort(dim=-1)  # [rows, vocab] ascending, like transformers
    if top_k is not None:
        keep = [min(k, vocab) if k > 0 else vocab for k in top_k]
        kth_index = torch.tensor([vocab - k for k in keep], device=logits.device).unsqueeze(1)  # [rows, 1]
        ordered = ordered.masked_fill(ordered < ordered.gather(1, kth_index), neg_inf)
    if top_p is not None:
        # Drop the least likely tokens whose cumulative mass stays within 1 - top_p; the
        # threshold is rounded from a Python float as transformers does. -1 drops nothing.
        cut = _row_values([1 - p if p < 1 else -1.0 for p in top_p], ordered)  # [rows, 1]
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= cut  # [rows, vocab]
        drop[:, -1] = False
        ordered = ordered.masked_fill(drop, neg_inf)
    return torch.empty_like(logits).scatter_(1, order, ordered)


class Sampler:
    """Picks the next token of every sequence in a batch."""

    def sample(self, logits: torch.Tensor, seqs: Sequence[SequenceSampling]) -> list[int]:
        """``logits`` [num_seqs, vocab] (on the sequences' device) -> one token id per sequence.
        Does not record the tokens: call :meth:`SequenceSampling.append` for those kept."""
        if logits.shape[0] != len(seqs):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(seqs)} sequences")
        if not seqs:
            return []
        params = [s.params for s in seqs]
        if all(p.is_greedy and not p.has_penalties for p in params):
            return logits.argmax(dim=-1).tolist()
        logits = apply_penalties(logits.float(), seqs)  # [num_seqs, vocab]
        tokens = logits.argmax(dim=-1)  # [num_seqs]; greedy rows are done
        drawn = [i for i, p in enumerate(params) if not p.is_greedy]
        if drawn:
            rows = torch.tensor(drawn, device=logits.device)  # [d]
            tokens[rows] = self._draw(logits[rows], [seqs[i] for i in drawn])
        return tokens.tolist()

    @staticmethod
    def _draw(logits: torch.Tensor, seqs: Sequence[SequenceSampling]) -> torch.Tensor:
        """Temperature, top-k, top-p and a random draw for logits [rows, vocab] -> [rows]."""
        params = [s.params for s in seqs]
        logits = logits / _row_values([p.temperature for p in params], logits)  # [rows, vocab]
        filtered = [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1]
        if filtered:
            rows = torch.tensor(filtered, device=logits.device)  # [f]
            top_k = [params[i].top_k for i in filtered] if any(params[i].top_k for i in filtered) else None
            top_p = (
                [params[i].top_p for i in filtered] if any(params[i].top_p < 1 for i in filtered) else None
            )
            logits[rows] = filter_top_k_top_p(logits[rows], top_k, top_p)
        probs = logits.softmax(dim=-1)  # [rows, vocab]
        noise = torch.empty_like(probs)  # [rows, vocab]
        for row, seq in zip(noise, seqs, strict=True):
            row.exponential_(generator=seq.generator)
        # argmax(p / q) with q ~ Exp(1) draws a token with probability p; q > 0 keeps it finite.
        return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)


class StopChecker:
    """Finds stop strings in generated text, and what must be held back while streaming."""

    closing = ""  # what the text gets after its cut (see RepeatedCallStop)

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]

    def check(self, text: str) -> int | None:
        """Index to truncate ``text`` at (the earliest occurrence of any stop string), or None."""
        found = [i for s in self.stops if (i := text.find(s)) >= 0]
        return min(found) if found else None

    def holdback(self, text: str) -> int:
        """How many trailing characters of ``text`` may be the start of a stop string and so
        must not be streamed yet: the longest suffix that is a proper prefix of a stop."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


class RepeatedCallStop(StopChecker):
    """Stop strings, and for a tool answer (in the request's tool syntax) the end of its
    list of calls where a call comes again (same name, same arguments): the text is cut
    after the last new call and closed as the syntax closes a list (``]}`` in the generic
    format), so the answer is whole and no token is spent on a loop. A small model asked
    for calls with parallel calls on repeats its one call until ``max_tokens`` (issue 36);
    the readers of the answer end the list there too (the syntax's reader), so the answer
    is the same, sooner."""

    def __init__(self, stops: Sequence[str], syntax: ToolSyntax = GENERIC) -> None:
        super().__init__(stops)
        self.closing = syntax.closing
        self._answer = syntax.reader()
        self._read = 0  # characters of the text fed to the answer so far

    def check(self, text: str) -> int | None:
        cut = super().check(text)
        if cut is not None:
            self.closing = ""  # a stop string of the request's: its text, as cut
            return cut
        self._answer.feed(text[self._read :])
        self._read = len(text)
        return self._answer.cut_at

    def holdback(self, text: str) -> int:
        """The call being written is held back until it is whole: the text streamed never
        runs past a cut."""
        held = super().holdback(text)
        pending = self._answer.pending_from
        return held if pending is None else max(held, len(text) - pending)
