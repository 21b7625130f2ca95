"""Runs one step of the model over a batch of contexts and returns logits to sample from.

The runner maps a batch to logits and changes no context: what the step computed is
recorded afterwards by the engine's postprocess step (:meth:`ContextPool.computed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from parrot.engines.builtin.attention.base import AttentionBatch
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.context_pool import ContextPool
from parrot.engines.builtin.model.llama import LlamaForCausalLM


class WholeDecodeStep(Protocol):
    """A decode step run whole rather than op by op: CUDA graphs (cuda_graphs.py) or the
    fused CPU step (fused_decode.py). ``kind`` names it in the step counters and trace."""

    kind: str

    def fits(self, items: list[StepItem]) -> bool: ...

    def run(self, items: list[StepItem]) -> torch.Tensor: ...  # [len(items), hidden] final-normed


@dataclass(frozen=True)
class StepOutput:
    logits: torch.Tensor | None  # [num_sampled, vocab], the sampled items in order; None: none sampled
    # [num_items, hidden]: each item's last computed row (garbage for items that computed
    # nothing); None when the step computed no token.
    last_hidden: torch.Tensor | None
    shared_prefix: bool  # the step took the shared-prefix attention path
    path: str = "eager"  # or the WholeDecodeStep's kind that ran it: "graph" | "fused"


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        pool: ContextPool,
        policy: SharedPrefixPolicy,
        device: torch.device,
        whole_step: WholeDecodeStep | None = None,  # decode steps that fit run whole
    ) -> None:
        self.model = model
        self.pool = pool  # read only: its KV cache is written by the model's layers
        self.policy = policy
        self.device = device
        self.whole_step = whole_step

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> StepOutput:
        """Computes the items' tokens into the KV cache; logits of the items that sample."""
        inputs = None
        last = None
        route = self.model.matmul_route
        whole = self.whole_step if self.whole_step is not None and self.whole_step.fits(items) else None
        if whole is not None:
            last = whole.run(items)  # one row per item, in order
        elif any(item.num_tokens for item in items):
            inputs = build_step(items, self.pool.block_size, self.policy, self.device)
            if route is not None:
                route.begin_step(inputs.attention.num_tokens, attended_keys(items, inputs.attention))
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.attention, self.pool.kv_cache)
            # One gather of every item's last row; contexts keep views of it.
            last = hidden[torch.tensor([max(r, 0) for r in inputs.last_rows], device=hidden.device)]
        # A sampling item that computed tokens computed its whole prompt: its last row is the
        # one to sample from; one that computed nothing samples from its stored state.
        rows = [
            last[n] if item.num_tokens else item.context.last_hidden
            for n, item in enumerate(items)
            if item.sample
        ]
        shared = inputs is not None and inputs.attention.uses_shared_prefix
        path = "eager" if whole is None else whole.kind
        if not rows:
            return StepOutput(None, last, shared, path)
        if route is not None and last is None:
            route.begin_step(len(rows))  # sampling only: the LM head's product
        return StepOutput(self.model.compute_logits(torch.stack(rows)), last, shared, path)


def attended_keys(items: list[StepItem], attention: AttentionBatch) -> int:
    """Keys the step's queries attend in all, a shared prefix counted once per group."""
    keys = sum(item.start + item.num_tokens for item in items if item.num_tokens)
    for group in attention.shared_groups:
        keys -= (group.num_seqs - 1) * len(group.prefix_blocks) * group.block_size
    return keys
