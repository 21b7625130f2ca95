"""The fused CPU decode step (engines/builtin/fused_decode.py, csrc/decode_step.cpp): which
models and steps it takes, and that it computes what the eager step computes.

The extension is compiled by the first test that needs it (about 25 s, then cached). The
families it takes run on random tiny configs in both packed formats, over contexts whose
block tables are not contiguous (forks share their parent's blocks); the real default model
runs it through the engine (test_default_mode.py checks its greedy text).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from families import FAMILIES, random_hf
from test_model_correctness import CONFIGS, SMALL
from test_weight_formats import build, relative_error

from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.fused_decode import MAX_ITEM_TOKENS, fused_decode_step, unsupported_reason
from parrot.engines.builtin.model_runner import ModelRunner

CPU = torch.device("cpu")
CASES = {
    "llama": CONFIGS["llama"],
    "llama-attention-bias-mha": CONFIGS["llama-attention-bias-mha"],
    "qwen2-linear-rope": CONFIGS["qwen2-linear-rope"],
    "qwen3-tied-bias": FAMILIES["qwen3-tied-bias"],  # q/k norms, head_dim of its own, biases
    "phi4-mini-partial-longrope": FAMILIES["phi4-mini-partial-longrope"],  # partial rotary
    # heads of 64, 128 and 96 dims: the attention's blocked loops (csrc/decode_attention.h)
    "llama-head-64": lambda: transformers.LlamaConfig(
        **{**SMALL, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}
    ),
    "qwen3-head-128": lambda: transformers.Qwen3Config(**SMALL, head_dim=128, tie_word_embeddings=False),
    "qwen3-head-96": lambda: transformers.Qwen3Config(**SMALL, head_dim=96, tie_word_embeddings=False),
}
PROMPTS = (5, 13, 22)  # block size 4: partial last blocks, and tables of 2 to 6 blocks
# max |fused - eager| / max |eager| of the hidden rows and the new KV, over a few decode
# steps. Measured up to 4e-4 here: the two sum in another order, and a float32 difference
# can round a bfloat16 kernel input the other way (one unit in the last place, ~0.4% of it).
BOUND = 2e-3
# ... with a bfloat16 cache: a key that differs in float32 (the sums' order, above) can round
# to the neighbouring bfloat16 value (2^-8 away), and later layers carry that. Measured up to
# 1.2e-3 (hidden rows) and 2.4e-3 (new keys and values) with int4 weights; with int8, 2e-7
# and 0 (nothing rounded differently).
HALF_BOUND = 1e-2
# ... with float32 dense copies (CPUs without native bfloat16): the eager step multiplies
# float32 rows, the fused step the bfloat16-rounded rows it hands every kernel, and rounds the
# product to bfloat16 as the packed kernels do: measured up to 9.8e-3 (Phi-4-mini), about the
# bfloat16 cache's difference. (Each path against the exact model: test_weight_formats.py.)
ROUNDED_BOUND = 2e-2


def policy(shared_prefix: SharedPrefixPolicy) -> EngineConfig:
    return EngineConfig(shared_prefix=shared_prefix)


@pytest.fixture(scope="module", params=sorted(CASES))
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    random_hf(CASES[request.param]()).save_pretrained(path)  # norms and biases random too
    return path


def contexts_with_a_fork(model, pool: ContextPool) -> list[Context]:
    """Three prompts computed eagerly, and a fork of the longest one sharing its full blocks."""
    runner = ModelRunner(model, pool, SharedPrefixPolicy(), CPU)
    contexts = []
    for cid, length in enumerate(PROMPTS, start=1):
        ctx = Context(context_id=cid, token_ids=[(7 * cid + j) % 100 + 3 for j in range(length)])
        ctx.materialized = True
        pool.contexts[cid] = ctx
        assert pool.ensure_blocks(ctx, length)
        contexts.append(ctx)
    output = runner.run([StepItem(ctx, 0, len(ctx.token_ids), sample=True) for ctx in contexts])
    for n, (ctx, token) in enumerate(zip(contexts, output.logits.argmax(-1).tolist(), strict=True)):
        pool.computed(ctx, len(ctx.token_ids), output.last_hidden[n])
        pool.append_token(ctx, token)
    parent = contexts[-1]
    fork = Context(context_id=9, parent=parent, parent_id=parent.context_id)
    pool.contexts[9] = fork
    pool.materialize(fork)
    fork.token_ids[-1] = 11  # decodes another token than its parent from the same prefix
    return [*contexts, fork]


@pytest.mark.parametrize(
    ("weights", "dense_rows", "kv_dtype", "bound", "dense_dtype", "int8_activations"),
    [
        ("int8", 32, "float32", BOUND, "auto", "off"),
        ("int4", 32, "float32", BOUND, "auto", "off"),
        ("int4", 1, "float32", BOUND, "bfloat16", "off"),
        ("int4", 1, "float32", ROUNDED_BOUND, "float32", "off"),
        ("int8", 32, "bfloat16", HALF_BOUND, "auto", "off"),
        ("int4", 32, "bfloat16", HALF_BOUND, "auto", "off"),
        ("int8", 32, "float32", BOUND, "auto", "on"),
        ("int4", 32, "bfloat16", HALF_BOUND, "auto", "on"),
    ],
)
def test_a_fused_step_computes_what_the_eager_step_computes(
    folder, weights, dense_rows, kv_dtype, bound, dense_dtype, int8_activations
):
    """dense_rows=1: every product on the dense copy of the weights, as in big steps
    (bfloat16, or float32 on CPUs without native bfloat16). bfloat16 caches: the fused
    step rounds and widens keys and values as the eager step does. int8 activations: both
    steps multiply on the same C++ products (int_dot.h)."""
    paths = (dense_dtype, int8_activations)
    model, pool = build(folder, "float32", weights, 64, 4, dense_rows, kv_dtype, *paths)
    fused = fused_decode_step(model, pool, EngineConfig(), CPU)
    assert fused is not None
    eager = ModelRunner(model, pool, SharedPrefixPolicy(), CPU)
    runner = ModelRunner(model, pool, SharedPrefixPolicy(), CPU, fused)
    contexts = contexts_with_a_fork(model, pool)
    assert contexts[-1].blocks[:5] == contexts[-2].blocks[:5]  # the fork reads its parent's blocks
    # The tables grow past block boundaries. Steps of a token an item, and of a few (the text
    # jump-forward forces: each row attends the keys of the rows before it, as a prefill).
    for step, width in enumerate((1, 3, 1, 2, 5, 1)):
        items = []
        for n, ctx in enumerate(contexts):
            tokens = width if n % 2 == 0 else 1
            for extra in range(tokens - 1):
                pool.append_token(ctx, (17 * step + 5 * n + extra) % 100 + 3)
            assert pool.ensure_blocks(ctx, len(ctx.token_ids))
            items.append(StepItem(ctx, ctx.num_computed, tokens, sample=True))
        before = pool.kv_cache.clone()
        expected = eager.run(items)
        expected_cache = pool.kv_cache.clone()
        pool.kv_cache.copy_(before)
        got = runner.run(items)
        assert got.path == "fused" and expected.path == "eager"
        assert relative_error(got.last_hidden, expected.last_hidden) < bound
        # the new keys and values went to the items' slots, and nowhere else
        new = [
            ctx.blocks[pos // 4] * 4 + pos % 4
            for ctx in contexts
            for pos in range(ctx.num_computed, len(ctx.token_ids))
        ]
        written = pool.kv_cache[:, :, new]  # [layers, 2, tokens, kv heads, head_dim]
        assert relative_error(written.float(), expected_cache[:, :, new].float()) < bound
        untouched = torch.ones(pool.kv_cache.shape[2], dtype=torch.bool)
        untouched[new] = False
        assert torch.equal(pool.kv_cache[:, :, untouched], before[:, :, untouched])
        for n, (ctx, token) in enumerate(zip(contexts, expected.logits.argmax(-1).tolist(), strict=True)):
            pool.computed(ctx, len(ctx.token_ids), expected.last_hidden[n])
            pool.append_token(ctx, token)


def test_only_steps_of_short_items_without_a_shared_prefix_run_fused(folder):
    model, pool = build(folder, "float32", "int4", num_blocks=64, block_size=4)
    contexts = contexts_with_a_fork(model, pool)
    decodes = [StepItem(ctx, ctx.num_computed, 1, sample=True) for ctx in contexts]
    for ctx in contexts:
        assert pool.ensure_blocks(ctx, len(ctx.token_ids))
    never_shared = fused_decode_step(model, pool, policy(SharedPrefixPolicy(enabled=False)), CPU)
    assert never_shared.fits(decodes)
    assert not never_shared.fits([])
    prompt = Context(context_id=20, token_ids=[5] * 6, materialized=True)
    pool.contexts[20] = prompt
    assert pool.ensure_blocks(prompt, 6)
    assert never_shared.fits([*decodes[:2], StepItem(prompt, 0, 6, sample=True)])  # a short fill
    stored = StepItem(contexts[0], contexts[0].num_computed + 1, 0, sample=True)
    assert never_shared.fits([decodes[1], stored])  # one samples its stored state
    assert not never_shared.fits([stored])  # nothing to compute
    long = Context(context_id=21, token_ids=[5] * (MAX_ITEM_TOKENS + 1), materialized=True)
    pool.contexts[21] = long
    assert pool.ensure_blocks(long, MAX_ITEM_TOKENS + 1)
    prefill = StepItem(long, 0, MAX_ITEM_TOKENS + 1, sample=True)
    assert not never_shared.fits([*decodes[:2], prefill])  # a prefill: the eager step's
    # the fork and its parent share 20 tokens: with the path always taken, the step is eager
    always = SharedPrefixPolicy(min_saved_tokens=0, min_prefix_tokens=1)
    assert not fused_decode_step(model, pool, policy(always), CPU).fits(decodes)


def test_models_it_cannot_run_say_why(folder, tmp_path):
    exact, _ = build(folder, "float32", "exact")
    assert unsupported_reason(exact, CPU) == "unpacked weights (--weights exact)"
    packed, pool = build(folder, "float32", "int8")
    assert unsupported_reason(packed, torch.device("cuda")) == "not on the CPU"
    assert unsupported_reason(packed, CPU) is None
    random_hf(FAMILIES["gemma3"]()).save_pretrained(tmp_path / "gemma")
    model, pool = build(tmp_path / "gemma", "float32", "int8")
    assert "Gemma norms" in unsupported_reason(model, CPU)
    assert fused_decode_step(model, pool, EngineConfig(), CPU) is None
    assert fused_decode_step(packed, pool, EngineConfig(fused_decode=False), CPU) is None


def test_the_step_refuses_inputs_outside_the_cache_and_the_rope_tables(folder):
    """The engine builds the inputs from its block manager; should one ever be wrong, the C++
    step raises rather than write outside the cache."""
    model, pool = build(folder, "float32", "int8", num_blocks=8, block_size=4)
    fused = fused_decode_step(model, pool, EngineConfig(), CPU)
    one, table = torch.tensor([1]), torch.zeros(1, 1, dtype=torch.long)

    def step(slot: int, position: int, kv_cache: torch.Tensor = pool.kv_cache):
        return fused.step.step(one, torch.tensor([position]), torch.tensor([slot]), table, one, kv_cache, 4)

    assert step(slot=0, position=0).shape == (1, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="out of range"):
        step(slot=pool.kv_cache.shape[2], position=0)
    with pytest.raises(RuntimeError, match="out of range"):
        step(slot=0, position=model.rope.cos.shape[0])
    with pytest.raises(RuntimeError, match="float32"):
        step(slot=0, position=0, kv_cache=pool.kv_cache.double())


def test_a_step_with_many_keys_splits_attention_over_the_threads(folder):
    """Enough keys (10 x 230, past the step's threshold) that attention runs as parallel tasks
    (a sequence and KV head each); the result is the eager step's."""
    model, pool = build(folder, "float32", "int8", num_blocks=160, block_size=16, kv_dtype="float32")
    eager = ModelRunner(model, pool, SharedPrefixPolicy(), CPU)
    fused = fused_decode_step(model, pool, policy(SharedPrefixPolicy(enabled=False)), CPU)
    contexts = []
    for cid in range(10):
        length = 230 - cid
        ctx = Context(context_id=cid, token_ids=[(5 * j + cid) % 100 + 3 for j in range(length + 1)])
        ctx.materialized = True
        pool.contexts[cid] = ctx
        assert pool.ensure_blocks(ctx, length + 1)
        eager.run([StepItem(ctx, 0, length, sample=False)])
        pool.computed(ctx, length, None)
        contexts.append(ctx)
    items = [StepItem(ctx, ctx.num_computed, 1, sample=True) for ctx in contexts]
    before = pool.kv_cache.clone()
    expected = eager.run(items).last_hidden
    pool.kv_cache.copy_(before)
    assert relative_error(fused.run(items), expected) < BOUND
