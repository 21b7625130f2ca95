"""Shared fixtures: one real builtin engine (default model) per test session, served over HTTP."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

REPO_ROOT = Path(__file__).resolve().parents[1]

# Without a GPU the Triton kernels run in Triton's interpreter; it must be chosen before
# triton is first imported.
if not os.environ.get("CUDA_VISIBLE_DEVICES", "x") or not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory) -> Path:
    """Converted models are cached per user, as in production (conversion is slow once)."""
    return Path.home() / ".cache" / "parrot" / "models"


@pytest.fixture(scope="session")
def engine_config(model_cache_dir):
    from parrot.engines.builtin.config import EngineConfig
    from parrot.engines.builtin.scheduler import SchedulerConfig

    return EngineConfig(
        cache_dir=str(model_cache_dir),
        kv_cache_bytes=256 * 2**20,  # 5,824 tokens: below the model's 8,192
        scheduler=SchedulerConfig(max_batched_tokens=512, max_running=32),
    )


@pytest.fixture(scope="session")
def engine(engine_config):
    from parrot.engines.builtin.engine import BuiltinEngine

    eng = BuiltinEngine(engine_config)
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def engine_server(engine) -> Iterator[ServerThread]:
    from parrot.engines.builtin.server.app import create_app

    app = create_app(engine, manage_engine=False)
    with ServerThread(app) as server:
        yield server


@pytest.fixture
def client(engine_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine_server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def ids() -> Iterator[int]:
    """Context ids unique across the test session (the engine is shared by all tests)."""
    return itertools.count(10_000)
