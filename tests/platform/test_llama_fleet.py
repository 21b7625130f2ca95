"""Parrot in front of real llama.cpp replicas (issue 39): the ServeCore learns each replica's
slots, routes a call to the replica that holds its prompt's prefix and spreads distinct
prefixes, and a replica that dies mid-application loses no call. Two real ``llama-server``
processes (the peer ``make bench-peers`` builds) on the bundled GGUF; skipped where the peer
is not built."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerThread, free_port

from parrot.engines.builtin.model.loader import default_model_path
from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url

LLAMA_SERVER = Path(__file__).resolve().parents[2] / ".peers" / "bin" / "llama-server"
ADMIN = {"Authorization": "Bearer admin"}
SLOTS = 2

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(
        not LLAMA_SERVER.exists(), reason="llama-server is not built here (`make bench-peers` builds it)"
    ),
]


class Replica:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(LLAMA_SERVER), "--model", str(default_model_path()), "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--threads", "1", "--parallel", str(SLOTS), "--ctx-size", "4096"]
        self.proc = subprocess.Popen(
            [*cmd, "--log-disable"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            assert self.proc.poll() is None, "llama-server exited"
            time.sleep(0.2)
        raise RuntimeError("llama-server did not start")

    def prompt_tokens(self) -> int:
        """Prompt tokens it computed (not taken from a cache) so far."""
        slots = httpx.get(f"{self.url}/slots", timeout=5).json()
        return sum(s.get("n_prompt_tokens_processed", 0) for s in slots)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def fleet(tmp_path) -> Iterator[tuple[httpx.Client, list[Replica], list[str]]]:
    replicas = [Replica(), Replica()]
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    try:
        with (
            ServerThread(create_app(core, admin_token="admin")) as server,
            httpx.Client(base_url=server.url, timeout=300) as api,
        ):
            ids = []
            for replica in replicas:
                body = {
                    "kind": "openai",
                    "base_url": f"{replica.url}/v1",
                    "model": "smol",
                    "api": "completions",
                }
                r = api.post("/v1/engines", json=body, headers=ADMIN)
                assert r.status_code == 201, r.text
                ids.append(r.json()["engine_id"])
            yield api, replicas, ids
    finally:
        for replica in replicas:
            replica.kill()


def system(name: str, words: int = 120) -> str:
    return f"You are {name}, keeper of the {name} archive. " + " ".join(f"{name}{i}" for i in range(words))


def call(api: httpx.Client, text: str, tokens: int = 4) -> dict:
    """One call in a session of its own, run to its end: its state, value and engine."""
    s = api.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    template = f"<|im_start|>system\n{text}<|im_end|>\n<|im_start|>assistant\n{{{{a}}}}"
    sampling = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    body = {
        "session_id": sid,
        "template": template,
        "parameters": [{"name": "a", "is_output": True, "sampling": sampling}],
    }
    made = api.post("/v1/semantic_call", headers=auth, json=body)
    assert made.status_code == 201, made.text
    return {"sid": sid, "auth": auth, **made.json()}


def finished(api: httpx.Client, made: dict) -> dict:
    var = api.get(
        f"/v1/semantic_var/{made['outputs']['a']}", params={"session_id": made["sid"]}, headers=made["auth"]
    )
    assert var.status_code == 200 and var.json()["value"], var.text
    info = api.get(
        f"/v1/semantic_call/{made['call_id']}", params={"session_id": made["sid"]}, headers=made["auth"]
    )
    assert info.json()["state"] == "done", info.text
    return info.json()


def test_slots_are_learned_and_calls_go_where_their_prefix_is(fleet):
    api, replicas, ids = fleet
    engines = {e["engine_id"]: e for e in api.get("/v1/engines").json()}
    assert [engines[i]["capacity"] for i in ids] == [SLOTS, SLOTS]  # from each replica's /props
    assert [engines[i]["backend"] for i in ids] == ["llama.cpp", "llama.cpp"]
    # One prompt, then another sharing its long prefix: the same replica, which computes
    # only the new part; a distinct prompt goes to the other replica.
    first = finished(api, call(api, system("Ada") + " Question one?"))
    computed = [r.prompt_tokens() for r in replicas]
    second = finished(api, call(api, system("Ada") + " Question two?"))
    third = finished(api, call(api, system("Bea") + " Question one?"))
    assert first["engine"] == second["engine"] != third["engine"]
    holder = replicas[ids.index(first["engine"])]
    assert holder.prompt_tokens() - computed[ids.index(first["engine"])] < 20  # the prefix was reused
    # Concurrent calls behind the two prompts, as many as a replica has slots: each prompt's
    # calls stay with its replica.
    made = [call(api, system(name) + f" Question {i}?") for i in range(SLOTS) for name in ("Ada", "Bea")]
    where = [finished(api, m)["engine"] for m in made]
    assert where[0::2] == [first["engine"]] * SLOTS and where[1::2] == [third["engine"]] * SLOTS, where


def test_calls_past_a_replicas_slots_wait_there_for_their_long_prefix(fleet):
    """More calls behind one long prompt than its replica has slots, the other replica busy
    with another prompt: the extra calls wait at the replica holding their prefix (the
    engine's estimate from the server's timings) instead of computing it on the other."""
    api = fleet[0]
    first = finished(api, call(api, system("Eve", words=400) + " Question one?"))  # its speed learned
    other = finished(api, call(api, system("Fay", words=400) + " Question one?"))
    assert first["engine"] != other["engine"]
    # The other replica frees first (short answers there): without the rule, the extra calls
    # would go there as soon as it does, and compute the whole prefix again.
    made = [call(api, system("Fay", words=400) + f" Question {i}?", tokens=4) for i in range(SLOTS)]
    made += [call(api, system("Eve", words=400) + f" Question {i}?", tokens=48) for i in range(SLOTS + 2)]
    where = [finished(api, m)["engine"] for m in made]
    assert where == [other["engine"]] * SLOTS + [first["engine"]] * (SLOTS + 2), where


def test_a_replica_that_dies_mid_application_loses_no_call(fleet):
    api, replicas, ids = fleet
    made = [call(api, system("Cid") + f" Question {i}?", tokens=48) for i in range(4)]
    made += [call(api, system("Dee") + f" Question {i}?", tokens=48) for i in range(4)]
    time.sleep(1.0)  # both replicas are computing
    replicas[0].kill()
    where = [finished(api, m)["engine"] for m in made]
    assert set(where) == {ids[1]}, where  # every call ran (again) on the replica left
