"""The repository layout keeps the standard library's ``platform`` importable from the root."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT

CODE_FOLDERS = ("platform", "engines", "sdk", "adapters", "web", "wire")


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


# Wire formats are the libraries' (prometheus_client, Litestar's ServerSentEvent, httpx-sse):
# none of these may come back in the code (this file is the one place that names them).
HAND_WRITTEN = re.compile(
    "|".join(
        (
            r"[\"']# (TYPE|HELP) ",  # Prometheus exposition lines
            r"f[\"']data: ",  # SSE events formatted by hand
            r"startswith\([\"'](data|event):",  # SSE lines parsed by hand
            r"\.a?iter_lines\(",  # streams read line by line
        )
    )
)


def test_no_hand_written_prometheus_text_or_sse_lines():
    here = Path(__file__).resolve()
    found = []
    for folder in (*CODE_FOLDERS, "tests", "benchmarks", "examples"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if path == here:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if HAND_WRITTEN.search(line):
                    found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


# The client (the SDK, the LangChain adapter and the wire contract they share with the
# server) installs without the server's packages (tests/test_client_install.py): none of its
# modules may import a server module, not even lazily inside a function.
CLIENT_FOLDERS = ("sdk", "adapters", "wire")
SERVER_PACKAGES = ("parrot.platform", "parrot.engines", "parrot.web")


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            if node.module == "parrot":  # from parrot import platform
                yield from ((node.lineno, f"parrot.{alias.name}") for alias in node.names)


def test_the_client_imports_no_server_module():
    found = []
    for folder in CLIENT_FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
                if module.startswith(SERVER_PACKAGES) or module in ("torch", "litestar", "sqlalchemy"):
                    found.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {module}")
            for match in re.finditer(r"import_module\(", path.read_text()):
                found.append(f"{path.relative_to(REPO_ROOT)}: imports by name ({match.group()})")
    assert not found, "\n".join(found)


def test_the_wire_contract_imports_only_msgspec_and_the_standard_library():
    found = []
    for path in sorted((REPO_ROOT / "wire").rglob("*.py")):
        for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
            allowed = module.split(".")[0] in (*sys.stdlib_module_names, "msgspec")
            if not allowed and not module.startswith("parrot.wire"):
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {module}")
    assert (REPO_ROOT / "wire" / "__init__.py").is_file()
    assert not found, "\n".join(found)
