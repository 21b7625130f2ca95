"""Runs one step of the model over a batch of contexts and returns logits to sample from.

The runner maps a batch to logits and changes no context: what the step computed is
recorded afterwards by the engine's postprocess step (:meth:`ContextPool.computed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parrot.engines.builtin.attention.base import AttentionBatch
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.context_pool import ContextPool
from parrot.engines.builtin.cuda_graphs import DecodeGraphs
from parrot.engines.builtin.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class StepOutput:
    logits: torch.Tensor | None  # [num_sampled, vocab], the sampled items in order; None: none sampled
    # [num_items, hidden]: each item's last computed row (garbage for items that computed
    # nothing); None when the step computed no token.
    last_hidden: torch.Tensor | None
    shared_prefix: bool  # the step took the shared-prefix attention path
    graph: bool = False  # the step was replayed as a CUDA graph


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        pool: ContextPool,
        policy: SharedPrefixPolicy,
        device: torch.device,
        graphs: DecodeGraphs | None = None,  # decode steps that fit run as CUDA graphs
    ) -> None:
        self.model = model
        self.pool = pool  # read only: its KV cache is written by the model's layers
        self.policy = policy
        self.device = device
        self.graphs = graphs

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> StepOutput:
        """Computes the items' tokens into the KV cache; logits of the items that sample."""
        inputs = None
        last = None
        route = self.model.matmul_route
        graph = self.graphs is not None and self.graphs.fits(items)
        if graph:
            last = self.graphs.run(items)  # one row per item, in order
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
        if not rows:
            return StepOutput(None, last, shared, graph)
        if route is not None and last is None:
            route.begin_step(len(rows))  # sampling only: the LM head's product
        return StepOutput(self.model.compute_logits(torch.stack(rows)), last, shared, graph)


def attended_keys(items: list[StepItem], attention: AttentionBatch) -> int:
    """Keys the step's queries attend in all, a shared prefix counted once per group."""
    keys = sum(item.start + item.num_tokens for item in items if item.num_tokens)
    for group in attention.shared_groups:
        keys -= (group.num_seqs - 1) * len(group.prefix_blocks) * group.block_size
    return keys
