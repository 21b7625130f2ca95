"""The repository layout keeps the standard library's ``platform`` importable from the root."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO_ROOT

CODE_FOLDERS = ("platform", "engines", "sdk", "adapters", "web")


def test_stdlib_platform_wins_in_the_repository_root():
    out = subprocess.run(
        [sys.executable, "-c", "import platform; print(platform.system())"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() in {"Linux", "Darwin", "Windows"}


def test_only_platform_has_no_init():
    """``platform/`` must stay a namespace portion (a package would shadow the standard
    library); the other folders are packages, so they can export names."""
    assert not (REPO_ROOT / "platform" / "__init__.py").exists()
    for folder in CODE_FOLDERS:
        assert (REPO_ROOT / folder).is_dir(), folder
    for folder in ("sdk", "adapters"):
        assert (REPO_ROOT / folder / "__init__.py").is_file(), folder


PUBLIC_IMPORTS = (
    "from parrot.sdk import Client, AsyncClient, semantic_function, Input, Output, ParrotError\n"
    "from parrot.sdk.api import Client as ApiClient\n"
    "assert Client is ApiClient\n"
    "from parrot.adapters.langchain import ParrotLLM, ParrotChatModel, compile_chain\n"
    "import platform\n"
    "print(platform.system(), Client.__module__, ParrotLLM.__module__)\n"
)


@pytest.mark.parametrize("where", ["repository root", "another folder"])
def test_public_names_import_in_a_fresh_interpreter(where, tmp_path):
    cwd = REPO_ROOT if where == "repository root" else tmp_path
    out = subprocess.run(
        [sys.executable, "-c", PUBLIC_IMPORTS], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    system, *modules = out.stdout.split()
    assert system in {"Linux", "Darwin", "Windows"}  # the standard library's platform
    assert modules == ["parrot.sdk.client", "parrot.adapters.langchain.llm"]


def test_parrot_namespace_imports_from_the_root():
    out = subprocess.run(
        [sys.executable, "-c", "import parrot.engines.builtin.engine, parrot.platform.cli.main; print('ok')"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ok"


def test_parrot_console_script_has_engine_command():
    out = subprocess.run(
        [sys.executable, "-m", "parrot.platform.cli.main", "engine", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--kv-cache-memory" in out.stdout and "--port" in out.stdout
