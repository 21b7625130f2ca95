"""The model's config.json as the engine reads it (Llama, Mistral, Qwen2; transformers 4 and 5
styles; bad configs), and the rotary embeddings it implies, against transformers."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from parrot.engines.builtin.model.model_config import ModelConfig, RopeScaling
from parrot.engines.builtin.model.rope import RotaryEmbedding, inv_freq_and_scale
from parrot.engines.protocol.errors import ModelLoadError

SMALL = dict(
    vocab_size=64,
    hidden_size=128,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def llama_dict(**changes) -> dict:
    return {**transformers.LlamaConfig(**SMALL).to_dict(), **changes}


def test_llama_config_transformers5_style():
    d = transformers.LlamaConfig(
        **SMALL, rope_theta=5e5, eos_token_id=[2, 7], bos_token_id=1, tie_word_embeddings=True
    ).to_dict()
    assert "rope_parameters" in d and "rope_theta" not in d  # really the transformers 5 layout
    c = ModelConfig.from_hf_dict(d, "tiny")
    assert c == ModelConfig(
        architecture="llama",
        vocab_size=64,
        hidden_size=128,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=5e5,
        rope_scaling=RopeScaling(),
        max_position_embeddings=512,
        tie_word_embeddings=True,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        bos_token_id=1,
        eos_token_ids=(2, 7),
        name="tiny",
    )


def test_llama_config_transformers4_style():
    d = {
        **SMALL,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "LLaMA",  # case does not matter
        "rope_theta": 5e5,
        "rope_scaling": {"type": "linear", "factor": 4.0},
        "eos_token_id": 2,
        "attention_bias": True,
        "mlp_bias": True,
    }
    c = ModelConfig.from_hf_dict(d, "m")
    assert c.architecture == "llama" and c.rope_theta == 5e5
    assert c.rope_scaling == RopeScaling(kind="linear", factor=4.0)
    assert c.eos_token_ids == (2,)
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == (True, True, True)  # attention_bias covers o_proj


def test_llama3_rope_transformers4_style_and_defaults():
    d = {k: v for k, v in SMALL.items() if k != "num_key_value_heads"}
    d |= {"model_type": "llama", "head_dim": 64}
    d["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
    c = ModelConfig.from_hf_dict(d, "m")
    assert c.num_kv_heads == c.num_heads == 4  # absent num_key_value_heads: plain multi-head
    assert c.head_dim == 64  # an explicit head_dim wins over hidden_size // heads
    # transformers falls back to max_position_embeddings for the pretraining length
    assert c.rope_scaling.original_max_position_embeddings == 512
    assert c.rope_theta == 10000.0


@pytest.mark.parametrize(
    ("config", "arch", "biases"),
    [
        (transformers.MistralConfig(**SMALL, attention_bias=True), "mistral", (False, False, False)),
        (transformers.Qwen2Config(**SMALL, rope_theta=1e6), "qwen2", (True, False, False)),
    ],
)
def test_mistral_and_qwen2_configs(config, arch, biases):
    c = ModelConfig.from_hf_dict(config.to_dict(), "m")
    assert c.architecture == arch
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == biases  # as transformers' modeling files build them
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (4, 2, 32)
    if arch == "qwen2":
        assert c.rope_theta == 1e6


def test_architectures_is_the_fallback_for_model_type():
    d = llama_dict()
    d.pop("model_type")
    assert ModelConfig.from_hf_dict({**d, "architectures": ["Qwen2ForCausalLM"]}, "m").architecture == "qwen2"
    with pytest.raises(ModelLoadError, match="unsupported model type"):
        # a substring match would wrongly accept the MoE variant
        ModelConfig.from_hf_dict({**d, "architectures": ["Qwen2MoeForCausalLM"]}, "m")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, r"unsupported model type 'gpt2'"),
        (
            {"num_key_value_heads": 3},
            r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)",
        ),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "unsupported rope scaling type"),
        ({"rope_parameters": {"rope_type": "linear"}}, "rope scaling 'linear' needs a 'factor'"),
        ({"rope_parameters": {"rope_type": "linear", "factor": "x"}}, "rope factor must be a number"),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial rotary"),
        ({"hidden_size": 130, "head_dim": None}, r"hidden_size \(130\) is not a multiple"),
        ({"vocab_size": 0}, "'vocab_size' must be positive"),
        ({"eos_token_id": "end"}, "eos_token_id must be an integer"),
    ],
)
def test_bad_configs_are_rejected_with_clear_messages(change, message):
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_hf_dict(llama_dict(**change), "m")


@pytest.mark.parametrize(
    "field", ["hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings"]
)
def test_missing_required_field(field):
    d = llama_dict()
    d.pop(field)
    with pytest.raises(ModelLoadError, match=f"lacks the required field '{field}'"):
        ModelConfig.from_hf_dict(d, "m")


def test_from_folder_merges_generation_config_eos(tmp_path):
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(llama_dict(eos_token_id=2)))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2]}))
    c = ModelConfig.from_folder(tmp_path)
    assert c.eos_token_ids == (2, 5) and c.name == tmp_path.name
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        ModelConfig.from_folder(tmp_path)


ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "yarn-untruncated": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "truncate": False,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 64,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "attention_factor": 1.5,
    },
}


def hf_rope(case: str) -> tuple[transformers.LlamaConfig, ModelConfig]:
    hf = transformers.LlamaConfig(**SMALL, rope_theta=5e5, rope_scaling=ROPE_CASES[case])
    return hf, ModelConfig.from_hf_dict(hf.to_dict(), "m")


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_frequencies_and_attention_factor_match_transformers(case):
    hf, config = hf_rope(case)
    kind = hf.rope_parameters["rope_type"]
    if kind == "default":
        expected, expected_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    else:
        expected, expected_scale = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
    got, scale = inv_freq_and_scale(
        config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
    )
    assert got.dtype == torch.float32
    assert torch.equal(got, expected.float())  # same float32 operations, same bits
    assert scale == pytest.approx(expected_scale, rel=1e-12)
    if case.startswith("yarn"):
        assert scale != 1.0  # the attention factor really is exercised


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rotation_matches_transformers_llama_rotary(case):
    hf, config = hf_rope(case)
    # dynamic NTK only differs from plain rope beyond max_position_embeddings: go there
    n = 2 * config.max_position_embeddings if case == "dynamic" else config.max_position_embeddings
    ours = RotaryEmbedding(config.head_dim, n, config.rope_theta, config.rope_scaling)
    assert ours.cos.shape == ours.sin.shape == (n, config.head_dim) and ours.cos.dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(n, 4, config.head_dim, generator=gen)  # [num_tokens, num_heads, head_dim]
    k = torch.randn(n, 2, config.head_dim, generator=gen)  # [num_tokens, num_kv_heads, head_dim]
    positions = torch.randperm(n, generator=gen)  # any order: the engine batches many sequences
    cos, sin = LlamaRotaryEmbedding(hf)(q, torch.arange(n)[None])  # full length: dynamic scales for n
    cos, sin = cos[0, positions], sin[0, positions]  # [num_tokens, head_dim]
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    got_q, got_k = ours.rotate(positions, q, k)
    torch.testing.assert_close(got_q, expected_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_k, expected_k, rtol=0, atol=1e-6)
    # The model's path: one lookup per step, q and k rotated together.
    qk = ours(ours.lookup(positions), torch.cat([q, k], dim=1))
    assert torch.equal(qk, torch.cat([got_q, got_k], dim=1))


def test_rotation_keeps_low_precision_dtype():
    _, config = hf_rope("llama3")
    ours = RotaryEmbedding(config.head_dim, 64, config.rope_theta, config.rope_scaling)
    positions = torch.arange(64)
    q = torch.randn(64, 4, config.head_dim)
    k = torch.randn(64, 2, config.head_dim)
    got_q, got_k = ours.rotate(positions, q.bfloat16(), k.bfloat16())
    assert got_q.dtype == got_k.dtype == torch.bfloat16
    ref_q, ref_k = ours.rotate(positions, q, k)
    torch.testing.assert_close(got_q.float(), ref_q, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_k.float(), ref_k, rtol=2e-2, atol=2e-2)
