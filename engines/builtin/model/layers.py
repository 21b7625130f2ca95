"""The norm and the gated MLP of the decoder, as each supported family computes them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from parrot.engines.builtin.model.model_config import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm; Gemma's ``(1 + weight)`` form is this one with 1 added to the weight at load."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.shape = (dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # the casts below would be no-ops, each still an op call
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        # Normalize in float32 like transformers, then cast back.
        return F.rms_norm(x.float(), self.shape, self.weight.float(), self.eps).to(x.dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATION_FUNCTIONS = {"silu": F.silu, "gelu_pytorch_tanh": _gelu_tanh}


class MLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: SwiGLU (silu) or GeGLU (Gemma's tanh-approximated gelu)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act = ACTIVATION_FUNCTIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.act(gate) * up)
