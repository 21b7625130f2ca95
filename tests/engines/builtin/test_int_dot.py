"""Packed products with int8 activations (engines/builtin/csrc/int_dot.h, model/int_dot.py):
llama.cpp's scheme for small steps, with blocks in groups so that a register's lanes sum
several blocks at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from parrot.engines.builtin.model import int_dot
from parrot.engines.builtin.model.quant import Int4Linear, Int8Linear, quantize_int4
from parrot.engines.builtin.native import load_extension

# llama.cpp's activation rounding (int8 in blocks of 32) and the bfloat16 result: measured
# 0.55-0.76% of the largest output on the default model's shapes
BOUND = 0.02


@pytest.fixture(scope="module")
def extension():
    ext = load_extension()
    if ext is None:
        pytest.skip("the C++ extension cannot be built here")
    return ext


def weights(out_features: int = 48, in_features: int = 96) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(1)) * 0.05


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("in_features", [96, 160, 224, 576])  # groups of 4 blocks, a pair, one alone
def test_the_int4_layout_holds_the_same_weights(in_features):
    codes = quantize_int4(weights(48, in_features), 32)
    packed, d, m = int_dot.int4_layout(codes)
    blocks = in_features // 32
    assert packed.dtype == torch.uint8 and packed.shape == (48, in_features // 2)
    assert d.shape == m.shape == (48, blocks)
    # every 32 bytes: a chunk of 32 codes in the low nibbles, the next chunk in the high ones
    paired = (blocks - blocks % 2) * 16
    head = packed[:, :paired].view(48, -1, 32).int()
    grouped = [torch.stack([head & 0x0F, head >> 4], dim=2).reshape(48, -1)]
    if blocks % 2:  # a block alone: values 0-15 low, 16-31 high
        last = packed[:, paired:].int()
        grouped.append(torch.cat([last & 0x0F, last >> 4], dim=1))
    unpacked = torch.empty(48, in_features, dtype=torch.int32)
    unpacked[:, int_dot.group_order(in_features)] = torch.cat(grouped, dim=1)
    assert torch.equal(unpacked, codes.codes)
    again = unpacked.float() * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)
    torch.testing.assert_close(again, codes.dequantize(), atol=1e-6, rtol=1e-6)


def test_the_group_order_takes_groups_of_four_blocks_then_a_pair_then_one():
    order = int_dot.group_order(224)  # 7 blocks: 4 + 2 + 1
    assert sorted(order.tolist()) == list(range(224))
    assert order[:16].tolist() == [*range(0, 8), *range(32, 40)]  # chunk 0: values 0-7 of each block
    assert order[128:144].tolist() == list(range(128, 144))  # the pair: values 0-15 of its first
    assert order[144:160].tolist() == list(range(160, 176))  # ... then of its second
    assert order[192:].tolist() == list(range(192, 224))  # the last block as it is
    pairs = int_dot.group_order(224, 2)[:64].tolist()
    assert pairs == [*range(0, 16), *range(32, 48), *range(16, 32), *range(48, 64)]


@pytest.mark.parametrize("in_features", [96, 224, 576])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16])  # tiles of eight rows and what is left
def test_the_products_are_the_weights_times_the_activations(extension, rows, in_features):
    w = weights(48, in_features)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    codes = quantize_int4(w, 32)
    got4 = extension.int4_rows(x, *int_dot.int4_layout(codes))
    assert got4.dtype == torch.bfloat16 and got4.shape == (rows, 48)
    assert relative(got4, x.float() @ codes.dequantize().T) < BOUND
    int8 = Int8Linear.from_float(w, None)
    got8 = extension.int8_rows(x, *int_dot.int_weights(int8, None))
    assert relative(got8, x.float() @ int8.dequantized().T) < BOUND
    for r in range(rows):  # a row's product does not depend on the rows beside it
        alone = extension.int4_rows(x[r : r + 1].contiguous(), *int_dot.int4_layout(codes))
        assert torch.equal(alone[0], got4[r])


def test_bad_inputs_are_refused_with_a_reason(extension):
    packed = int_dot.int4_layout(quantize_int4(weights(), 32))
    with pytest.raises(RuntimeError, match="bfloat16"):
        extension.int4_rows(torch.randn(2, 96), *packed)
    with pytest.raises(RuntimeError, match="width"):
        extension.int4_rows(torch.randn(2, 64).to(torch.bfloat16), *packed)
    with pytest.raises(RuntimeError, match="int8 weights"):
        unsigned = torch.zeros(48, 96, dtype=torch.uint8)
        extension.int8_rows(torch.randn(2, 96).to(torch.bfloat16), unsigned, packed[1])


def test_the_choice_is_asked_or_timed(extension):
    assert int_dot.choose_int_rows("off", extension, 576, 3072, 31).rows == 0
    assert int_dot.choose_int_rows("auto", None, 576, 3072, 31).reason == "no C++ extension"
    asked = int_dot.choose_int_rows("on", extension, 576, 3072, 31)
    assert (asked.rows, asked.reason) == (31, "asked")
    timed = int_dot.choose_int_rows("auto", extension, 576, 3072, 31)
    assert timed.reason == "timed" and list(timed.ms) == [1, 2, 4, 8, 16, 31]
    assert timed.rows == int_dot.rows_taken(timed.ms)
    assert int_dot.choose_int_rows("auto", extension, 576, 3072, 0).rows == 0
    json.dumps(timed.as_dict())
    with pytest.raises(ValueError, match="int8_activations must be one of auto, on, off"):
        int_dot.choose_int_rows("sometimes", extension, 576, 3072, 31)


def test_the_timed_choice_needs_a_clear_margin_over_all_the_probes():
    # (torch's ms, ours): 1.6x at one row but 1.1x over all of them: off
    assert int_dot.rows_taken({1: (1.6, 1.0), 8: (11.0, 10.0)}) == 0
    # 1.3x over all, then slower from 16 rows on: up to 8
    assert int_dot.rows_taken({1: (1.3, 1.0), 8: (13.0, 10.0), 16: (20.0, 19.0), 31: (45.0, 30.0)}) == 8
    assert int_dot.rows_taken({1: (1.4, 1.0), 16: (14.0, 10.0)}) == 16


def test_layers_take_the_path_only_where_it_fits(extension):
    fits = Int4Linear(quantize_int4(weights(), 32), None)
    coarse = Int4Linear(quantize_int4(weights(), 96), None)  # blocks of 96: not llama.cpp's 32
    assert int_dot.fits(fits) and not int_dot.fits(coarse)
    assert int_dot.fits(Int8Linear.from_float(weights(), None))
    assert not int_dot.fits(Int8Linear.from_float(weights(48, 40), None))


@pytest.mark.spawns
def test_without_avx2_the_plain_loops_compute_the_same_sums(extension, tmp_path):
    """The extension built for a CPU without AVX2 (x86-64: SSE2 only) runs the scalar loops;
    they sum the same integers, so they agree with the vector code to float rounding."""
    w = weights(64, 224)  # groups of four blocks, a pair and a block alone
    x = torch.randn(5, 224, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    torch.save({"x": x, "w": w}, tmp_path / "case.pt")
    code = (
        "import sys, torch; from parrot.engines.builtin.native import load_extension;"
        "from parrot.engines.builtin.model import int_dot; from parrot.engines.builtin.model.quant import "
        "Int8Linear, quantize_int4; c = torch.load(sys.argv[1]); ext = load_extension();"
        "i8 = Int8Linear.from_float(c['w'], None);"
        "torch.save([ext.int4_rows(c['x'], *int_dot.int4_layout(quantize_int4(c['w'], 32))),"
        " ext.int8_rows(c['x'], *int_dot.int_weights(i8, None))], sys.argv[2])"
    )
    env = {**os.environ, "PARROT_NATIVE_ARCH": "x86-64"}
    args = [sys.executable, "-c", code, str(tmp_path / "case.pt"), str(tmp_path / "out.pt")]
    subprocess.run(args, env=env, check=True, timeout=600)
    plain4, plain8 = torch.load(tmp_path / "out.pt")
    vector4 = extension.int4_rows(x, *int_dot.int4_layout(quantize_int4(w, 32)))
    vector8 = extension.int8_rows(x, *int_dot.int_weights(Int8Linear.from_float(w, None), None))
    torch.testing.assert_close(plain4.float(), vector4.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(plain8.float(), vector8.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.spawns
def test_the_products_benchmark_runs(extension):
    """``benchmarks/int_dot_products.py`` (the docs' figures), smallest size, so it cannot rot."""
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "int_dot_products.py"
    args = [sys.executable, str(script), "--rows", "1", "--threads", "1", "--rounds", "1", "--no-docs"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    assert [line.split(" | ")[1] for line in lines] == [
        "qkv 576 x 960",
        "o 576 x 576",
        "gate+up 576 x 3072",
        "down 1536 x 576",
        "head 576 x 49152",
    ]
