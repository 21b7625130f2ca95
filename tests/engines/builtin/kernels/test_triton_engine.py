"""The whole engine on the Triton backend (interpreted, tiny random model) generates the same
greedy tokens as on the torch backend, through decode, prefill and shared-prefix steps.

On a GPU machine without the bundled model (benchmarks/on_gpu.sh), ``PARROT_TOKENIZER_DIR``
names a folder with its tokenizer files, which is all the tiny model takes from it."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from parrot.engines.builtin.batch import SharedPrefixPolicy
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.wire.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny_model(request, tmp_path_factory):
    """A random 2-layer Llama with the default model's tokenizer."""
    if os.environ.get("PARROT_TOKENIZER_DIR"):
        tokenizer_dir = Path(os.environ["PARROT_TOKENIZER_DIR"])
        vocab_size = 49152  # the bundled model's
    else:
        engine = request.getfixturevalue("engine")
        tokenizer_dir, vocab_size = engine.model_folder, engine.model_config.vocab_size
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=2,
        bos_token_id=1,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def run(folder, backend: str) -> list[list[int]]:
    engine = BuiltinEngine(
        EngineConfig(
            model=str(folder),
            weights="exact",  # the backends compared on the same float32 products
            dtype="float32",  # also on a GPU (bfloat16 by default there)
            attention_backend=backend,
            kv_cache_bytes=8 * 2**20,
            scheduler=SchedulerConfig(max_batched_tokens=24, max_running=8),
            shared_prefix=SharedPrefixPolicy(min_saved_tokens=0),  # tiny shapes: always share
        )
    )
    assert engine.backend.name == backend
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    async def scenario():
        prompt = engine.tokenize(
            "The lighthouse keeper counted the ships passing by the rocks at night. " * 3
        )
        await engine.fill(1, prompt)  # longer than one step's budget: chunked prefill
        children = await asyncio.gather(
            *(engine.generate(10 + i, sampling, parent_context_id=1) for i in range(3))
        )
        await engine.fill(2, [5, 6, 7], parent_context_id=1)  # a fill into a fork
        other = await asyncio.gather(engine.generate(2, sampling), engine.generate(1, sampling))
        # Grandchildren: the root's blocks and each child's own blocks are two sharing levels.
        grandchildren = await asyncio.gather(
            *(engine.generate(20 + i, sampling, parent_context_id=10 + i % 2) for i in range(4))
        )
        return [r.token_ids for r in (*children, *other, *grandchildren)], await engine.stats()

    try:
        tokens, stats = asyncio.run(scenario())
    finally:
        engine.stop()
    assert stats["shared_prefix_steps"] > 0
    # On a GPU the Triton backend's decode steps replay CUDA graphs (the torch backend's never).
    assert (stats["graph_steps"] > 0) == (torch.cuda.is_available() and backend == "triton")
    return tokens


def test_triton_backend_generates_what_the_torch_backend_does(tiny_model):
    assert run(tiny_model, "triton") == run(tiny_model, "torch")
