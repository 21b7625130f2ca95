"""The families beyond Llama/Mistral/Qwen2 against transformers, on random tiny configs:
Qwen3 (q/k norms, head_dim of its own), Phi-3 / Phi-4-mini (fused weights, partial rotary,
long-rope), Gemma 3 (its norms, GeGLU, scaled embeddings, sliding-window layers with a
local rope, final soft-capping). Logits of chunked prefill + decode, and greedy tokens, from
safetensors folders and from GGUF files (tests' gguf_files.py writes them)."""

from __future__ import annotations

import pytest
import torch
import transformers
from gguf_files import hf_from_gguf, write_gguf
from test_model_correctness import SMALL, load_ours, run_chunks

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.kv_cache import allocate_kv_cache
from parrot.engines.builtin.model.build import build_model
from parrot.engines.builtin.model.gguf_config import restore_gguf_settings
from parrot.engines.builtin.model.loader import resolve_model_folder
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model.quant import Int8Linear
from parrot.engines.builtin.model.rope import RotaryEmbedding
from parrot.engines.protocol.errors import ModelLoadError

TOKENS = 45  # longer than the Gemma configs' window, over blocks of 4
CHUNKS = [17, 20, 1, 1, 1, 1, 1, 1, 1, 1]
GEMMA = dict(SMALL, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])

FAMILIES = {
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=24, tie_word_embeddings=False),
    "qwen3-tied-bias": lambda: transformers.Qwen3Config(
        **SMALL, head_dim=16, tie_word_embeddings=True, attention_bias=True
    ),
    "phi3": lambda: transformers.Phi3Config(**SMALL, pad_token_id=0, eos_token_id=1, bos_token_id=2),
    "phi4-mini-partial-longrope": lambda: transformers.Phi3Config(
        **{**SMALL, "max_position_embeddings": 512},
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
        partial_rotary_factor=0.75,
        original_max_position_embeddings=64,  # the sequences stay below: the short factors
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(6)],
            "long_factor": [2.0 + i for i in range(6)],
        },
    ),
    "gemma3": lambda: transformers.Gemma3TextConfig(**GEMMA, query_pre_attn_scalar=24),
    "gemma3-softcap-linear-rope": lambda: transformers.Gemma3TextConfig(
        **GEMMA,
        attn_logit_softcapping=2.0,  # ignored by transformers' Gemma 3, and so by the engine
        final_logit_softcapping=3.0,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


def random_hf(config) -> transformers.PreTrainedModel:
    """A transformers model with random weights everywhere, norms and biases included, so a
    norm or bias the engine skipped (or Gemma's 1 + weight) shows in the logits."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_(0.0, 0.3)
            else:
                param.normal_(0.0, 0.15)
    return hf


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    hf = random_hf(FAMILIES[request.param]())
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, folder


def our_logits(folder, tokens: list[int], chunks: list[int]) -> torch.Tensor:
    model, pool = load_ours(folder)
    ctx = Context(context_id=1, token_ids=list(tokens), materialized=True)
    pool.contexts[1] = ctx
    return run_chunks(model, pool, ctx, chunks)


def our_greedy(folder, prompt: list[int], n: int) -> list[int]:
    model, pool = load_ours(folder)
    ctx = Context(context_id=1, token_ids=list(prompt), materialized=True)
    pool.contexts[1] = ctx
    logits = run_chunks(model, pool, ctx, [len(prompt)])
    out = []
    for _ in range(n):
        token = int(logits[-1].argmax())
        out.append(token)
        ctx.token_ids.append(token)
        logits = run_chunks(model, pool, ctx, [1])
    return out


def test_logits_match_transformers(family):
    _, hf, folder = family
    tokens = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    got = our_logits(folder, tokens.tolist(), CHUNKS)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


def test_greedy_tokens_match_transformers(family):
    _, hf, folder = family
    prompt = torch.randint(0, SMALL["vocab_size"], (6,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = hf.generate(prompt[None], do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=0)
    expected = out[0, prompt.numel() :].tolist()
    assert our_greedy(folder, prompt.tolist(), 16) == expected


def test_family_configs_read_what_transformers_builds():
    qwen3 = ModelConfig.from_hf_dict(FAMILIES["qwen3"]().to_dict(), "m")
    assert (qwen3.architecture, qwen3.head_dim, qwen3.qk_norm, qwen3.qkv_bias) == ("qwen3", 24, True, False)
    phi = ModelConfig.from_hf_dict(FAMILIES["phi4-mini-partial-longrope"]().to_dict(), "m")
    assert (phi.rotary_dim, phi.rope_scaling.kind, phi.rope_scaling.factor) == (12, "longrope", 8.0)
    gemma = ModelConfig.from_hf_dict(FAMILIES["gemma3-softcap-linear-rope"]().to_dict(), "m")
    assert gemma.layer_types == ("sliding_attention", "full_attention") and gemma.window(0) == 8
    assert gemma.window(1) is None and (gemma.local_rope_theta, gemma.rope_theta) == (1e4, 1e6)
    assert gemma.rope_scaling.kind == "linear" and gemma.local_rope_scaling.kind == "default"
    assert (gemma.final_softcap, gemma.hidden_act, gemma.attn_scale) == (3.0, "gelu_pytorch_tanh", 256**-0.5)


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    d = {
        **transformers.LlamaConfig(**SMALL).to_dict(),
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
    }
    with pytest.raises(ModelLoadError) as error:
        ModelConfig.from_hf_dict(d, "m")
    message = str(error.value)
    assert "unsupported model type 'gpt_neox'" in message
    for family in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "Gemma3ForCausalLM"):
        assert family in message


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


# GGUF files as llama.cpp writes them. transformers' GGUF loader reads no head_dim for Qwen3
# (it takes its default, 128, which every released Qwen3 has) and no query_pre_attn_scalar or
# layer pattern for Gemma 3 (its defaults again), so the configs here keep to what survives.
GGUF_FAMILIES = {
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=128, tie_word_embeddings=False),
    "phi3": FAMILIES["phi3"],
    "gemma3": lambda: transformers.Gemma3TextConfig(**{**GEMMA, "layer_types": None}),
}


@pytest.fixture(scope="module", params=sorted(GGUF_FAMILIES))
def gguf_family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gguf-{request.param}")
    path = write_gguf(random_hf(GGUF_FAMILIES[request.param]()), folder / f"tiny-{request.param}.gguf")
    return path, hf_from_gguf(path), resolve_model_folder(path, folder / "cache")


def test_gguf_logits_and_greedy_tokens_match_transformers(gguf_family):
    path, hf, folder = gguf_family
    assert ModelConfig.from_folder(folder).name == path.stem
    tokens = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
        greedy = hf.generate(
            tokens[None, :6], do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=0
        )
    torch.testing.assert_close(our_logits(folder, tokens.tolist(), CHUNKS), expected, atol=2e-4, rtol=2e-4)
    assert our_greedy(folder, tokens[:6].tolist(), 16) == greedy[0, 6:].tolist()


def test_gguf_weight_format_reads_each_family_s_tensors(gguf_family):
    """--weights gguf: the file's own tensors (float32 here, so int8), fused names (Phi-3) and
    no llama row permutation (these architectures store q/k as they are)."""
    path, _, folder = gguf_family
    mc = ModelConfig.from_folder(folder)
    config = EngineConfig(model=str(path), weights="gguf", dtype="float32")
    backend = create_backend("torch", mc.num_heads, mc.num_kv_heads, mc.head_dim)
    model = build_model(config, mc, folder, backend)
    assert isinstance(model.layers[0].self_attn.qkv_proj, Int8Linear)
    cache = allocate_kv_cache(mc, 64, 4, torch.float32, torch.device("cpu"))
    pool = ContextPool(BlockManager(64, 4), cache)
    tokens = torch.randint(
        0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    pool.contexts[1] = ctx = Context(context_id=1, token_ids=tokens, materialized=True)
    got = run_chunks(model, pool, ctx, CHUNKS)
    exact = our_logits(folder, tokens, CHUNKS)
    error = ((got - exact).abs().max() / exact.abs().max()).item()
    assert 0 < error < 0.025  # test_weight_formats' int8 bound


RESTORED = {  # rope settings transformers' GGUF loader drops, which the conversion restores
    "phi4-mini-partial-longrope": FAMILIES["phi4-mini-partial-longrope"],
    "gemma3-linear-rope": lambda: transformers.Gemma3TextConfig(
        **{**GEMMA, "layer_types": None, "num_hidden_layers": 6},  # layer 6 is global
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


@pytest.mark.parametrize("name", sorted(RESTORED))
def test_gguf_conversion_keeps_the_checkpoint_s_rope(name, tmp_path):
    """A GGUF of Phi-4-mini (partial rotary, long-rope) or Gemma 3 (linear rope on its global
    layers) runs as the checkpoint it was made from."""
    hf = random_hf(RESTORED[name]())
    folder = resolve_model_folder(write_gguf(hf, tmp_path / f"{name}.gguf"), tmp_path / "cache")
    tokens = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    torch.testing.assert_close(our_logits(folder, tokens.tolist(), CHUNKS), expected, atol=2e-4, rtol=2e-4)


def test_longrope_tables_switch_to_the_long_factors_at_the_pretraining_length():
    """Positions below original_max_position_embeddings rotate as transformers does for a
    short sequence, the rest as it does for a long one (vLLM's split)."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    hf_config = FAMILIES["phi4-mini-partial-longrope"]()
    config = ModelConfig.from_hf_dict(hf_config.to_dict(), "m")
    ours = RotaryEmbedding(config.rotary_dim, 512, config.rope_theta, config.rope_scaling)
    theirs = Phi3RotaryEmbedding(hf_config)
    x = torch.zeros(1, 1, config.rotary_dim)
    short_cos, short_sin = theirs(x, torch.arange(64)[None])
    long_cos, long_sin = theirs(x, torch.arange(512)[None])
    torch.testing.assert_close(ours.cos[:64], short_cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.sin[:64], short_sin[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.cos[64:], long_cos[0, 64:], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.sin[64:], long_sin[0, 64:], rtol=0, atol=1e-6)
    assert not torch.allclose(short_cos[0], long_cos[0, :64])  # the two factor sets differ


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


@pytest.mark.parametrize("mode", [("bfloat16", "exact"), ("float32", "int8"), ("float32", "int4")])
def test_fast_modes_stay_close_on_the_new_families(mode, family):
    """Each weight format on each family, within test_weight_formats' bounds of the exact mode."""
    from test_weight_formats import RANDOM_BOUNDS, logits_of, relative_error

    name, _, folder = family
    if name == "gemma3-softcap-linear-rope":
        pytest.skip("logits capped at 3: an error relative to the largest logit says little")
    tokens = torch.randint(
        0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    exact = logits_of(folder, "float32", "exact", tokens, CHUNKS)
    error = relative_error(logits_of(folder, *mode, tokens, CHUNKS), exact)
    assert 0 < error < RANDOM_BOUNDS[mode], f"{mode}: relative logit error {error:.4f}"


def test_a_gguf_of_another_architecture_is_refused_before_conversion(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "tiny-gpt2.gguf"
    writer = GGUFWriter(str(path), "gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF architecture 'gpt2'.*qwen3.*phi3.*gemma3"):
        resolve_model_folder(path, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half converted


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
