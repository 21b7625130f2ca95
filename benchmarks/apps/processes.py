"""The servers of a benchmark, each a process of its own on a free loopback port, as
deployed: ``parrot engine`` processes and ``parrot serve`` ServeCores that register them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks._servers import LLAMA_SERVER
from parrot.engines.builtin.model.loader import default_model_path

ADMIN_TOKEN = "bench"
START_TIMEOUT_S = 600.0  # a first engine start converts the model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """One ``parrot ...`` process and its URL; its output goes to ``log``."""

    name: str
    proc: subprocess.Popen
    url: str
    log: Path

    def wait_ready(self, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.tail()}")
            try:
                if ready():
                    return
            except (httpx.TransportError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start in {START_TIMEOUT_S:.0f} s:\n{self.tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def cpu_seconds(self) -> float:
        """CPU time the process has used so far (user + system; Linux ``/proc``), 0 where
        that cannot be read."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Stack:
    """Engines and ServeCores started for a benchmark; all stopped (SIGINT) on ``close``.

    ``workdir`` holds their logs and the ServeCores' SQLite files.
    """

    def __init__(self, workdir: Path, log_level: str = "warning") -> None:
        workdir.mkdir(parents=True, exist_ok=True)  # --logs may name a folder not made yet
        self.workdir = workdir
        self.log_level = log_level
        self.databases = 0
        self.servers: list[Server] = []

    def _start(self, name: str, args: Sequence[str], program: Sequence[str] | None = None) -> Server:
        """``parrot ARGS`` (or ``program ARGS``) on a free port."""
        port = free_port()
        log = self.workdir / f"{name}.log"
        env = {**os.environ, "PARROT_ADMIN_TOKEN": ADMIN_TOKEN, "PARROT_DATA_DIR": str(self.workdir)}
        parrot = [sys.executable, "-m", "parrot.cli.main", "--log-level", self.log_level]
        cmd = [*(program or parrot), *args]
        with log.open("w") as out:
            proc = subprocess.Popen(
                [*cmd, "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        server = Server(name, proc, f"http://127.0.0.1:{port}", log)
        self.servers.append(server)
        return server

    def engines(self, count: int, flags: Sequence[str]) -> list[str]:
        """``count`` builtin engines (``parrot engine FLAGS``), started together."""
        started = [self._start(f"engine{n}", ["engine", *flags]) for n in range(count)]
        for server in started:
            server.wait_ready(lambda s=server: httpx.get(f"{s.url}/ping", timeout=5).status_code == 200)
        return [s.url for s in started]

    def replicas(self, count: int, slots: int, slot_ctx: int) -> list[str]:
        """``count`` llama.cpp servers (the peer ``make bench-peers`` builds) on the bundled
        GGUF, one thread and ``slots`` parallel slots of ``slot_ctx`` tokens each, with
        their ``/metrics`` (the token counters of a run)."""
        if not LLAMA_SERVER.exists():
            raise SystemExit(f"--fleet needs llama-server at {LLAMA_SERVER}: run `make bench-peers`")
        args = ["--model", str(default_model_path()), "--host", "127.0.0.1", "--threads", "1"]
        args += ["--threads-batch", "1", "--parallel", str(slots), "--ctx-size", str(slots * slot_ctx)]
        args += ["--metrics", "--cont-batching"]
        started = [self._start(f"llama{n}", args, program=[str(LLAMA_SERVER)]) for n in range(count)]
        for server in started:
            server.wait_ready(lambda s=server: httpx.get(f"{s.url}/health", timeout=5).status_code == 200)
        return [s.url for s in started]

    def serves(
        self,
        engine_urls: Sequence[str],
        variants: dict[str, Sequence[str]],
        capacity: int | None = None,
        openai: bool = False,
    ) -> dict[str, str]:
        """A ServeCore per variant (``parrot serve --engine URL ... FLAGS``), all started
        together, each with its own database; their URLs by variant name. With
        ``capacity``, the engines are registered with that many tasks at once instead
        (``POST /v1/engines``; ``--engine`` registers them with the server's default).
        ``openai``: the engines are OpenAI-compatible servers (llama.cpp replicas),
        registered as ``openai`` engines of the completions API (their capacity learned)."""
        if openai:
            return self._serves_openai(engine_urls, variants, capacity)
        started = {}
        for name, flags in variants.items():
            file = "".join(c if c.isalnum() else "-" for c in name)
            # A database of its own: a ServeCore restores the engines an earlier one registered.
            self.databases += 1
            db = self.workdir / f"{file}-{self.databases}.db"
            args = ["serve", "--db", f"sqlite+aiosqlite:///{db}", *flags]
            if capacity is None:
                for url in engine_urls:
                    args += ["--engine", url]
            else:
                args.append("--no-engine")
            started[name] = self._start(f"serve-{file}", args)
        for server in started.values():
            server.wait_ready(lambda s=server: httpx.get(f"{s.url}/healthz", timeout=5).status_code == 200)
            if capacity is not None:
                auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                for url in engine_urls:
                    body = {"url": url, "capacity": capacity}
                    httpx.post(
                        f"{server.url}/v1/engines", json=body, headers=auth, timeout=60
                    ).raise_for_status()

            def ready(s: Server = server) -> bool:
                return httpx.get(f"{s.url}/healthz", timeout=5).json().get("engines") == len(engine_urls)

            server.wait_ready(ready)
        return {name: server.url for name, server in started.items()}

    def _serves_openai(
        self, engine_urls: Sequence[str], variants: dict[str, Sequence[str]], capacity: int | None
    ) -> dict[str, str]:
        started = {}
        for name, flags in variants.items():
            self.databases += 1
            db = self.workdir / f"fleet-{self.databases}.db"
            args = ["serve", "--db", f"sqlite+aiosqlite:///{db}", "--no-engine", *flags]
            started[name] = self._start(f"serve-{self.databases}", args)
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for server in started.values():
            server.wait_ready(lambda s=server: httpx.get(f"{s.url}/healthz", timeout=5).status_code == 200)
            for url in engine_urls:
                body = {"kind": "openai", "base_url": f"{url}/v1", "model": "smol", "api": "completions"}
                if capacity is not None:
                    body["capacity"] = capacity
                httpx.post(f"{server.url}/v1/engines", json=body, headers=auth, timeout=60).raise_for_status()
        return {name: server.url for name, server in started.items()}

    def stop(self, urls: Sequence[str]) -> None:
        """Stop the servers at these URLs (the others keep running)."""
        for server in [s for s in self.servers if s.url in urls]:
            server.stop()
            self.servers.remove(server)

    def cpu_seconds(self, command: str) -> float:
        """CPU time used so far by the running servers of ``command`` (engine, serve)."""
        return sum(s.cpu_seconds() for s in self.servers if s.name.startswith(command))

    def close(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
