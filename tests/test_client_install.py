"""The client installs alone: ``pip install 'parrot-serve[langchain]'`` into a fresh virtualenv
(no torch, no Litestar, no SQLAlchemy) runs the SDK and the LangChain adapter against a real
``parrot serve`` (the shared one of tests/conftest.py, started from this project's venv).

The install is not editable and is built from a copy of the sources, so it proves the
packaging (pyproject.toml's dependencies and setup.py's package list) rather than this
checkout's layout; pip's cache is off, so nothing is left outside the test's tmp folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.spawns  # child processes

SOURCES = (
    *("pyproject.toml", "setup.py", "README.md"),
    *("platform", "engines", "sdk", "adapters", "web", "wire", "cli", "migrations"),
)

CLIENT_APP = """
import json, sys
from parrot.sdk import Client, Input, Output, semantic_function
from parrot.adapters.langchain import ParrotChatModel, ParrotLLM

@semantic_function
def name_a(thing: Input, name: Output(max_tokens=4, temperature=0)):
    '''Name a {{thing}}: {{name}}'''

url = sys.argv[1]
with Client(url, timeout=120) as client:
    health = client.healthz()
    with client.session() as session:
        name = name_a("sea creature")
        text = name.get()
        session_id = session.session_id
        streamed = name_a("sea bird")
        pieces = list(streamed.stream())
llm = ParrotLLM(base_url=url, max_tokens=4, temperature=0)
chat = ParrotChatModel(base_url=url, max_tokens=4, temperature=0)
server = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "litestar", "sqlalchemy",
    "transformers", "triton") or m.startswith(("parrot.platform", "parrot.engines", "parrot.web")))
print(json.dumps({
    "engines": health.engines,
    "session": session_id,
    "semantic_call": text,
    "streamed": [pieces, streamed.get()],
    "llm": llm.invoke("The capital of France is"),
    "chat": chat.invoke("Say hello.").content,
    "server_modules": server,
}))
"""


def client_env(tmp: Path) -> dict:
    """This process's environment without what would let the venv see this checkout's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PARROT_"))}
    env["PIP_NO_CACHE_DIR"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["TMPDIR"] = str(tmp)
    return env


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> tuple[Path, dict]:
    """A fresh virtualenv with only ``parrot-serve[langchain]`` installed, from a copy of the sources."""
    tmp = tmp_path_factory.mktemp("client-install")
    source = tmp / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    env = client_env(tmp)
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    out = subprocess.run(
        [python, "-m", "pip", "install", "-q", f"{source}[langchain]"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return python, env


def run_in(client: tuple[Path, dict], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    python, env = client
    return subprocess.run(
        [python, *args], cwd=python.parents[2], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_client_install_has_none_of_the_servers_packages(client_venv):
    installed = run_in(client_venv, "-m", "pip", "list", "--format=json")
    names = {p["name"].lower() for p in json.loads(installed.stdout)}
    assert {"parrot-serve", "httpx", "msgspec", "httpx-sse", "langchain-core"} <= names
    assert not names & {"torch", "triton", "transformers", "litestar", "sqlalchemy", "uvicorn", "numpy"}
    no_torch = run_in(client_venv, "-c", "import torch")
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    # The package is the installed copy, not this checkout.
    where = run_in(client_venv, "-c", "import parrot.sdk; print(parrot.sdk.__file__)")
    assert "site-packages" in where.stdout and str(REPO_ROOT) not in where.stdout


def test_sdk_and_langchain_adapter_run_against_a_real_server(client_venv, parrot_url):
    out = run_in(client_venv, "-c", CLIENT_APP, parrot_url)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["server_modules"] == []
    assert result["engines"] == 1 and result["session"]
    assert result["semantic_call"].strip() and result["llm"].strip() and result["chat"].strip()
    pieces, value = result["streamed"]
    assert pieces and "".join(pieces) == value  # a variable streams in a client-only install


def test_server_commands_say_what_to_install(client_venv):
    """The ``parrot`` console script of a client install: a server command exits with the
    install command (no traceback); ``parrot run`` works."""
    parrot = client_venv[0].parent / "parrot"
    python, env = client_venv
    serve = [parrot, "serve", "--port", "9"]
    out = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "pip install 'parrot-serve[server]'" in out.stderr and "client only" in out.stderr
    app = python.parents[1] / "app.py"
    app.write_text("import os, sys; print(os.environ['PARROT_SERVER'], sys.argv[1:])\n")
    out = subprocess.run(
        [parrot, "run", str(app), "--server", "http://example:1", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "http://example:1 ['x']", out.stderr
    assert sys.executable != str(python)
