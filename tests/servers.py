"""Real servers for the tests: uvicorn apps in a thread, ``parrot`` child processes, free
ports, and what a test reads of them (their event streams, their memory)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_event_streams(base_url: str, model: str | None = None) -> None:
    """The OpenAI-compatible stream routes at ``base_url`` answer ``text/event-stream`` in
    OpenAI's wire format, ending with ``data: [DONE]``."""
    named = {"model": model} if model else {}
    bodies = {
        "/v1/completions": {**named, "prompt": "Hi", "max_tokens": 2, "stream": True},
        "/v1/chat/completions": {
            **named,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "stream": True,
        },
    }
    for path, body in bodies.items():
        with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=120) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream"), path
            # OpenAI's wire format exactly: "data: <json>" events, "\n\n" apart, then [DONE]
            events = response.read().decode().split("\n\n")
            assert events[-2:] == ["data: [DONE]", ""] and len(events) > 3, events
            assert all(re.fullmatch(r"data: \{[^\n]*\}", e) for e in events[:-2]), events


class ServerThread:
    """A real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ChildProcess:
    """``argv`` as a real child process, its output kept (none in the logic tier)."""

    def __init__(self, argv: list[str], env: dict, cwd: Path = REPO_ROOT) -> None:
        if os.environ.get("PARROT_TESTS_LOGIC_ONLY"):
            raise RuntimeError("a logic-tier test starts a child process: mark it spawns (tests/tiers.py)")
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def wait_ready(self, ready: Callable[[], bool], what: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                if ready():
                    return
            except (httpx.TransportError, ValueError):
                pass
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a machine loses the process."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> str:
        """SIGINT, then its whole output (its exit code must be 0)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        output = self.proc.stdout.read()
        assert self.proc.returncode == 0, output
        return output


class ParrotProcess(ChildProcess):
    """``python -m parrot.cli.main ARGS`` as a real child process."""

    def __init__(self, args: list[str], env: dict) -> None:
        super().__init__([sys.executable, "-m", "parrot.cli.main", *args], env)


def serve_env(engine, data_dir: Path, admin_token: str | None, model: Path | None = None) -> dict:
    """The environment of a ``parrot serve`` that starts its own builtin engine: the model
    cache the tests share, a small KV cache, its own data folder and SQLite store, and the
    admin token (none: no fixed token, one is printed); ``model`` (a folder) instead of the
    default model."""
    env = {
        **os.environ,
        "PARROT_CACHE_DIR": str(engine.model_folder.parent),
        "PARROT_KV_CACHE_MEMORY": "256MiB",
        "PARROT_DATA_DIR": str(data_dir),
    }
    if model is not None:
        env["PARROT_MODEL"] = str(model)
    env.pop("PARROT_DB", None)
    env.pop("PARROT_ADMIN_TOKEN", None)
    if admin_token is not None:
        env["PARROT_ADMIN_TOKEN"] = admin_token
    return env


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid``, in MiB."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextmanager
def parrot_process(args: list[str], env: dict, ready: Callable[[], bool], what: str) -> Iterator[list[str]]:
    """Run ``parrot ARGS`` until ``ready()``; SIGINT it afterwards.

    Yields a list that receives the process output once it has exited (checked: exit code 0).
    """
    process = ParrotProcess(args, env)
    output: list[str] = []
    try:
        process.wait_ready(ready, what)
        yield output
    finally:
        if process.proc.poll() is None:
            output.append(process.stop())
