"""Runs one step of the model over a batch of contexts and returns logits to sample from."""

from __future__ import annotations

import torch

from parrot.engines.builtin.attention.base import AttentionBatch
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.context_pool import ContextPool
from parrot.engines.builtin.model.llama import LlamaForCausalLM


class ModelRunner:
    def __init__(
        self, model: LlamaForCausalLM, pool: ContextPool, policy: SharedPrefixPolicy, device: torch.device
    ) -> None:
        self.model = model
        self.pool = pool
        self.policy = policy
        self.device = device
        self.shared_prefix_steps = 0  # steps that took the shared-prefix attention path

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> torch.Tensor | None:
        """Computes the items' tokens into the KV cache; logits [num_sampled, vocab] or None."""
        hidden = None
        inputs = None
        route = self.model.matmul_route
        if any(item.num_tokens for item in items):
            inputs = build_step(items, self.pool.block_size, self.policy, self.device)
            if inputs.attention.uses_shared_prefix:
                self.shared_prefix_steps += 1
            if route is not None:
                route.begin_step(inputs.attention.num_tokens, attended_keys(items, inputs.attention))
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.attention, self.pool.kv_cache)
        last = None
        if inputs is not None:
            # One gather of every item's last row; contexts keep views of it.
            last = hidden[torch.tensor([max(r, 0) for r in inputs.last_rows], device=hidden.device)]
        rows = []
        for n, item in enumerate(items):
            ctx = item.context
            if item.num_tokens:
                ctx.num_computed = item.start + item.num_tokens
                if ctx.num_computed == len(ctx.token_ids):
                    ctx.last_hidden = last[n]
                self.pool.register_full_blocks(ctx)
            if item.sample:
                rows.append(ctx.last_hidden)
        if not rows:
            return None
        if route is not None and inputs is None:
            route.begin_step(len(rows))  # sampling only: the LM head's product
        return self.model.compute_logits(torch.stack(rows))


def attended_keys(items: list[StepItem], attention: AttentionBatch) -> int:
    """Keys the step's queries attend in all, a shared prefix counted once per group."""
    keys = sum(item.start + item.num_tokens for item in items if item.num_tokens)
    for group in attention.shared_groups:
        keys -= (group.num_seqs - 1) * len(group.prefix_blocks) * group.block_size
    return keys
