"""The LangChain examples run against a real ``parrot serve``: the compiled run returns
what the step-by-step run returns, and the server's timings show the difference (the
step-by-step run waits between its steps, the compiled one submits everything first)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest
from conftest import REPO_ROOT

from .conftest import submitted_before_any_finished

EXAMPLES = REPO_ROOT / "examples"


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as when run as a script: its helpers import

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"parrot_example_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def test_two_step(example, parrot_url):
    result = example("langchain_two_step").main(parrot_url, max_tokens=8, runs=1)
    step_by_step, compiled = result["step_by_step"], result["compiled"]
    assert isinstance(compiled["output"], str) and compiled["output"].strip()
    assert isinstance(step_by_step["output"], str) and step_by_step["output"].strip()
    assert compiled["seconds"] > 0 and step_by_step["seconds"] > 0
    name, slogan = step_by_step["calls"]
    assert slogan["timings"]["submitted_at"] >= name["timings"]["finished_at"]
    assert submitted_before_any_finished(compiled["calls"])
    name, slogan = compiled["calls"]
    assert slogan["timings"]["started_at"] >= name["timings"]["finished_at"]


def test_map_reduce(example, parrot_url):
    result = example("langchain_map_reduce").main(parrot_url, max_parts=3, max_tokens=8, runs=1)
    assert result["parts"] == 3
    for run in (result["step_by_step"], result["compiled"]):
        assert isinstance(run["output"], str)
        *maps, reduce = run["calls"]
        assert len(maps) == 3 and all(c["state"] == "done" for c in run["calls"])
        assert reduce["timings"]["started_at"] >= max(m["timings"]["finished_at"] for m in maps)
    # Step by step, the reduce is sent once the maps' summaries are back; compiled, at once.
    *maps, reduce = result["step_by_step"]["calls"]
    assert reduce["timings"]["submitted_at"] >= max(m["timings"]["finished_at"] for m in maps)
    assert submitted_before_any_finished(result["compiled"]["calls"])


@pytest.mark.spawns
@pytest.mark.parametrize("name", ["langchain_two_step", "langchain_map_reduce"])
def test_examples_run_as_scripts(name):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--server" in out.stdout and "compile_chain" in out.stdout
