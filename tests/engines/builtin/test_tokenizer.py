"""The default model's tokenizer (from the model cache the tests share), its chat template,
and the streaming detokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from parrot.engines.builtin.model.loader import resolve_model_folder
from parrot.engines.builtin.tokenizer import IncrementalDetokenizer, Tokenizer


@pytest.fixture(scope="module")
def model_folder(model_cache_dir) -> Path:
    """The default model's folder in the shared model cache (converted once, if not yet)."""
    return resolve_model_folder(None, model_cache_dir)


@pytest.fixture(scope="module")
def tokenizer(model_folder) -> Tokenizer:
    return Tokenizer(model_folder)


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


def test_a_model_without_chat_template_says_so(model_folder, tmp_path):
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(model_folder / name, tmp_path / name)
    tok_config = json.loads((model_folder / "tokenizer_config.json").read_text())
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
