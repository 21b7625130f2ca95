"""A random 2-layer Llama with the default model's tokenizer, for the tests of processes
(ports, restarts, an engine child that goes with its parent): what they test does not
depend on the model, and an engine loads this one in a moment (the default model takes
seconds, in every process that starts one). It is the benchmarks' tiny proxy model
(``benchmarks/random_llama.py --size tiny``), made with a fixed seed."""

from __future__ import annotations

from pathlib import Path

NAME = "tiny-llama"


def write_tiny_model(folder: Path, tokenizer_folder: Path) -> Path:
    """The model in ``folder`` (created), its tokenizer copied from ``tokenizer_folder``."""
    import torch

    from benchmarks.random_llama import make

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    make(folder, tokenizer_folder, "tiny", "cpu")
    return folder
