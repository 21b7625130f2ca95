"""Sliding-window attention (Gemma 3, Phi-3, Qwen3, Mistral) against transformers: across
forks and shared prefixes, in the whole engine, and the window as the config or the GGUF
file says."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import CHUNKS, FAMILIES, GGUF_FAMILIES, TOKENS, our_logits, random_hf
from gguf_files import hf_from_gguf, write_gguf
from test_model_correctness import SMALL, load_ours, run_chunks

from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.context_pool import Context
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.model.gguf_config import restore_gguf_settings
from parrot.engines.builtin.model.model_config import ModelConfig


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sliding_window_holds_across_forks_and_shared_prefixes(backend, tmp_path):
    """Gemma 3 (window 8) on forked contexts whose shared blocks are attended once, the
    queries of a fork of a fork in nested groups, some slid past the whole shared prefix:
    every token's logits equal transformers' on the fork's whole sequence."""
    hf = random_hf(FAMILIES["gemma3"]())
    hf.save_pretrained(tmp_path)
    model, pool = load_ours(tmp_path, block_size=4, num_blocks=128, backend=backend)
    policy = SharedPrefixPolicy(min_prefix_tokens=1, min_saved_tokens=0)
    gen = torch.Generator().manual_seed(3)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist()

    def fork(cid: int, parent: Context, n: int) -> StepItem:
        ctx = Context(context_id=cid, parent=parent, parent_id=parent.context_id)
        pool.contexts[cid] = ctx
        pool.materialize(ctx)
        return extend(ctx, n)

    def extend(ctx: Context, n: int) -> StepItem:
        start = ctx.num_computed
        ctx.token_ids.extend(tokens(n))
        assert pool.ensure_blocks(ctx, len(ctx.token_ids))
        return StepItem(ctx, start, len(ctx.token_ids) - start, sample=False)

    def step_matches_transformers(items: list[StepItem]) -> None:
        step = build_step(items, pool.block_size, policy, torch.device("cpu"))
        assert step.attention.uses_shared_prefix
        logits = model.compute_logits(model(step.input_ids, step.positions, step.attention, pool.kv_cache))
        row = 0
        for item in items:
            with torch.no_grad():
                expected = hf(torch.tensor([item.context.token_ids])).logits[0, item.start :]
            got = logits[row : row + item.num_tokens]
            torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)
            row += item.num_tokens
            item.context.num_computed = item.start + item.num_tokens
            pool.register_full_blocks(item.context)

    root = Context(context_id=1, token_ids=tokens(22), materialized=True)
    pool.contexts[1] = root
    run_chunks(model, pool, root, [22])  # 5 full blocks shared below, a partial one copied
    children = [fork(10, root, 1), fork(11, root, 10), fork(12, root, 3)]  # 11 reaches past the window
    step_matches_transformers(children)
    grandchildren = [fork(20, children[1].context, 1), fork(21, children[1].context, 4)]
    step_matches_transformers([*grandchildren, extend(children[0].context, 1)])
    step_matches_transformers([extend(ctx.context, 1) for ctx in [*children, *grandchildren]])


async def test_an_engine_serves_a_sliding_window_model_with_forks(tmp_path):
    """The whole engine on a Gemma 3 GGUF: forks of one parent generate concurrently, on the
    shared-prefix path, each token for token transformers' greedy continuation."""
    import asyncio

    from parrot.engines.builtin.engine import BuiltinEngine
    from parrot.wire.sampling import SamplingParams

    path = write_gguf(random_hf(GGUF_FAMILIES["gemma3"]()), tmp_path / "tiny-gemma3.gguf")
    hf = hf_from_gguf(path)
    config = EngineConfig(
        model=str(path),
        cache_dir=str(tmp_path / "cache"),
        kv_cache_bytes=2**20,
        block_size=4,
        shared_prefix=SharedPrefixPolicy(min_prefix_tokens=4, min_saved_tokens=0),
        attention_backend="torch",
    )
    engine = BuiltinEngine(config)
    gen = torch.Generator().manual_seed(4)
    parent = torch.randint(0, SMALL["vocab_size"], (14,), generator=gen).tolist()
    tails = [torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist() for n in (1, 3, 6)]
    sampling = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    try:
        await engine.fill(1, token_ids=parent)
        results = await asyncio.gather(
            *(engine.generate(10 + i, sampling, 1, token_ids=tail) for i, tail in enumerate(tails))
        )
    finally:
        engine.stop()
    for tail, result in zip(tails, results, strict=True):
        prompt = torch.tensor([parent + tail])
        with torch.no_grad():
            out = hf.generate(prompt, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
        assert result.token_ids == out[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize(
    "config",
    [
        lambda: transformers.Phi3Config(
            **SMALL, pad_token_id=0, eos_token_id=1, bos_token_id=2, sliding_window=8
        ),  # every layer (Phi-3-mini-4k: 2047)
        lambda: transformers.Qwen3Config(
            **SMALL, head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1
        ),  # the layers from max_window_layers on
        lambda: transformers.MistralConfig(**SMALL, sliding_window=8),  # every layer (7B v0.1: 4096)
    ],
    ids=["phi3", "qwen3", "mistral"],
)
def test_sliding_windows_of_phi3_qwen3_and_mistral(config, tmp_path):
    hf = random_hf(config())
    hf.save_pretrained(tmp_path)
    tokens = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    assert ModelConfig.from_folder(tmp_path).sliding_window == 8
    torch.testing.assert_close(our_logits(tmp_path, tokens.tolist(), CHUNKS), expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    ("arch", "name", "metadata", "config", "window"),
    [
        ("phi3", "phi-3-mini-4k", {"phi3.attention.sliding_window": 2047}, {"model_type": "phi3"}, 2047),
        ("phi3", "phi-4-mini", {}, {"model_type": "phi3"}, None),
        ("llama", "mistral-7b-v0.3", {}, {"model_type": "mistral", "sliding_window": 4096}, None),
    ],
)
def test_gguf_sliding_window_as_the_file_says(arch, name, metadata, config, window, tmp_path):
    """Phi-3 files keep theirs; llama.cpp's llama architecture (Mistral files) has none."""
    from gguf import GGUFWriter

    path = tmp_path / f"{name}.gguf"
    writer = GGUFWriter(str(path), arch)
    writer.add_name(name)
    for key, value in metadata.items():
        writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    base = {"hidden_size": 64, "num_attention_heads": 4, **config}
    assert restore_gguf_settings(path, base)["sliding_window"] == window
