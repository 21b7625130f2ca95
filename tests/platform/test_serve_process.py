"""``parrot serve`` with the builtin engine it starts: the engine never outlives it (SIGTERM
or SIGKILL), and an engine already on the engine port is not silently adopted. (The engine
serves the tiny model: what happens to processes and ports does not depend on the model.)"""

from __future__ import annotations

import os
import signal
import socket
import time

import httpx
import pytest
from conftest import ParrotProcess, free_port

pytestmark = pytest.mark.spawns  # child processes


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def gone(url: str, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while answers(url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_engine_child_stops_with_parrot_serve(sig, tmp_path, tiny_model):
    port, engine_port = free_port(), free_port()
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin", "PARROT_DATA_DIR": str(tmp_path)}
    env |= {"PARROT_MODEL": str(tiny_model), "PARROT_KV_CACHE_MEMORY": "64MiB"}
    serve = ParrotProcess(["serve", "--port", str(port), "--engine-port", str(engine_port)], env)
    engine = f"http://127.0.0.1:{engine_port}/ping"
    serve.wait_ready(lambda: answers(f"http://127.0.0.1:{port}/healthz"), "parrot serve", timeout_s=300)
    assert answers(engine)
    serve.proc.send_signal(sig)
    serve.proc.wait(timeout=60)
    assert gone(engine), f"the engine outlived parrot serve ({sig.name})"
    if sig is signal.SIGTERM:
        assert serve.proc.returncode == 0, serve.proc.stdout.read()


def test_a_busy_engine_port_is_refused_not_adopted(tmp_path):
    port = free_port()
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin", "PARROT_DATA_DIR": str(tmp_path)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        engine_port = taken.getsockname()[1]
        serve = ParrotProcess(["serve", "--port", str(port), "--engine-port", str(engine_port)], env)
        output, _ = serve.proc.communicate(timeout=60)
    assert serve.proc.returncode != 0
    assert f"port {engine_port} for the builtin engine is in use" in output
