"""``--model org/name``: a Hugging Face hub id (issue 38 §2), resolved through
``huggingface_hub`` from its cache, offline (``HF_HUB_OFFLINE=1``) as on a machine without
network once the files are cached. The cache is one the test builds, in the hub's layout
(``models--org--name/refs/main`` naming a snapshot), holding the tiny test model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from servers import ParrotProcess, free_port

from parrot.engines.builtin.model.loader import is_hub_id, resolve_model_folder
from parrot.engines.protocol.errors import ModelLoadError

REPO = "acme/tiny-llama"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, model_folder: Path) -> Path:
    """A hub cache holding ``model_folder`` as ``REPO`` at ``REVISION``."""
    repo = root / "models--acme--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    shutil.copytree(model_folder, repo / "snapshots" / REVISION)
    return root


def test_what_counts_as_a_hub_id():
    assert is_hub_id("Qwen/Qwen2.5-1.5B-Instruct") and is_hub_id("acme/tiny_llama.v2")
    for not_one in ("model.gguf", "/abs/folder", "a/b/c", "./x", "../x", "a/", "a b/c", "org/na:me"):
        assert not is_hub_id(not_one), not_one


def test_a_hub_id_is_its_cached_snapshot_offline(tiny_model, tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = hub_cache(tmp_path / "hub", tiny_model)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    folder = resolve_model_folder(REPO, tmp_path / "converted")
    assert folder == cache / "models--acme--tiny-llama" / "snapshots" / REVISION
    assert (folder / "config.json").is_file()
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
        resolve_model_folder("acme/not-cached", tmp_path / "converted")


@pytest.mark.spawns
def test_parrot_engine_serves_a_hub_id_from_the_cache_offline(tiny_model, tmp_path):
    cache = hub_cache(tmp_path / "hub", tiny_model)
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    args = ["engine", "--model", REPO, "--port", str(port), "--kv-cache-memory", "64MiB"]
    process = ParrotProcess(args, env)
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(lambda: httpx.get(f"{url}/ping", timeout=2).status_code == 200, "engine")
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    finally:
        process.kill()
