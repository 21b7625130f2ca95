"""Builds the engine's model in the configured dtype and weight format.

``exact`` loads the checkpoint's weights in the model dtype. The quantized formats start
from the same model and swap its linear layers (q/k/v, o, gate/up, down and the LM head)
for packed ones; norms and the embedding table stay as they were. With ``dense_rows``, each
packed layer also keeps a dense copy of its de-quantized weights for steps of that many
rows or more (large batches, prefill), where the packed kernels are slower; its dtype is
the one this CPU multiplies faster (``cpu_paths.choose_dense_dtype``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits
from torch import nn

from parrot.engines.builtin.attention.base import AttentionBackend
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.model import int_dot
from parrot.engines.builtin.model.blas_linear import AUTO_MIN_SPEEDUP, BlasLinear, MatmulRoute, blas_speedup
from parrot.engines.builtin.model.cpu_paths import DenseChoice, choose_dense_dtype, cpu_features
from parrot.engines.builtin.model.gguf_weights import GGUFWeights
from parrot.engines.builtin.model.llama import LlamaForCausalLM
from parrot.engines.builtin.model.loader import default_model_path, load_state_dict
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model.quant import (
    INT4_GROUP_SIZES,
    Int4Codes,
    Int4Linear,
    Int8Linear,
    PackedLinear,
    int4_fits,
    quantize_int4,
)
from parrot.engines.builtin.native import load_extension

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinearPaths:
    """Besides its packed weights, a packed layer keeps them in ``dtype`` for steps of
    ``from_rows`` rows or more (0: no copy), and multiplies steps of at most ``int_rows`` rows
    with int8 activations on ``extension`` (0: never)."""

    from_rows: int
    dtype: torch.dtype = torch.bfloat16
    int_rows: int = 0
    extension: object = None

    def apply(
        self, layer: PackedLinear, weight: Callable[[], torch.Tensor], codes: Int4Codes | None = None
    ) -> PackedLinear:
        """``layer`` with its paths (``weight``: makes its de-quantized weights, only for a
        copy; ``codes``: int4's)."""
        if self.from_rows:
            layer.keep_dense_copy(weight(), self.from_rows, self.dtype)
        if self.int_rows and int_dot.fits(layer):
            layer.use_int8_activations(self.int_rows, int_dot.int_weights(layer, codes), self.extension)
        return layer


def build_model(
    config: EngineConfig, model_config: ModelConfig, folder: Path, backend: AttentionBackend
) -> LlamaForCausalLM:
    device, dtype = config.torch_device(), config.torch_dtype()
    if device.type == "cpu":
        log.info("CPU: %s", cpu_features().describe())
    with torch.device(device):
        model = LlamaForCausalLM(model_config, backend).to(dtype)
    model.load_hf_state_dict(load_state_dict(folder, device, dtype))
    if config.weights != "exact":
        model.dense_choice = choice = dense_choice(config, model_config)
        model.int_dot_choice = small = int_dot_choice(config, model_config)
        extension = load_extension() if small.rows else None
        dtype = choice.dtype if choice else torch.bfloat16
        paths = LinearPaths(config.dense_rows, dtype, small.rows, extension)
    if config.weights in ("int8", "int4"):
        quantize_linears(model, config.weights, paths)
    elif config.weights == "gguf":
        gguf_path = Path(config.model).expanduser() if config.model else default_model_path()
        gguf = GGUFWeights(gguf_path, model_config.num_heads, model_config.num_kv_heads, folder)
        load_gguf_linears(model, gguf, paths)
    if config.uses_cpu_matmul_choice():
        threads = config.num_threads or torch.get_num_threads()
        route = MatmulRoute(config.blas_rows, config.blas_keys, threads)
        route_linears_to_blas(model, config.cpu_matmul, route)
    return model.eval()


def dense_choice(config: EngineConfig, model_config: ModelConfig) -> DenseChoice | None:
    """The dense copies' dtype (None: no copies), timed on the model's largest layer."""
    if config.dense_rows == 0:
        return None
    out_features = 2 * model_config.intermediate_size  # gate and up, one product
    choice = choose_dense_dtype(config.dense_dtype, out_features, model_config.hidden_size)
    log.info("dense copies for steps of %d rows or more: %s", config.dense_rows, choice.describe())
    return choice


def int_dot_choice(config: EngineConfig, model_config: ModelConfig) -> int_dot.IntDotChoice:
    """Up to how many rows the packed products take int8 activations, timed on gate and up."""
    extension = None if config.int8_activations == "off" else load_extension()
    max_rows = config.dense_rows - 1 if config.dense_rows else max(int_dot.PROBE_ROWS)
    hidden, out_features = model_config.hidden_size, 2 * model_config.intermediate_size
    choice = int_dot.choose_int_rows(config.int8_activations, extension, hidden, out_features, max_rows)
    log.info("int8 activations for steps of %s", choice.describe())
    return choice


def linear_slots(model: LlamaForCausalLM) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute) of every linear layer that a weight format replaces."""
    slots: list[tuple[nn.Module, str]] = []
    for layer in model.layers:
        slots += [(layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj")]
        slots += [(layer.mlp, "gate_up_proj"), (layer.mlp, "down_proj")]
    return slots


def int4_group_size(in_features: int) -> int | None:
    """The smallest group the kernel takes that divides the input size (finest scales)."""
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


def packed_int4(codes: Int4Codes, bias: torch.Tensor | None, paths: LinearPaths) -> PackedLinear:
    return paths.apply(Int4Linear(codes, bias), codes.dequantize, codes)


def packed_int8(weight: torch.Tensor, bias: torch.Tensor | None, paths: LinearPaths) -> PackedLinear:
    layer = Int8Linear.from_float(weight, bias)
    return paths.apply(layer, layer.dequantized)


def quantized(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str, paths: LinearPaths) -> PackedLinear:
    """``weight`` [out, in] as an int4 linear where the kernel's shape rules allow, else int8."""
    if fmt == "int4":
        group = int4_group_size(weight.shape[1])
        if group is not None and int4_fits(weight.shape[0], weight.shape[1], group):
            return packed_int4(quantize_int4(weight, group), bias, paths)
    return packed_int8(weight, bias, paths)


def quantize_linears(model: LlamaForCausalLM, fmt: str, paths: LinearPaths) -> None:
    """Replace the linears (and the LM head) by int8 or int4 ones quantized from their weights."""
    with torch.no_grad():
        for parent, name in linear_slots(model):
            old: nn.Linear = getattr(parent, name)
            setattr(parent, name, quantized(old.weight, old.bias, fmt, paths))
        model.set_head(quantized(model.head_weight(), None, fmt, paths))


def load_gguf_linears(model: LlamaForCausalLM, gguf: GGUFWeights, paths: LinearPaths) -> None:
    """Linears from the GGUF's own Q4_0/Q4_1 blocks; tensors of other types as int8."""

    def linear(names: list[str], old: nn.Module | None) -> nn.Module:
        parts = [gguf.int4(n) for n in names]
        bias = None if old is None else old.bias
        if all(p is not None for p in parts):
            codes = Int4Codes.cat(parts)
            if int4_fits(codes.codes.shape[0], codes.codes.shape[1], codes.group_size):
                return packed_int4(codes, bias, paths)
        weight = torch.cat([gguf.dequantized(n) for n in names])
        return packed_int8(weight, bias, paths)

    fused = model.config.architecture == "phi3"  # attn_qkv; ffn_up holds gate and up
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            blk = f"blk.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [f"{blk}attn_qkv.weight"] if fused else [f"{blk}attn_{p}.weight" for p in "qkv"]
            gate_up = [f"{blk}ffn_up.weight"] if fused else [f"{blk}ffn_gate.weight", f"{blk}ffn_up.weight"]
            attn.qkv_proj = linear(qkv, attn.qkv_proj)
            attn.o_proj = linear([f"{blk}attn_output.weight"], attn.o_proj)
            mlp.gate_up_proj = linear(gate_up, mlp.gate_up_proj)
            mlp.down_proj = linear([f"{blk}ffn_down.weight"], mlp.down_proj)
        head = "output.weight" if "output.weight" in gguf else "token_embd.weight"
        model.set_head(linear([head], None))


def route_linears_to_blas(model: LlamaForCausalLM, choice: str, route: MatmulRoute) -> None:
    """Swap the float32 linears (and the LM head) for BLAS ones, if ``choice`` says so.

    "auto" multiplies one row by the LM head, the largest matrix, on both libraries and
    takes BLAS when that is at least ``AUTO_MIN_SPEEDUP`` times faster. The model keeps
    the route, which the runner sets before each step.
    """
    threadpool_limits(limits=route.threads, user_api="blas")
    if choice == "auto":
        speedup = blas_speedup(model.head_weight(), route.threads)
        log.info("cpu matmul: numpy's BLAS is %.2fx torch on the LM head at one row", speedup)
        if speedup < AUTO_MIN_SPEEDUP:
            return
    for parent, name in linear_slots(model):
        old: nn.Linear = getattr(parent, name)
        setattr(parent, name, BlasLinear(old.weight, old.bias, route))
    model.set_head(BlasLinear(model.head_weight(), None, route))
    model.matmul_route = route
