"""Event-loop stalls at full size (issue 14.1): how long ``/healthz`` (the ServeCore) and
``/ping`` (the engine) take to answer while one request does heavy CPU work.

Starts a ``parrot engine`` and a ``parrot serve`` on it (own processes, 127.0.0.1), then,
one at a time, sends each workload while a probe GETs the health route back to back, and
prints a table of the probe latencies (p50, p99, max) and of the ServeCore's memory before,
right after and 10 s after. The quick sizes are ``tests/platform/test_event_loop.py``; the
figures are in ``docs/reliability.md``.

    .venv/bin/python benchmarks/loop_stalls.py [--prompt-mib 4] [--inputs 256]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import httpx
from _servers import free_port, launched, parrot_command

CATASTROPHIC = r"(a|aa)+$"  # on "a" * 60 + "b": exponential backtracking in the regex module
SLOW_MATCH = r"(a|aa)+$|b"  # the same backtracking, then a match: each value takes long, not forever


def slow_value(seconds: float = 0.2) -> str:
    """A value on which SLOW_MATCH takes about ``seconds`` here (under the 0.5 s each value
    had before the budget: 256 of them held the event loop for about a minute)."""
    import regex

    pattern = regex.compile(SLOW_MATCH)
    for n in range(10, 60):
        started = time.monotonic()
        pattern.search("a" * n + "b")
        if time.monotonic() - started > seconds:
            return "a" * n + "b"
    raise RuntimeError("no slow value found")


@contextlib.contextmanager
def process(args: list[str], ready: Callable[[str], bool], port: int, env: dict) -> Iterator[tuple[str, int]]:
    url = f"http://127.0.0.1:{port}"
    with launched(parrot_command(*args, "--port", str(port)), lambda: ready(url), args[0], env=env) as proc:
        yield url, proc.pid


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def probed(send: Callable[[], httpx.Response], probe_url: str) -> tuple[httpx.Response, list[float], float]:
    """Run ``send`` in a thread; GET ``probe_url`` back to back until it is done."""
    answer: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answer.append(send()))
    started = time.monotonic()
    thread.start()
    latencies = []
    with httpx.Client(timeout=120) as client:
        while thread.is_alive():
            t = time.monotonic()
            client.get(probe_url)
            latencies.append(time.monotonic() - t)
            time.sleep(0.01)
    thread.join()
    return answer[0], latencies, time.monotonic() - started


def row(name: str, answer: httpx.Response, latencies: list[float], took: float, memory: str = "") -> str:
    ordered = sorted(latencies) or [0.0]

    def q(p: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return (
        f"| {name} | {answer.status_code} | {took:.1f} | {len(latencies)} | {q(0.5):.0f} | {q(0.99):.0f} | "
        f"{1000 * ordered[-1]:.0f} | {memory} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-mib", type=float, default=4.0)
    parser.add_argument("--inputs", type=int, default=256, help="values of the catastrophic-regex transform")
    args = parser.parse_args()
    chars = int(args.prompt_mib * 2**20)
    prompt = " ".join(f"word{n % 997}" for n in range(chars // 8))[:chars]
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "bench"}
    rows = []
    engine_port, serve_port = free_port(), free_port()
    with (
        tempfile.TemporaryDirectory() as data,
        process(
            ["engine"], lambda u: httpx.get(f"{u}/ping", timeout=2).status_code == 200, engine_port, env
        ) as (engine, _),
        process(
            ["serve", "--engine", engine, "--data-dir", data, "--no-dashboard"],
            lambda u: httpx.get(f"{u}/healthz", timeout=2).json()["engines_up"] == 1,
            serve_port,
            env,
        ) as (serve, serve_pid),
    ):
        s = httpx.post(f"{serve}/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        slow = slow_value()
        for name, pattern, value in (
            ("catastrophic regex", CATASTROPHIC, "a" * 60 + "b"),
            ("slow regex (0.2 s a value)", SLOW_MATCH, slow),
        ):
            body = {
                "session_id": sid,
                "inputs": [{"value": value}] * args.inputs,
                "steps": [{"type": "regex", "pattern": pattern}, {"type": "join"}],
            }

            def transform(body=body) -> httpx.Response:
                call = httpx.post(
                    f"{serve}/v1/semantic_transform", json=body, headers=auth, timeout=600
                ).json()
                params = {"session_id": sid, "timeout": 600}
                var = call["outputs"]["result"]
                return httpx.get(f"{serve}/v1/semantic_var/{var}", params=params, headers=auth, timeout=600)

            answer, latencies, took = probed(transform, f"{serve}/healthz")
            rows.append(row(f"{args.inputs}-input {name} transform -> /healthz", answer, latencies, took))
        completion = {"prompt": prompt, "max_tokens": 1}
        before = rss_mib(serve_pid)
        answer, latencies, took = probed(
            lambda: httpx.post(f"{serve}/v1/completions", json=completion, timeout=300), f"{serve}/healthz"
        )
        after = rss_mib(serve_pid)
        time.sleep(10)
        memory = f"{before:.0f} / {after:.0f} / {rss_mib(serve_pid):.0f}"
        rows.append(
            row(
                f"{args.prompt_mib:g} MiB prompt, ServeCore /v1/completions -> /healthz",
                answer,
                latencies,
                took,
                memory,
            )
        )
        chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
        for route, payload in (
            ("/v1/completions", completion),
            ("/v1/chat/completions", chat),
            ("/tokenize", {"text": prompt}),
        ):
            answer, latencies, took = probed(
                lambda r=route, p=payload: httpx.post(f"{engine}{r}", json=p, timeout=300), f"{engine}/ping"
            )
            rows.append(
                row(f"{args.prompt_mib:g} MiB prompt, engine {route} -> /ping", answer, latencies, took)
            )
    memory = "ServeCore MiB before / after / +10 s"
    print(f"| workload -> probed route | status | s | probes | p50 ms | p99 ms | max ms | {memory} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
