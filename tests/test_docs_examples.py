"""Every example of the docs runs as written (issue 24, "the first hour"): the ```sh blocks of
``docs/api.md``, in order, in one bash, against a real ServeCore with the real builtin engine
on 127.0.0.1. ``curl`` fails the script on any HTTP error (``--fail-with-body``), so an
example that answers 4xx/5xx, or a variable a block forgot to set, fails this test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import ServerThread

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore

DOCS = Path(__file__).resolve().parents[1] / "docs"
ADMIN = "docs-admin"


def sh_blocks(path: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def served(engine_server):
    app = create_app(ServeCore(), engine_urls=(engine_server.url,), admin_token=ADMIN)
    with ServerThread(app) as server:
        yield server, engine_server


def run_blocks(blocks: list[str], served, tmp_path: Path) -> None:
    server, engine = served
    script = "\n".join(
        [
            "set -euo pipefail",
            # Any HTTP error fails the script, with the body in the output.
            'curl() { command curl --fail-with-body --max-time 300 "$@"; echo; }',
            *blocks,
            "echo DOCS-OK",
        ]
    )
    (tmp_path / "example.sh").write_text(script)
    env = {"PATH": "/usr/bin:/bin", "API": server.url, "ENGINE": engine.url, "PARROT_ADMIN_TOKEN": ADMIN}
    done = subprocess.run(
        ["bash", str(tmp_path / "example.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and "DOCS-OK" in done.stdout, done.stdout[-4000:] + done.stderr[-4000:]


def test_api_md_runs_as_written(served, tmp_path):
    blocks = sh_blocks(DOCS / "api.md")
    assert len(blocks) >= 8
    run_blocks(blocks, served, tmp_path)


def test_the_readme_api_example_runs_as_written(served, tmp_path):
    blocks = sh_blocks(DOCS.parent / "README.md")
    assert blocks and "semantic_call" in blocks[0]
    run_blocks(blocks, served, tmp_path)
