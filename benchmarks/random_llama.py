"""A Llama model folder with random weights and a given tokenizer, for measuring speed
where no real checkpoint can be had (a GPU host without network): the engine's work per
token depends on the shapes, not on the values.

``python benchmarks/random_llama.py OUT --tokenizer DIR [--size 1b|tiny] [--device cuda]``
writes ``config.json``, ``model.safetensors`` (bfloat16) and the tokenizer files of DIR
(``tokenizer.json``, ``tokenizer_config.json``: the chat template comes with them).
Random weights make random text: the benchmarks ask for fixed output lengths
(``ignore_eos``), so that does not change the work.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {
    # A 1B-class Llama (Llama 3.2 1B's shapes, with the bundled tokenizer's vocabulary).
    "1b": dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=8192,
    ),
    # A few MB: for checking the pipeline on a CPU.
    "tiny": dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128,
    ),
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make(out: Path, tokenizer: Path, size: str, device: str) -> None:
    config = LlamaConfig(
        vocab_size=49152,  # the bundled SmolLM2 tokenizer's
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **SIZES[size],
    )
    with torch.device(device):  # initialising 1B parameters on the CPU takes minutes
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, out / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder with the tokenizer files")
    parser.add_argument("--size", choices=SIZES, default="1b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    start = time.monotonic()
    make(args.out, args.tokenizer, args.size, args.device)
    params = sum(p.stat().st_size for p in args.out.glob("*.safetensors")) / 2  # bfloat16
    print(f"{args.out}: {args.size}, {params / 1e6:.0f}M parameters, {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
