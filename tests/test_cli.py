"""``parrot engine`` and ``parrot serve`` as real processes: they start, serve, stop on SIGINT."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
from conftest import REPO_ROOT, free_port


def readme_curl_bodies() -> list[tuple[str, dict]]:
    """The (route, JSON body) pairs of the README's curl examples against the engine."""
    text = (REPO_ROOT / "README.md").read_text()
    pairs = re.findall(r"curl -s localhost:9001(/\S+) .*?\n?\s*-d '(\{.*?\})'", text, flags=re.S)
    return [(route, json.loads(body)) for route, body in pairs]


@contextmanager
def parrot_process(args: list[str], env: dict, ready: Callable[[], bool], what: str) -> Iterator[list[str]]:
    """Run ``python -m parrot.platform.cli.main ARGS`` until ``ready()``; SIGINT it afterwards.

    Yields a list that receives the process output once it has exited (checked: exit code 0).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "parrot.platform.cli.main", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if ready():
                    break
            except (httpx.TransportError, ValueError):
                pass
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.3)
        yield output
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    output.append(proc.stdout.read())
    assert proc.returncode == 0, output[0]


def test_engine_command_serves_the_readme_examples(engine):
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "PARROT_CACHE_DIR": str(engine.model_folder.parent)}
    args = ["engine", "--port", url.rsplit(":", 1)[1], "--kv-cache-memory", "256MiB"]
    with parrot_process(args, env, lambda: httpx.get(f"{url}/ping", timeout=2).status_code == 200, "engine"):
        examples = readme_curl_bodies()
        assert [route for route, _ in examples] == ["/fill", "/generate", "/v1/chat/completions"]
        for route, body in examples:
            r = httpx.post(f"{url}{route}", json=body, timeout=120)
            assert r.status_code == 200, (route, r.text)
        assert r.json()["choices"][0]["message"]["content"]


def test_serve_command_starts_an_engine_and_runs_a_call(engine):
    port, engine_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PARROT_CACHE_DIR": str(engine.model_folder.parent),
        "PARROT_KV_CACHE_MEMORY": "256MiB",
    }
    env.pop("PARROT_ADMIN_TOKEN", None)
    args = ["serve", "--port", str(port), "--engine-port", str(engine_port)]

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1

    with parrot_process(args, env, ready, "serve") as output:
        session = httpx.post(f"{url}/v1/session").json()
        auth = {"Authorization": f"Bearer {session['session_auth']}"}
        call = httpx.post(
            f"{url}/v1/semantic_call",
            headers=auth,
            json={
                "session_id": session["session_id"],
                "template": "Say hi to {{who}}: {{greeting}}",
                "parameters": [
                    {"name": "who", "value": "Ada"},
                    {"name": "greeting", "is_output": True, "sampling": {"max_tokens": 5}},
                ],
            },
        ).json()
        var = httpx.get(
            f"{url}/v1/semantic_var/{call['outputs']['greeting']}",
            params={"session_id": session["session_id"]},
            headers=auth,
            timeout=120,
        ).json()
        assert var["ready"] and var["value"]
    assert "admin token (shown once)" in output[0]
