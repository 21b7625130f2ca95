"""OpenAI-compatible servers for the benchmarks: a ``parrot engine`` and llama.cpp's server.

Each runs as its own process on 127.0.0.1 and is stopped when its ``with`` block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# llama.cpp's own server, built from source by `make bench-peers`
LLAMA_SERVER = ROOT / ".peers" / "bin" / "llama-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched(
    cmd: list[str],
    ready: Callable[[], bool],
    what: str,
    timeout_s: float = 300,
    env: dict | None = None,
    stop: int = signal.SIGTERM,
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` until the ``with`` block ends, once ``ready()`` says it serves (its
    HTTP errors and odd answers count as not yet); ``stop`` is the signal that ends it
    (SIGINT lets ``parrot serve`` stop the engine it started)."""
    # Its log goes to a file: a pipe nobody reads fills up and blocks the server.
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{what} exited: {log.read()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not start within {timeout_s:.0f} s")
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    if ready():
                        break
                time.sleep(0.5)
            yield proc
        finally:
            proc.send_signal(stop)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def parrot_command(*args: str) -> list[str]:
    """``parrot ARGS`` with this interpreter (a fresh process of the same venv)."""
    return [sys.executable, "-m", "parrot.cli.main", *args]


@contextlib.contextmanager
def serving(
    cmd: list[str], port: int, what: str, timeout_s: float = 300, env: dict | None = None
) -> Iterator[str]:
    """An OpenAI-compatible server: ready once it lists its models."""
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        return httpx.get(f"{url}/v1/models", timeout=2).status_code == 200

    with launched(cmd, ready, what, timeout_s, env):
        yield url


def parrot_server(dtype: str, weights: str, threads: int, *flags: str, env: dict | None = None):
    """``parrot engine`` (``env``: its whole environment, e.g. a lowered instruction set)."""
    port = free_port()
    parrot = str(Path(sys.executable).with_name("parrot"))
    cmd = [parrot, "engine", "--port", str(port), "--dtype", dtype, "--weights", weights]
    cmd += ["--threads", str(threads), "--max-running", "64", "--max-batched-tokens", "2048", *flags]
    return serving(cmd, port, f"parrot engine ({dtype}/{weights}{''.join(' ' + f for f in flags)})", env=env)


def llama_server(gguf: str, threads: int, slots: int = 16, slot_ctx: int = 512, binary: Path = LLAMA_SERVER):
    """llama.cpp's ``llama-server`` with ``slots`` parallel sequences of ``slot_ctx`` tokens
    each, continuously batched."""
    port = free_port()
    cmd = [str(binary), "--model", gguf, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(slots)]
    cmd += ["--ctx-size", str(slot_ctx * slots), "--cont-batching", "--log-disable"]
    return serving(cmd, port, "llama.cpp server")


def completions_throughput(
    url: str,
    model: str | None,
    prompts: list[str],
    batches: list[int],
    max_tokens: int,
    repeats: int,
    extra: dict,
) -> dict[int, float]:
    """Per batch size: completion tokens/s of that many concurrent requests, best of ``repeats``."""

    async def run() -> dict[int, float]:
        limits = httpx.Limits(max_connections=max(batches) + 4)
        async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:

            async def one(prompt: str, tokens: int) -> int:
                body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, **extra}
                if model:
                    body["model"] = model
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()
                return r.json()["usage"]["completion_tokens"]

            await one(prompts[0], 8)  # warm-up
            result = {}
            for batch in batches:
                best = 0.0
                for _ in range(repeats):
                    start = time.perf_counter()
                    counts = await asyncio.gather(*(one(p, max_tokens) for p in prompts[:batch]))
                    best = max(best, sum(counts) / (time.perf_counter() - start))
                result[batch] = best
            return result

    return asyncio.run(run())
