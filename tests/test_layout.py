"""The repository layout keeps the standard library's ``platform`` importable from the root."""

from __future__ import annotations

import subprocess
import sys

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


def test_top_level_code_folders_have_no_init():
    for folder in CODE_FOLDERS:
        assert (REPO_ROOT / folder).is_dir(), folder
        assert not (REPO_ROOT / folder / "__init__.py").exists(), folder


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
