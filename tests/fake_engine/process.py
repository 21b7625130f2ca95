"""The fake engine in a child process: an engine that can be killed or stopped (SIGKILL,
SIGSTOP) as a real one, without loading a model (it starts in about a second)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
from servers import ChildProcess, free_port

TESTS = Path(__file__).resolve().parents[1]


class FakeEngineProcess(ChildProcess):
    """``python -m fake_engine`` on a free port, answering at ``url``."""

    def __init__(self, step_s: float = 0.0) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-m", "fake_engine", "--port", str(port), "--step-s", str(step_s)]
        super().__init__(argv, {**os.environ, "PYTHONPATH": path}, cwd=TESTS)
        self.wait_ready(lambda: httpx.get(f"{self.url}/ping", timeout=2).status_code == 200, "fake engine")
