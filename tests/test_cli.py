"""``parrot engine`` and ``parrot serve`` as real processes: they start, serve, stop on SIGINT."""

from __future__ import annotations

import json
import os
import re

import httpx
from conftest import REPO_ROOT, free_port, parrot_process, serve_env


def readme_curl_bodies() -> list[tuple[str, dict]]:
    """The (route, JSON body) pairs of the README's curl examples against the engine."""
    text = (REPO_ROOT / "README.md").read_text()
    pairs = re.findall(r"curl -s localhost:9001(/\S+) .*?\n?\s*-d '(\{.*?\})'", text, flags=re.S)
    return [(route, json.loads(body)) for route, body in pairs]


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


def test_serve_command_starts_an_engine_and_runs_a_call(engine, tmp_path):
    port, engine_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = serve_env(engine, tmp_path, None)
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
    assert "admin token (shown once, not stored; set a fixed one with --admin-token" in output[0]
    assert (tmp_path / "parrot.db").exists()  # the default database: SQLite in the data folder


def test_bench_command_finds_the_suite_of_its_checkout():
    """``parrot bench`` is the suite of the checkout it is installed from (a path that moved
    with the CLI once: it said 'unrecognized arguments' for every workload)."""
    import argparse

    from parrot.cli import bench_cmd

    assert bench_cmd._suite_cli() is not None
    parser = argparse.ArgumentParser()
    bench_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "single-call", "--quick", "--runs", "1", "--no-docs"])
    assert args.run is not bench_cmd._missing
