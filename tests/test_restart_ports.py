"""``parrot serve`` restarts at once after a stop (issue 24, defect 1): a port that a stopped
server left in TIME_WAIT is free, a port that a process listens on is still refused. (The
engines that ``parrot serve`` starts here serve the tiny model: ports do not depend on it.)"""

from __future__ import annotations

import os
import socket
import time

import httpx
import pytest
from conftest import ParrotProcess, free_port, parrot_process, serve_env

from parrot.cli.serve_cmd import port_in_use


def _leave_time_wait(port: int) -> None:
    """Accept one connection on ``port`` and close it from the server side first, as a
    stopping engine does with its keep-alive connections: the port is left in TIME_WAIT."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the active close: this side keeps the TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()


def _time_wait_blocks_a_plain_bind(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_a_port_in_time_wait_is_free():
    port = free_port()
    _leave_time_wait(port)
    assert _time_wait_blocks_a_plain_bind(port)  # the state the defect tripped on
    assert not port_in_use(port)


def test_a_listening_port_is_in_use():
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert port_in_use(held.getsockname()[1])


def test_a_bound_port_is_in_use():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        assert port_in_use(held.getsockname()[1])


@pytest.mark.parametrize("stop", ["sigint", "sigkill"])
def test_serve_restarts_at_once_with_the_same_ports(engine, tmp_path, stop, tiny_model):
    port, engine_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = serve_env(engine, tmp_path, "restart-test-token", model=tiny_model)
    args = ["serve", "--port", str(port), "--engine-port", str(engine_port)]

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1

    first = ParrotProcess(args, env)
    try:
        first.wait_ready(ready, "serve")
        # Traffic to the engine, so its port has had connections to close.
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 2},
            timeout=120,
        )
        assert r.status_code in (200, 404), r.text
    finally:
        if stop == "sigkill":
            first.kill()
        else:
            first.stop()
    # The engine child goes with its parent (SIGTERM on the parent's death): wait for it.
    deadline = time.monotonic() + 30
    while port_in_use(engine_port) and time.monotonic() < deadline:
        time.sleep(0.2)
    with parrot_process(args, env, ready, "restarted serve"):
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200


def test_a_held_api_port_is_refused_before_anything_is_announced(engine, tmp_path):
    """The API's port taken by another process: a clear message naming it, and neither
    "Parrot API on ..." (printed only once the socket is bound), nor an engine started, nor
    an admin token made for a server that will not run (issue 38)."""
    engine_port = free_port()
    env = {
        **os.environ,
        "PARROT_CACHE_DIR": str(engine.model_folder.parent),
        "PARROT_DATA_DIR": str(tmp_path),
    }
    env.pop("PARROT_DB", None)
    env.pop("PARROT_ADMIN_TOKEN", None)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = ParrotProcess(["serve", "--port", str(port), "--engine-port", str(engine_port)], env)
        output, _ = proc.proc.communicate(timeout=60)
    assert proc.proc.returncode != 0
    assert f"port {port} for the Parrot API is in use" in output, output
    assert "Parrot API on" not in output and "parrot engine: serving" not in output, output
    assert "admin token" not in output, output
    assert not port_in_use(engine_port)


def test_the_api_line_comes_after_the_socket_is_bound(engine, tmp_path, tiny_model):
    port, engine_port = free_port(), free_port()
    env = serve_env(engine, tmp_path, "port-test-token", model=tiny_model)
    proc = ParrotProcess(["serve", "--port", str(port), "--engine-port", str(engine_port)], env)
    try:
        deadline = time.monotonic() + 180
        line = ""
        while "Parrot API on" not in line:
            assert time.monotonic() < deadline and proc.proc.poll() is None, line
            line = proc.proc.stdout.readline()
        # Announced: the socket answers at once (503 "loading" while the engine loads).
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status_code == 200 or health.json()["status"] == "loading", health.text
    finally:
        output = proc.stop()
    # Ctrl-C says what it waits for, and the server is done only once its engine is (issue 38)
    assert "stopping its builtin engine" in output, output
    assert output.rstrip().endswith("parrot serve: stopped"), output
    assert not port_in_use(engine_port)
