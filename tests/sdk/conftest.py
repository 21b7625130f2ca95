"""One real ``parrot serve`` process for the SDK tests, on the session's shared engine."""

from __future__ import annotations

import os

import httpx
import pytest
from conftest import free_port, parrot_process

from parrot.sdk.api import Client

ADMIN_TOKEN = "sdk-admin"


@pytest.fixture(scope="session")
def parrot_url(engine_server, tmp_path_factory) -> str:
    """``parrot serve`` as a child process (as deployed), with the engine that the other
    tests use registered (``--engine``), so no second model is loaded. SIGINT at the end;
    it must exit with code 0."""
    data = tmp_path_factory.mktemp("sdk-serve")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        "serve",
        "--port",
        str(port),
        "--engine",
        engine_server.url,
        "--admin-token",
        ADMIN_TOKEN,
        "--db",
        f"sqlite+aiosqlite:///{data / 'parrot.db'}",
        "--data-dir",
        str(data),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PARROT_SERVER", "PARROT_ADMIN_TOKEN")}

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1

    with parrot_process(args, env, ready, "parrot serve"):
        yield url


@pytest.fixture
def parrot(parrot_url) -> Client:
    with Client(parrot_url, admin_token=ADMIN_TOKEN, timeout=120) as client:
        yield client
