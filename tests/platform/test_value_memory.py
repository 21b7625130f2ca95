"""The memory of values is given back: after a session holding ~200 MiB of values is
deleted, the ServeCore process shrinks again (before: it kept all of it, for good)."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from conftest import ParrotProcess, free_port, rss_mib

from parrot.platform.serve.ops.memory import malloc_trim

pytestmark = pytest.mark.spawns  # child processes

VALUE_CHARS = 8 * 2**20  # the default --max-value-chars
VALUES = 25  # 200 MiB in all


@pytest.mark.skipif(malloc_trim() is None, reason="glibc's malloc_trim is what gives memory back")
def test_deleting_a_session_gives_the_memory_of_its_values_back(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin"}
    args = ["serve", "--port", str(port), "--no-engine", "--no-dashboard", "--data-dir", str(tmp_path)]
    process = ParrotProcess(args, env)
    try:
        process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, "serve")
        with httpx.Client(base_url=url, timeout=120) as api:
            r = api.post("/v1/session")
            sid, auth = r.json()["session_id"], {"Authorization": f"Bearer {r.json()['session_auth']}"}
            before = rss_mib(process.proc.pid)
            for n in range(VALUES):
                value = chr(ord("a") + n % 26) * VALUE_CHARS
                r = api.post(
                    "/v1/semantic_var",
                    headers=auth,
                    json={"session_id": sid, "name": f"v{n}", "value": value},
                )
                assert r.status_code == 201, r.text[:300]
            held = rss_mib(process.proc.pid) - before
            assert held >= 150, f"the values took only {held:.0f} MiB: the test measures nothing"
            assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204
            deadline = time.monotonic() + 20
            while (kept := rss_mib(process.proc.pid) - before) > 60 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert kept <= 60, f"the ServeCore kept {kept:.0f} of {held:.0f} MiB after the session went"
    finally:
        process.kill()
