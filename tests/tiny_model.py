"""A random 2-layer Llama with the default model's tokenizer, for the tests of processes
(ports, restarts, an engine child that goes with its parent): what they test does not
depend on the model, and an engine loads this one in a moment (the default model takes
seconds, in every process that starts one)."""

from __future__ import annotations

import shutil
from pathlib import Path

NAME = "tiny-llama"


def write_tiny_model(folder: Path, tokenizer_folder: Path) -> Path:
    """The model in ``folder`` (created), its tokenizer copied from ``tokenizer_folder``."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152,  # the default model's tokenizer
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=2,
        bos_token_id=1,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_folder / name, folder / name)
    return folder
