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

CODE_FOLDERS = ("platform", "engines", "sdk", "adapters", "web", "wire", "cli")


@pytest.mark.spawns
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


@pytest.mark.spawns
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


@pytest.mark.spawns
def test_parrot_namespace_imports_from_the_root():
    out = subprocess.run(
        [sys.executable, "-c", "import parrot.engines.builtin.engine, parrot.cli.main; print('ok')"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ok"


@pytest.mark.spawns
def test_parrot_console_script_has_engine_command():
    out = subprocess.run(
        [sys.executable, "-m", "parrot.cli.main", "engine", "--help"],
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


# The layers, bottom up (issue 34): each top-level package imports only itself and the
# packages below it, so there is no import cycle between them. The dashboard sits on the
# serve layer (never the reverse: ``parrot.web.app.create_server_app`` adds its pages to the
# API's app), and the ``parrot`` command on everything.
LAYERS = {
    "wire": set(),
    "sdk": {"wire"},
    "adapters": {"sdk", "wire"},
    "engines": {"wire"},
    "platform": {"engines", "wire"},
    "web": {"platform", "engines", "wire"},
    "cli": {"web", "platform", "engines", "sdk", "wire"},
}


def top_level_imports(folder: str) -> Iterator[tuple[str, str]]:
    """(where, imported top-level package) for every ``parrot.*`` import under ``folder``,
    lazy ones inside functions included."""
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
            parts = module.split(".")
            if parts[0] == "parrot" and len(parts) > 1:
                yield f"{path.relative_to(REPO_ROOT)}:{line}", parts[1]


def test_each_top_level_package_imports_only_the_layers_below_it():
    assert set(LAYERS) == set(CODE_FOLDERS)
    found = [
        f"{where}: {folder} imports parrot.{package}"
        for folder in CODE_FOLDERS
        for where, package in top_level_imports(folder)
        if package != folder and package not in LAYERS[folder]
    ]
    assert not found, "\n".join(found)


def test_the_layers_have_no_cycle():
    """What the test above allows is a DAG; and the packages' real imports form one too."""
    edges = {folder: {p for _, p in top_level_imports(folder) if p != folder} for folder in CODE_FOLDERS}
    for graph in (LAYERS, edges):
        order, left = [], {k: set(v) for k, v in graph.items()}
        while left:
            free = [k for k, deps in left.items() if not deps & set(left)]
            assert free, f"an import cycle among {sorted(left)}"
            order += free
            for k in free:
                del left[k]
    assert edges["platform"] and "web" not in edges["platform"]  # the scan sees imports


def test_the_scan_sees_lazy_imports():
    tree = ast.parse("def f():\n    from parrot.web.app import x\n    import parrot.cli.main\n")
    assert [m for _, m in imported_modules(tree)] == ["parrot.web.app", "parrot.cli.main"]


MAX_MODULE_LINES = 400  # a module is one concept a newcomer can read at once
MAX_FOLDER_MODULES = 10  # a folder of platform/ is one room: a few modules, each with its role


def test_no_module_is_over_400_lines():
    long = [
        f"{path.relative_to(REPO_ROOT)}: {n} lines"
        for folder in (*CODE_FOLDERS, "tests")
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def test_no_folder_of_the_serve_layer_holds_more_than_ten_modules():
    crowded = []
    for folder in sorted(p for p in (REPO_ROOT / "platform").rglob("*") if p.is_dir()):
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_FOLDER_MODULES:
            crowded.append(f"{folder.relative_to(REPO_ROOT)}: {len(modules)} modules")
    assert not crowded, "\n".join(crowded)
    assert (REPO_ROOT / "platform" / "serve" / "calls").is_dir()


def test_the_extension_sources_ship_with_an_installed_server():
    """setup.py's package data covers every file of the C++ extension's sources: an installed
    (not editable) server compiles them where it runs (engines/builtin/native.py), and a
    missing header would leave it on torch's slower ops."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    data = next(k.value for k in call.keywords if k.arg == "package_data")
    patterns = next(ast.literal_eval(v) for v in data.values)
    sources = sorted((REPO_ROOT / "engines" / "builtin" / "csrc").iterdir())
    assert sources and all(any(p.match(pattern) for pattern in patterns) for p in sources), sources
