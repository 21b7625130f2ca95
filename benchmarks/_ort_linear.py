"""ONNX Runtime's ``MatMulNBits`` as a linear layer: an option measured by cpu_options.py.

Not part of the engine: in whole decode steps it was no faster than torch's int4 kernel
(docs/benchmarks.md, "The CPU default and batch-1 decode against llama-server").

``MatMulNBits`` (the ``com.microsoft`` contrib op, ``accuracy_level=4``: activations
quantized to int8 per block, multiplied on the int8 dot-product instructions, as llama.cpp
multiplies Q4 weights by Q8 activations) computes ``(code - 2^(bits-1)) * scale`` per block.
The zero points of :class:`Int4Codes` (Q4_1's minimum: ``w = (q - 8) * scale + zero``) are
not integers, so their part, ``blocksum(x) @ zero.T``, is a small product added in the same
graph. Every session shares one process-wide thread pool: a pool per session (121 of them)
made the products 2.4x (sleeping workers) to 40x (spinning) slower.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi import _pybind_state

from parrot.engines.builtin.model.gguf_weights import GGUFWeights
from parrot.engines.builtin.model.quant import Int4Codes, PackedLinear

_pool: list[int] = []  # the shared pool's size, once made


def session(nodes: list, inits: list, in_features: int, out_features: int, threads: int):
    if not _pool:
        _pybind_state.set_global_thread_pool_sizes(threads, 1)  # before the first session
        _pool.append(threads)
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", in_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", out_features])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class OrtBlockLinear(PackedLinear):
    """``x @ W.T`` with ``W[n, k] = (codes[n, k] - 2^(bits-1)) * scale[n, k // block] (+ zero)``."""

    def __init__(self, codes, scale, zero, bits: int, block: int, threads: int) -> None:
        super().__init__(codes.shape[0], codes.shape[1], None)
        out_features, in_features = codes.shape
        groups = in_features // block
        q = codes.to(torch.uint8).view(out_features, groups, block).numpy()
        if bits == 4:  # two codes a byte, the first in the low nibble
            q = q[..., 0::2] | (q[..., 1::2] << 4)
        inits = [
            numpy_helper.from_array(np.ascontiguousarray(q), "w"),
            numpy_helper.from_array(scale.float().contiguous().view(-1).numpy(), "scale"),
        ]
        attrs = dict(K=in_features, N=out_features, bits=bits, block_size=block, accuracy_level=4)
        product = "y" if zero is None else "product"
        nodes = [
            helper.make_node("MatMulNBits", ["x", "w", "scale"], [product], domain="com.microsoft", **attrs)
        ]
        if zero is not None:  # + blocksum(x) @ zero.T: [rows, groups] @ [groups, out]
            inits += [
                numpy_helper.from_array(np.array([0, groups, block], dtype=np.int64), "blocks"),
                numpy_helper.from_array(np.array([2], dtype=np.int64), "last"),
                numpy_helper.from_array(zero.float().t().contiguous().numpy(), "zero_t"),
            ]
            nodes += [
                helper.make_node("Reshape", ["x", "blocks"], ["x_blocks"]),  # [rows, groups, block]
                helper.make_node("ReduceSum", ["x_blocks", "last"], ["sums"], keepdims=0),
                helper.make_node("MatMul", ["sums", "zero_t"], ["zero_part"]),
                helper.make_node("Add", [product, "zero_part"], ["y"]),
            ]
        self.session = session(nodes, inits, in_features, out_features, threads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [rows, in] -> [rows, out]
        if self.dense is not None and x.shape[0] >= self.dense_rows:
            return super().forward(x)
        return torch.from_numpy(self.session.run(None, {"x": x.detach().contiguous().numpy()})[0])


def q8_0(gguf: GGUFWeights, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's codes [out, in] int8 and scales [out, in // 32] (``w = d * q``)."""
    raw = torch.from_numpy(np.array(gguf.tensors[name].data))  # [out, groups * 34] uint8
    blocks = raw.view(raw.shape[0], -1, 34)  # float16 d, then 32 int8 codes
    scale = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    return blocks[..., 2:].contiguous().view(torch.int8).reshape(raw.shape[0], -1), scale


def swap_to_onnxruntime(model, gguf: GGUFWeights, threads: int, dense_rows: int) -> None:
    """Replace a gguf-mode model's int4 linears and Q8_0 head by ONNX Runtime ones."""
    parts = {
        "qkv_proj": ["attn_q", "attn_k", "attn_v"],
        "o_proj": ["attn_output"],
        "gate_up_proj": ["ffn_gate", "ffn_up"],
        "down_proj": ["ffn_down"],
    }
    for i, layer in enumerate(model.layers):
        for parent in (layer.self_attn, layer.mlp):
            for attr, names in parts.items():
                if hasattr(parent, attr):
                    codes = Int4Codes.cat([gguf.int4(f"blk.{i}.{n}.weight") for n in names])
                    new = OrtBlockLinear(codes.codes, codes.scale, codes.zero, 4, 32, threads)
                    new.keep_dense_copy(codes.dequantize(), dense_rows)
                    setattr(parent, attr, new)
    codes, scale = q8_0(gguf, "token_embd.weight")
    head = OrtBlockLinear(codes.to(torch.int16) + 128, scale, None, 8, 32, threads)
    model.set_head(head)
