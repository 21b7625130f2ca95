"""The families beyond Llama/Mistral/Qwen2 against transformers, on random tiny configs:
Qwen3 (q/k norms, head_dim of its own), Phi-3 / Phi-4-mini (fused weights, partial rotary,
long-rope), Gemma 3 (its norms, GeGLU, scaled embeddings, sliding-window layers with a
local rope, final soft-capping). Logits of chunked prefill + decode, and greedy tokens, from
safetensors folders; the fast weight modes on them. GGUF files of these families:
test_model_families_gguf.py; sliding windows: test_sliding_windows.py."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import CHUNKS, FAMILIES, TOKENS, our_greedy, our_logits, random_hf
from test_model_correctness import SMALL

from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model.rope import RotaryEmbedding
from parrot.engines.protocol.errors import ModelLoadError


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    hf = random_hf(FAMILIES[request.param]())
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, folder


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
