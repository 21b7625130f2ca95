"""One real semantic call through a traced ``parrot engine`` and a traced ``parrot serve``.

The engine runs the bundled default model (exact weights: the quickest to load; the path
does not depend on the weight format). The ServeCore has no dashboard, pings its engine once
an hour and writes a throwaway SQLite file, so no background loop runs during the call.
The tracers are activated once both processes are up and the session exists; the window of
the record starts at the ServeCore's read of ``POST /v1/semantic_call``, and its terminal is
the ServeCore's write of the answer to ``GET /v1/semantic_var/{id}``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from conftest import REPO_ROOT, ParrotProcess, free_port

from tracing import causal

TEMPLATE = "The capital of France is {{answer}}"
PROCESSES = ("ServeCore", "engine")
SIGNAL_TIMEOUT_S = 60.0


class TracedProcess(ParrotProcess):
    """``parrot ARGS`` under :mod:`tracing.run_traced`, its log written to ``log``."""

    def __init__(self, log: Path, process: str, args: list[str], env: dict) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracing.run_traced", str(log), process, "--", *args],
            cwd=REPO_ROOT,
            env={**env, "PYTHONPATH": str(REPO_ROOT / "tests")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def signal_and_wait(self, signum: int, done: Path) -> None:
        """Send ``signum``; return once ``done`` exists (the tracer's answer)."""
        self.proc.send_signal(signum)
        deadline = time.monotonic() + SIGNAL_TIMEOUT_S
        while not done.exists():
            assert self.proc.poll() is None, self.proc.stdout.read()
            assert time.monotonic() < deadline, f"no {done.name} after signal {signum}"
            time.sleep(0.02)


@dataclass
class Record:
    trace: causal.Trace
    since: int  # the ServeCore's read of the POST
    terminal: causal.Handoff  # its write of the GET's answer
    value: str
    startup_s: dict[str, float]


def trace_one_call(folder: Path, model_cache_dir: Path) -> Record:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARROT_")}
    env["PARROT_CACHE_DIR"] = str(model_cache_dir)
    engine_port, port = free_port(), free_port()
    engine_url, url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{port}"
    logs = {name: folder / f"{name}.json" for name in PROCESSES}
    startup: dict[str, float] = {}
    started = time.monotonic()
    engine = TracedProcess(
        logs["engine"],
        "engine",
        ["engine", "--port", str(engine_port), "--kv-cache-memory", "128MiB", "--weights", "exact"],
        env,
    )
    serve = None
    try:
        engine.wait_ready(lambda: httpx.get(f"{engine_url}/ping", timeout=2).status_code == 200, "engine")
        startup["engine"] = time.monotonic() - started
        started = time.monotonic()
        serve_args = [
            "serve", "--port", str(port), "--engine", engine_url, "--no-dashboard",
            "--ping-interval", "3600", "--db", f"sqlite+aiosqlite:///{folder / 'parrot.db'}",
            "--data-dir", str(folder), "--admin-token", "path-tracer",
        ]  # fmt: skip
        serve = TracedProcess(logs["ServeCore"], "ServeCore", serve_args, env)
        serve.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1, "serve")
        startup["ServeCore"] = time.monotonic() - started
        value = _call(url, (engine, serve))
        for process in (engine, serve):
            process.signal_and_wait(signal.SIGUSR2, process.log)
    finally:
        for process in (serve, engine):
            if process is not None and process.proc.poll() is None:
                process.stop()
    trace = causal.load(list(logs.values()))
    engine_address = f"127.0.0.1:{engine_port}"
    since = _first_read(trace, "ServeCore", engine_address)
    return Record(trace, since, _last_write(trace, "ServeCore", engine_address, since), value, startup)


def _call(url: str, traced: tuple[TracedProcess, ...]) -> str:
    """A session, then (traced) the call and the get of its output; the value."""
    with httpx.Client(base_url=url, timeout=120) as client:
        session = client.post("/v1/session").json()
        auth = {"Authorization": f"Bearer {session['session_auth']}"}
        for process in traced:
            process.signal_and_wait(signal.SIGUSR1, process.log.with_name(process.log.name + ".active"))
        sampling = {"max_tokens": 4, "temperature": 0}
        body = {
            "session_id": session["session_id"],
            "template": TEMPLATE,
            "parameters": [{"name": "answer", "is_output": True, "sampling": sampling}],
        }
        call = client.post("/v1/semantic_call", headers=auth, json=body)
        assert call.status_code == 201, call.text
        var = client.get(
            f"/v1/semantic_var/{call.json()['outputs']['answer']}",
            params={"session_id": session["session_id"], "timeout": 60},
            headers=auth,
        )
        assert var.status_code == 200 and var.json()["ready"], var.text
        return var.json()["value"]


def _peer(connection: str) -> str:
    return connection.split(">")[1]


def _first_read(trace: causal.Trace, process: str, engine: str) -> int:
    """The time of the process's first read from a client that is not the engine."""
    reads = [t for t, unit, connection in trace.reads if unit[0] == process and _peer(connection) != engine]
    assert reads, f"the {process} read nothing from the test while traced"
    return reads[0]


def _last_write(trace: causal.Trace, process: str, engine: str, since: int) -> causal.Handoff:
    """The process's last socket write to a peer that is not the engine."""
    writes = [
        h
        for h in trace.handoffs
        if h.unit[0] == process and h.kind == "socket write" and h.time >= since
        and h.connection is not None and _peer(h.connection) != engine
    ]  # fmt: skip
    assert writes, f"the {process} wrote no answer to the test while traced"
    return writes[-1]
