"""``parrot engine`` as a real process: starts, serves the README's requests, stops on SIGINT."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
from conftest import REPO_ROOT, free_port


def readme_curl_bodies() -> list[tuple[str, dict]]:
    """The (route, JSON body) pairs of the README's curl examples."""
    text = (REPO_ROOT / "README.md").read_text()
    pairs = re.findall(r"curl -s localhost:9001(/\S+) .*?\n?\s*-d '(\{.*?\})'", text, flags=re.S)
    return [(route, json.loads(body)) for route, body in pairs]


def test_engine_command_serves_the_readme_examples(engine):
    port = free_port()
    env = {**os.environ, "PARROT_CACHE_DIR": str(engine.model_folder.parent)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "parrot.platform.cli.main",
            "engine",
            "--port",
            str(port),
            "--kv-cache-memory",
            "256MiB",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/ping", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "engine did not start"
            time.sleep(0.3)
        examples = readme_curl_bodies()
        assert [route for route, _ in examples] == ["/fill", "/generate", "/v1/chat/completions"]
        for route, body in examples:
            r = httpx.post(f"{url}{route}", json=body, timeout=120)
            assert r.status_code == 200, (route, r.text)
        assert r.json()["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.stdout.read()


def test_serve_command_starts_an_engine_and_runs_a_call(engine):
    port, engine_port = free_port(), free_port()
    env = {
        **os.environ,
        "PARROT_CACHE_DIR": str(engine.model_folder.parent),
        "PARROT_KV_CACHE_MEMORY": "256MiB",
    }
    env.pop("PARROT_ADMIN_TOKEN", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "parrot.platform.cli.main",
            "serve",
            "--port",
            str(port),
            "--engine-port",
            str(engine_port),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1:
                    break
            except (httpx.TransportError, ValueError):
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.3)
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
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    output = proc.stdout.read()
    assert "admin token (shown once)" in output
    assert proc.returncode == 0, output
