"""What the engine reads of the CPU, and the dtype of the dense copies that prompts run on
(engines/builtin/model/cpu_paths.py).

A CPU without native bfloat16 (AVX2-only) is measured on this machine by lowering torch's and
oneDNN's instruction sets in a child process, as ``benchmarks/cpu_peer.py --cpu avx2`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from parrot.engines.builtin.model.cpu_paths import (
    FLAGS,
    FLOAT32_MIN_SPEEDUP,
    choose_dense_dtype,
    cpu_features,
    report,
)

GATE_UP = (3072, 576)  # the default model's largest per-layer product: gate and up, [out, in]
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_the_features_name_the_vector_level_and_the_flags():
    features = cpu_features()
    assert features.isa  # torch's level, e.g. AVX512 or AVX2
    assert set(features.flags) <= set(FLAGS)
    assert features.isa in features.describe()
    assert features is cpu_features()  # read once


def test_auto_times_both_dtypes_and_keeps_bfloat16_unless_float32_is_clearly_faster():
    choice = choose_dense_dtype("auto", *GATE_UP)
    assert choice.reason == "timed" and set(choice.ms) == {"bfloat16", "float32"}
    assert all(ms > 0 for ms in choice.ms.values())
    slower = choice.ms["bfloat16"] > FLOAT32_MIN_SPEEDUP * choice.ms["float32"]
    assert choice.dtype == (torch.float32 if slower else torch.bfloat16)
    assert "timed" in choice.describe()
    asked = choose_dense_dtype("float32", *GATE_UP)
    assert (asked.dtype, asked.reason, asked.ms) == (torch.float32, "asked", {})
    with pytest.raises(ValueError, match="dense_dtype must be one of auto, bfloat16, float32"):
        choose_dense_dtype("float16", *GATE_UP)


def test_the_report_says_what_ping_shows():
    said = report(choose_dense_dtype("bfloat16", *GATE_UP))
    assert said["dense_copy"] == {"dtype": "bfloat16", "reason": "asked", "ms": {}}
    assert said["isa"] == cpu_features().isa and said["flags"] == cpu_features().flags
    assert report(None)["dense_copy"] is None
    json.dumps(said)


@pytest.mark.skipif("avx2" not in cpu_features().flags, reason="needs a CPU with AVX2")
def test_without_native_bfloat16_prompts_run_on_float32_copies():
    """The case of issue 40: a bfloat16 GEMM without native support ran 4-5x slower than
    float32, so the engine must choose float32 there, whatever the CPU it was built on."""
    code = (
        "import json; from parrot.engines.builtin.model.cpu_paths import choose_dense_dtype, report;"
        f"print(json.dumps(report(choose_dense_dtype('auto', {GATE_UP[0]}, {GATE_UP[1]}))))"
    )
    env = {**os.environ, **AVX2_ONLY}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    said = json.loads(out.stdout)
    assert said["isa"] == "AVX2" and said["onednn_bf16"] is False
    assert said["dense_copy"]["dtype"] == "float32", said
    ms = said["dense_copy"]["ms"]
    assert ms["bfloat16"] > 2 * ms["float32"], ms  # measured 4-5x
