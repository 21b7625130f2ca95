"""When KV blocks run out, the newest job is preempted and resumed: no crash, same outputs."""

from __future__ import annotations

import asyncio

import pytest

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.kv_cache import bytes_per_block
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.wire.sampling import SamplingParams


@pytest.fixture(scope="module")
def small_engine(engine, engine_config):
    """A second engine whose cache holds 24 blocks (384 tokens) in all."""
    config = ModelConfig.from_folder(engine.model_folder)
    per_block = bytes_per_block(config, 16, engine.dtype)
    eng = BuiltinEngine(
        EngineConfig(
            weights=engine_config.weights,  # as the engine it is compared with
            cache_dir=engine_config.cache_dir,
            kv_cache_bytes=24 * per_block,
            scheduler=SchedulerConfig(max_batched_tokens=256, max_running=16),
        )
    )
    eng.check_running()
    yield eng
    eng.stop()


def test_preempted_jobs_resume_with_identical_output(small_engine, engine):
    prompts = [
        f"<|im_start|>user\nList {i} fruits, one per line.<|im_end|>\n<|im_start|>assistant\n"
        for i in range(6)
    ]
    sampling = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)

    async def run(eng: BuiltinEngine, base: int) -> list[list[int]]:
        async def one(i: int, prompt: str) -> list[int]:
            await eng.fill(base + i, eng.tokenize(prompt))
            result = await eng.generate(base + i, sampling)
            await eng.free_context(base + i)
            return result.token_ids

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    # 6 sequences of ~20 + 64 tokens need 6 * 6 = 36 blocks together; the cache has 24.
    squeezed = asyncio.run(run(small_engine, 1))
    stats = asyncio.run(small_engine.stats())
    assert stats["preemptions"] > 0, stats
    assert stats["kv_blocks_used"] == 0 and stats["num_contexts"] == 0
    roomy = asyncio.run(run(engine, 900_000))
    assert squeezed == roomy


def test_idle_contexts_give_way_and_are_recomputed(small_engine):
    async def scenario():
        eng = small_engine
        idle = eng.tokenize("A quiet context that nobody uses for a while. " * 20)[:300]
        await eng.fill(1, idle)  # 19 of the 24 blocks
        before = await eng.generate(1, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        await eng.free_context(1)
        await eng.fill(1, idle)
        busy = eng.tokenize("Another long prompt that needs space now. " * 20)[:200]
        await eng.fill(2, busy)  # does not fit beside context 1: its KV is released
        await eng.free_context(2)
        after = await eng.generate(1, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        await eng.free_context(1)
        return before, after

    before, after = asyncio.run(scenario())
    assert before.token_ids == after.token_ids
