"""Model configs from transformers 4/5 style config.json, rope variants against transformers."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from parrot.engines.builtin.model.config import ModelConfig, RopeScaling
from parrot.engines.builtin.model.rope import inv_freq_and_scale
from parrot.engines.protocol.errors import ModelLoadError

SMALL = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


@pytest.mark.parametrize(
    ("cls", "arch", "qkv_bias"),
    [
        (transformers.LlamaConfig, "llama", False),
        (transformers.MistralConfig, "mistral", False),
        (transformers.Qwen2Config, "qwen2", True),
    ],
)
def test_configs_of_each_family(cls, arch, qkv_bias):
    config = ModelConfig.from_hf_dict(cls(**SMALL).to_dict(), "m")
    assert config.architecture == arch and config.qkv_bias is qkv_bias
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 16)


def test_transformers4_style_rope_fields():
    d = {
        **SMALL,
        "model_type": "llama",
        "rope_theta": 5e5,
        "rope_scaling": {"type": "linear", "factor": 4.0},
        "eos_token_id": [1, 2],
    }
    config = ModelConfig.from_hf_dict(d, "m")
    assert config.rope_theta == 5e5 and config.rope_scaling == RopeScaling(kind="linear", factor=4.0)
    assert config.eos_token_ids == (1, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "unsupported model type"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"rope_scaling": {"rope_type": "longrope2"}}, "unsupported rope scaling type"),
    ],
)
def test_bad_configs_are_rejected_with_clear_messages(change, message):
    d = {**SMALL, "model_type": "llama", **change}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_hf_dict(d, "m")


def test_missing_field_and_missing_config(tmp_path):
    d = {k: v for k, v in SMALL.items() if k != "hidden_size"}
    with pytest.raises(ModelLoadError, match="hidden_size"):
        ModelConfig.from_hf_dict({**d, "model_type": "llama"}, "m")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "model_type": "llama"}))
    assert ModelConfig.from_folder(tmp_path).name == tmp_path.name


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    ],
)
def test_rope_frequencies_match_transformers(scaling):
    hf = transformers.LlamaConfig(**SMALL, rope_scaling=scaling)
    kind = (scaling or {}).get("rope_type", "default")
    expected, expected_scale = (
        ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
        if kind != "default"
        else (1.0 / (hf.rope_parameters["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16)), 1.0)
    )
    config = ModelConfig.from_hf_dict(hf.to_dict(), "m")
    got, scale = inv_freq_and_scale(
        16, config.rope_theta, config.rope_scaling, config.max_position_embeddings
    )
    torch.testing.assert_close(got, expected.float())
    assert scale == pytest.approx(expected_scale)
