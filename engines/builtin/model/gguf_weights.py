"""A GGUF file's own quantized weights, read without de-quantizing them to float.

Q4_0 and Q4_1 blocks (32 weights, a float16 scale and, for Q4_1, a float16 minimum) are
unpacked into :class:`Int4Codes` with group size 32, which the int4 kernel runs exactly.
Other types are de-quantized (by the ``gguf`` package) and left to the caller.

llama.cpp stores a Llama-architecture file's q and k projections with their rows permuted
for its interleaved rotary layout; transformers (and so this engine's float weights)
un-permute them. The same row permutation is applied to the codes, which is exact since
blocks run along rows. Other architectures (qwen2, qwen3, phi3, gemma3) are stored as they
are. Phi-3 files hold q/k/v as one ``attn_qkv`` and gate/up as one ``ffn_up`` tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from parrot.engines.builtin.model.quant import Int4Codes
from parrot.engines.protocol.errors import ModelLoadError

BLOCK = 32  # weights per Q4_0 / Q4_1 / Q8_0 block
# In a converted folder (loader.py): the file's tensors as stored; not part of the float weights.
RAW_TENSORS_FILE = "gguf_tensors.safetensors"
ARCH_KEY = "general.architecture"


class RawTensor(NamedTuple):
    kind: str  # llama.cpp's type name: Q4_1, Q8_0, F32, ...
    data: np.ndarray  # [rows, bytes per row] uint8, as stored in the file
    row_len: int  # weights per row


class GGUFWeights:
    """The tensors of one GGUF file by their llama.cpp names (``blk.3.attn_q.weight``).

    Read from the copy of its tensors that the converter saved into ``folder`` when there is
    one (0.1 s), else from the file itself (``GGUFReader`` parses every metadata field, the
    tokenizer's 49,152 tokens too: 4 s for the bundled model).
    """

    def __init__(
        self, path: str | Path, num_heads: int, num_kv_heads: int, folder: Path | None = None
    ) -> None:
        saved = None if folder is None else Path(folder) / RAW_TENSORS_FILE
        if saved is not None and saved.is_file():
            self.architecture, self.tensors = load_raw_tensors(saved)
        else:
            self.architecture, self.tensors = read_raw_tensors(path)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def type_name(self, name: str) -> str:
        return self._tensor(name).kind

    def int4(self, name: str) -> Int4Codes | None:
        """The tensor's 4-bit codes (rows as transformers orders them), None if not Q4_0/Q4_1."""
        tensor = self._tensor(name)
        kind = tensor.kind
        if kind not in ("Q4_0", "Q4_1"):
            return None
        raw = torch.from_numpy(np.array(tensor.data))  # [out, in // 32 * block bytes] uint8
        out_features = raw.shape[0]
        block_bytes = 18 if kind == "Q4_0" else 20
        blocks = raw.view(out_features, -1, block_bytes)  # [out, groups, bytes]
        d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [out, groups]
        packed = blocks[..., block_bytes - 16 :]  # [out, groups, 16]: weight j low, j + 16 high
        codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).to(torch.int32)  # [out, groups, 32]
        if kind == "Q4_0":  # w = d * (q - 8)
            zero = torch.zeros_like(d)
        else:  # w = d * q + m = (q - 8) * d + (m + 8 * d)
            m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
            zero = m + 8 * d
        result = Int4Codes(codes.reshape(out_features, -1), d, zero, BLOCK)
        order = self._row_order(name, out_features)
        return result if order is None else result.rows(order)

    def dequantized(self, name: str) -> torch.Tensor:  # [out, in] float32
        from gguf import GGMLQuantizationType, dequantize

        tensor = self._tensor(name)
        values = dequantize(tensor.data, GGMLQuantizationType[tensor.kind])
        weight = torch.from_numpy(np.array(values, dtype=np.float32))  # a copy: F32 data is the read-only map
        weight = weight.view(-1, tensor.row_len)
        order = self._row_order(name, weight.shape[0])
        return weight if order is None else weight[order]

    def _tensor(self, name: str) -> RawTensor:
        if name not in self.tensors:
            raise ModelLoadError(f"the GGUF file has no tensor {name!r}")
        return self.tensors[name]

    def _row_order(self, name: str, rows: int) -> torch.Tensor | None:
        """transformers' un-permutation of llama.cpp's q/k rows, as a row index."""
        if self.architecture != "llama":
            return None
        if name.endswith("attn_q.weight"):
            heads = self.num_heads
        elif name.endswith("attn_k.weight"):
            heads = self.num_kv_heads
        else:
            return None
        half = rows // heads // 2
        # transformers: w.reshape(heads, half, 2, ...).swapaxes(1, 2).reshape(w.shape)
        return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(-1)


def read_raw_tensors(path: str | Path) -> tuple[str, dict[str, RawTensor]]:
    """The architecture and the tensors of a GGUF file, as stored (no de-quantization)."""
    from gguf import GGUFReader  # imported here: only the gguf weight format needs it

    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read the GGUF file {path}: {error}") from error
    field = reader.fields.get(ARCH_KEY)
    architecture = "" if field is None else bytes(field.parts[field.data[0]]).decode()
    tensors = {}
    for t in reader.tensors:
        row_len = int(t.shape[0])  # shape is innermost first: a row's weights
        rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        tensors[t.name] = RawTensor(
            t.tensor_type.name, np.asarray(t.data).view(np.uint8).reshape(rows, -1), row_len
        )
    return architecture, tensors


def load_raw_tensors(saved: Path) -> tuple[str, dict[str, RawTensor]]:
    """What :func:`save_raw_tensors` saved."""
    from safetensors import safe_open

    with safe_open(str(saved), framework="np") as f:
        meta = f.metadata()
        tensors = {}
        for name in f.keys():  # noqa: SIM118 - no __iter__
            kind, row_len = meta[name].split(":")
            tensors[name] = RawTensor(kind, f.get_tensor(name), int(row_len))
    return meta[ARCH_KEY], tensors


def save_raw_tensors(path: Path, folder: Path) -> None:
    """Save the GGUF file's tensors as stored into ``folder`` (read back by :class:`GGUFWeights`)."""
    from safetensors.numpy import save_file

    architecture, tensors = read_raw_tensors(path)
    meta = {name: f"{t.kind}:{t.row_len}" for name, t in tensors.items()} | {ARCH_KEY: architecture}
    save_file(
        {name: np.ascontiguousarray(t.data) for name, t in tensors.items()},
        str(folder / RAW_TENSORS_FILE),
        meta,
    )
