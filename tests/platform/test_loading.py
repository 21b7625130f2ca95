"""Issue 38 §1: ``parrot serve`` binds its port at once and says what its engine is doing
while it loads the model (a first start converts it: minutes), as llama.cpp's server
does, instead of refusing connections; a model that does not load stops it with the reason.

Real processes: ``parrot serve`` and the ``parrot engine`` it starts (the tiny model: its
load still takes seconds, the weights timed and the kernels chosen)."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from conftest import ParrotProcess, free_port

pytestmark = pytest.mark.spawns  # child processes


def serve(tmp_path, model) -> tuple[ParrotProcess, str, str]:
    port, engine_port = free_port(), free_port()
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin", "PARROT_DATA_DIR": str(tmp_path)}
    env |= {"PARROT_MODEL": str(model), "PARROT_KV_CACHE_MEMORY": "64MiB"}
    process = ParrotProcess(["serve", "--port", str(port), "--engine-port", str(engine_port)], env)
    return process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}"


def look(url: str) -> tuple[int, dict] | None:
    try:
        answer = httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None  # not bound yet
    return answer.status_code, answer.json()


def test_healthz_answers_loading_with_the_stage_before_ok(tmp_path, tiny_model):
    process, url, engine_url = serve(tmp_path, tiny_model)
    health: list[tuple[int, dict]] = []  # the ServeCore's answers, in order
    engine_health: list[tuple[int, dict]] = []
    chats: list[tuple[int, dict]] = []  # chat completions sent while it said "loading"
    deadline = time.monotonic() + 240
    try:
        while not health or health[-1][0] != 200:
            assert process.proc.poll() is None, process.proc.stdout.read()
            assert time.monotonic() < deadline, health[-3:]
            if (answer := look(f"{url}/healthz")) is not None:
                health.append(answer)
            if (answer := look(f"{engine_url}/healthz")) is not None:
                engine_health.append(answer)
            if health and health[-1][0] == 503:
                chat = httpx.post(
                    f"{url}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "Are you up yet?"}], "max_tokens": 2},
                    timeout=60,
                )
                chats.append((chat.status_code, chat.json()))
            time.sleep(0.05)
        loading = [body for status, body in health if status == 503]
        assert loading, "never saw the server loading"
        assert all(body["status"] == "loading" and body["stage"] for body in loading), loading
        # Past the engine's start, the stages are its own, named with their seconds so far.
        stages = {body["stage"] for body in loading}
        own = ("finding the model", "loading the tokenizer", "loading the weights", "allocating", "preparing")
        assert any(stage.startswith(own) and stage.endswith(" s)") for stage in stages), stages
        assert health[-1][1]["status"] == "ok" and health[-1][1]["engines_up"] == 1
        # The engine's own /healthz: 503 "loading" with the stage, then ok.
        assert any(s == 503 and b["status"] == "loading" and b["stage"] for s, b in engine_health)
        assert look(f"{engine_url}/healthz") == (200, {"status": "ok", "stage": None})
        # A request while it loads gets a 503 that says so (one may land after the load).
        refused = [body for status, body in chats if status != 200]
        assert refused, chats
        for body in refused:
            assert body["error"]["code"] == "engine_loading", body
            assert "loading its model" in body["error"]["message"], body
        answered = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "And now?"}], "max_tokens": 2},
            timeout=60,
        )
        assert answered.status_code == 200, answered.text
    finally:
        output = process.stop()
    assert "loading: loading the weights and timing the CPU's kernels took" in output, output
    assert "serving " in output and "(loaded in " in output, output


def test_a_model_that_does_not_load_stops_serve_with_the_reason(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    process, url, _ = serve(tmp_path, missing)
    output, _ = process.proc.communicate(timeout=120)
    assert process.proc.returncode == 1, output
    assert f"the model did not load: model {str(missing)!r} does not exist" in output, output
    assert "the builtin engine exited with code 1; stopping" in output, output
    assert output.rstrip().endswith("parrot serve: stopped"), output
    assert look(f"{url}/healthz") is None  # its port is free again
