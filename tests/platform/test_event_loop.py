"""Issue 14.1: no request stalls the event loop. CPU work (a transform's regexes, tokenizing
a big prompt, a chat template) runs off the loop, a transform within one time budget for
all its values; ``/healthz`` (the ServeCore) and ``/ping`` (the engine) keep answering in
well under a second meanwhile. Measured over real HTTP against real processes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import httpx
import pytest
from conftest import ParrotProcess, free_port, rss_mib
from httpx_sse import aconnect_sse, connect_sse

from parrot.platform.serve.ops.memory import malloc_trim

pytestmark = pytest.mark.spawns  # child processes

CATASTROPHIC = r"(a|aa)+$"  # on "a" * 60 + "b": exponential backtracking
STALL_S = 0.3  # p99 allowed: "well under a second" (measured: 7-60 ms; before the fix 0.5-2.8 s)
ATTEMPTS = 3  # a big request's probes are measured again when one attempt stalls (probed_p99)


@contextmanager
def servecore(tmp_path, **env: str) -> Iterator[str]:
    """``parrot serve`` without an engine (transforms need none), as a child process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin", **env}
    args = ["serve", "--port", str(port), "--no-engine", "--data-dir", str(tmp_path), "--no-dashboard"]
    process = ParrotProcess(args, env)
    try:
        process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, "serve")
        yield url
    finally:
        process.kill()


def ms(seconds: list[float]) -> str:
    return ", ".join(f"{s * 1000:.0f} ms" for s in seconds)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probe(url: str, busy: Callable[[], bool], at_most_s: float) -> list[float]:
    """Latencies of GET ``url``, one after another, while ``busy()`` (and at most
    ``at_most_s``); a probe that gets no answer within 5 s counts as 5 s."""
    latencies = []
    deadline = time.monotonic() + at_most_s
    with httpx.Client(timeout=5) as client:
        while busy() and time.monotonic() < deadline:
            started = time.monotonic()
            with suppress(httpx.TimeoutException):
                assert client.get(url).status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.01)
    return latencies


def test_healthz_answers_while_a_64_input_catastrophic_regex_transform_runs(tmp_path):
    """Before: each of the 64 values had its own 0.5 s regex timeout, run one after another
    on the event loop (32 s without an answer). Now the transform runs in a worker thread
    (the regex search releases the GIL) and fails when its one budget is spent. Measured
    again, up to ``ATTEMPTS`` times, while the probes' p99 is over ``STALL_S``: a stall by
    the transform repeats, a hiccup of the host does not (CI once saw one 800 ms probe of 71)."""
    budget = 1.5
    with (
        servecore(tmp_path, PARROT_TRANSFORM_BUDGET=str(budget)) as url,
        httpx.Client(base_url=url, timeout=60) as api,
    ):
        s = api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        body = {
            "session_id": sid,
            "inputs": [{"value": "a" * 60 + "b"}] * 64,
            "steps": [{"type": "regex", "pattern": CATASTROPHIC}, {"type": "join"}],
            "output": "matched",
        }
        p99s = []
        while len(p99s) < ATTEMPTS and not (p99s and p99s[-1] < STALL_S):
            started = time.monotonic()
            call = api.post("/v1/semantic_transform", json=body, headers=auth)
            assert call.status_code == 201, call.text
            call_id, state = call.json()["call_id"], {}

            def running(call_id: str = call_id, state: dict = state) -> bool:
                answer = api.get(f"/v1/semantic_call/{call_id}", params={"session_id": sid}, headers=auth)
                state.update(answer.json())
                return state["state"] != "failed"

            latencies = probe(f"{url}/healthz", running, at_most_s=budget + 5)
            took = time.monotonic() - started
            assert state["state"] == "failed" and "time budget of 1.5 s" in state["error"], state
            assert took < budget + 3, f"the transform took {took:.1f} s: not one budget for all its values"
            assert len(latencies) >= 10, latencies
            p99s.append(percentile(latencies, 0.99))
        assert p99s[-1] < STALL_S, f"/healthz p99 {ms(p99s)} during the transform"
        var = api.get(
            f"/v1/semantic_var/{call.json()['outputs']['matched']}", params={"session_id": sid}, headers=auth
        )
        assert var.status_code == 424 and "time budget" in var.json()["error"]["message"], var.text


BIG_PROMPT_CHARS = 2 * 2**20  # 2 MiB (the 4 MiB: scripts/... see docs/reliability.md)


def probe_while(url: str, work: Callable[[], None], done: threading.Event) -> list[float]:
    """Latencies of GET ``url`` (:func:`probe`) while ``work()`` runs in a thread; ``done``
    is set when it ends (others may wait on it too)."""

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    worker = threading.Thread(target=run)
    worker.start()
    latencies = probe(url, lambda: not done.is_set(), 120)
    worker.join()
    return latencies


def follow_live_page(url: str, path: str, done: threading.Event, events: list[int]) -> None:
    """A dashboard tab on a live page: read its events until ``done`` (each one counted; the
    page ends its stream when the session goes)."""
    tab = httpx.Client(base_url=url, timeout=None)
    with suppress(httpx.HTTPError), tab, connect_sse(tab, "GET", path) as source:
        for _ in source.iter_sse():
            events.append(1)
            if done.is_set():
                return


def run_and_delete(client: httpx.Client, calls: int) -> float:
    """A session of ``calls`` one-token calls (batches of 100), run, then deleted: the delete's
    seconds."""
    sid = client.headers["x-session"]
    one = {"name": "a", "is_output": True, "sampling": {"max_tokens": 1}}
    for k in range(0, calls, 100):
        batch = [{"template": f"Q{k + i}: {{{{a}}}}", "parameters": [one]} for i in range(100)]
        r = client.post("/v1/semantic_calls", json={"session_id": sid, "calls": batch})
        assert r.status_code == 201, r.text

    def finished() -> int:
        return sum(c["state"] == "done" for c in client.get(f"/v1/session/{sid}").json()["calls"])

    while finished() < calls:
        time.sleep(0.2)
    started = time.monotonic()
    assert client.delete(f"/v1/session/{sid}").status_code == 204
    return time.monotonic() - started


def test_a_session_of_3000_calls_with_two_live_tabs_does_not_stall_the_server(tmp_path):
    """Issue 37 (5): a session of 3,000 one-token calls held ``/healthz`` at a p99 of 0.6-2.7 s
    while they ran (4.3-5.5 s with two dashboard tabs live on it), and its delete took 14.5 s.
    Here the same 3,000 calls, in batches of 100, on the fake engine (a process of its own), two tabs
    following the session's live page, then the delete: ``/healthz`` keeps answering
    (measured: p99 46 ms, max 0.25 s at 3,000 calls; the delete 0.12 s)."""
    from fake_engine.process import FakeEngineProcess

    engine = FakeEngineProcess(step_s=0.001)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--engine", engine.url, "--data-dir", str(tmp_path)]
    process = ParrotProcess(args, {**os.environ, "PARROT_ADMIN_TOKEN": "admin"})
    try:
        process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, "serve")
        body = httpx.post(f"{url}/v1/session").json()
        headers = {"Authorization": f"Bearer {body['session_auth']}", "x-session": body["session_id"]}
        done, tabs, took = threading.Event(), [[], []], []
        for events in tabs:
            path = f"/live/sessions/{body['session_id']}"
            threading.Thread(target=follow_live_page, args=(url, path, done, events), daemon=True).start()

        def work() -> None:
            with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
                took.append(run_and_delete(client, 3000))

        latencies = probe_while(f"{url}/healthz", work, done)
        assert took and all(tabs), (took, [len(t) for t in tabs])  # the tabs were live, the delete ran
        assert percentile(latencies, 0.99) < STALL_S, ms(sorted(latencies)[-5:])
        assert took[0] < 2.0, f"the delete took {took[0]:.2f} s (was 14.5 s at 3,000 calls)"
    finally:
        process.kill()
        engine.kill()


def test_a_burst_of_500_variable_streams_does_not_stall_the_server(tmp_path):
    """Issue 37 (9): ``/healthz`` took 5.5 s once during a burst of 500 stream connections.
    500 followers of variables of 5 sessions open at once (what the per-session and
    per-client caps refuse is a 429), then every variable set: each accepted stream gets
    its value, and ``/healthz`` keeps answering (measured: p99 14 ms, max 0.17 s). Measured
    again, up to ``ATTEMPTS`` bursts, while the p99 is over ``STALL_S``: a stall by the
    burst repeats, a hiccup of the host does not (CI once saw one 1,085 ms probe of ~50)."""
    from fake_engine.process import FakeEngineProcess

    engine = FakeEngineProcess()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Warnings only: the access log's line per request (500 streams, their refusals and the
    # probes) filled the pipe this test keeps the server's output in, unread until the end,
    # and the server then waited on writing to it (the PUTs timed out after 60 s, under load).
    args = ["--log-level", "warning", "serve", "--port", str(port), "--engine", engine.url]
    args += ["--data-dir", str(tmp_path), "--no-dashboard"]
    process = ParrotProcess(args, {**os.environ, "PARROT_ADMIN_TOKEN": "admin"})
    try:
        process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, "serve")
        p99s: list[float] = []
        while len(p99s) < ATTEMPTS and not (p99s and p99s[-1] < STALL_S):
            outcome: list = []

            def burst(outcome: list = outcome) -> None:
                outcome.extend(asyncio.run(follow_all(url, streams=500, sessions=5)))

            latencies = probe_while(f"{url}/healthz", burst, threading.Event())
            kinds = sorted(set(map(str, outcome)))
            assert outcome.count("value") >= 256 and set(outcome) <= {"value", 429}, kinds
            p99s.append(percentile(latencies, 0.99))
        assert p99s[-1] < STALL_S, ms(p99s)
    finally:
        process.kill()
        engine.kill()


async def follow_all(url: str, streams: int, sessions: int) -> list:
    """``streams`` followers of one variable in each of ``sessions`` sessions, opened at
    once; each variable set a moment later. Per follower: "value" (its stream ended with
    the value) or the status it was refused with."""
    limits = httpx.Limits(max_connections=streams + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        owned = []
        for _ in range(sessions):
            body = (await client.post("/v1/session")).json()
            auth = {"Authorization": f"Bearer {body['session_auth']}"}
            created = {"session_id": body["session_id"], "name": "v"}
            var = (await client.post("/v1/semantic_var", json=created, headers=auth)).json()["var_id"]
            owned.append((body["session_id"], var, auth))

        async def follow(n: int) -> object:
            sid, var, auth = owned[n % sessions]
            path = f"/v1/semantic_var/{var}/stream?session_id={sid}"
            async with aconnect_sse(client, "GET", path, headers=auth) as source:
                if source.response.status_code != 200:
                    return source.response.status_code
                async for event in source.aiter_sse():
                    if event.event == "value":
                        return "value"
            return "no value"

        followers = [asyncio.create_task(follow(n)) for n in range(streams)]
        await asyncio.sleep(2)  # all connected (or refused)
        for sid, var, auth in owned:
            body = {"session_id": sid, "value": "done"}
            r = await client.put(f"/v1/semantic_var/{var}", json=body, headers=auth)
            assert r.status_code == 200, r.text
        return await asyncio.gather(*followers)


def big_prompt() -> str:
    # Words, as in a real document: ~4 characters a token for the default model.
    return " ".join(f"word{n % 997}" for n in range(BIG_PROMPT_CHARS // 8))[:BIG_PROMPT_CHARS]


def while_posting(url: str, body: dict, probe_url: str) -> tuple[httpx.Response, list[float]]:
    """POST ``body`` to ``url`` in a thread; probe ``probe_url`` until the answer comes."""
    answer: list[httpx.Response] = []

    def post() -> None:
        answer.append(httpx.post(url, json=body, timeout=300))

    thread = threading.Thread(target=post)
    thread.start()
    try:
        latencies = probe(probe_url, thread.is_alive, at_most_s=300)
    finally:
        thread.join()
    return answer[0], latencies


def probed_p99(url: str, body: dict, probe_url: str, check: Callable[[httpx.Response], None]) -> list[float]:
    """Post ``body`` while probing, up to ``ATTEMPTS`` times, until the probes' p99 is under
    ``STALL_S``; the p99 of each attempt (the last is under ``STALL_S`` if any was). A stall of the loop
    by the request's own work repeats on every attempt; a hiccup of the host does not (CI
    once saw a single 900 ms probe among ~100 where every other run measured 7-60 ms)."""
    p99s: list[float] = []
    while len(p99s) < ATTEMPTS and not (p99s and p99s[-1] < STALL_S):
        answer, latencies = while_posting(url, body, probe_url)
        check(answer)
        p99s.append(percentile(latencies, 0.99))
    return p99s


def test_healthz_answers_while_the_openai_front_tokenizes_a_big_prompt(parrot_url):
    """The unauthenticated ``/v1/completions`` of the ServeCore tokenizes the prompt itself."""
    body = {"prompt": big_prompt(), "max_tokens": 1}

    def refused(answer: httpx.Response) -> None:
        # (the front answers the engine's refusal as the one-shot call's failure: 424)
        assert answer.status_code in (400, 424) and "context length" in answer.text, answer.text

    p99s = probed_p99(f"{parrot_url}/v1/completions", body, f"{parrot_url}/healthz", refused)
    assert p99s[-1] < STALL_S, f"/healthz p99 {ms(p99s)} while a big prompt was tokenized"


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_the_engine_answers_pings_while_it_tokenizes_a_big_prompt(engine_server, route):
    """The builtin engine's own routes tokenized (and rendered chat templates) on its loop."""
    text = big_prompt()
    body = {
        "/v1/completions": {"prompt": text, "max_tokens": 1},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": text}], "max_tokens": 1},
        "/tokenize": {"text": text},
    }[route]
    url = engine_server.url

    def answered(answer: httpx.Response) -> None:
        if route == "/tokenize":
            assert answer.status_code == 200 and len(answer.json()["token_ids"]) > 100_000
        else:
            code = answer.json()["error"]["code"]
            assert answer.status_code == 400 and code == "prompt_too_long", answer.text

    p99s = probed_p99(f"{url}{route}", body, f"{url}/ping", answered)
    assert p99s[-1] < STALL_S, f"/ping p99 {ms(p99s)} while {route} tokenized"


@pytest.mark.skipif(malloc_trim() is None, reason="glibc's malloc_trim is what gives memory back")
def test_the_memory_of_a_big_prompt_is_given_back(engine_server, tmp_path):
    """Before: the ServeCore kept ~400 MB more after one 2 MiB prompt, for good (glibc's
    malloc keeps what the prompt's objects freed). Now it trims after big prompts."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin"}
    args = ["serve", "--port", str(port), "--engine", engine_server.url, "--data-dir", str(tmp_path)]
    process = ParrotProcess([*args, "--no-dashboard"], env)
    try:
        process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).json()["engines_up"] == 1, "serve")
        small = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=120)
        assert small.status_code == 200, small.text
        before = rss_mib(process.proc.pid)
        big = httpx.post(f"{url}/v1/completions", json={"prompt": big_prompt(), "max_tokens": 1}, timeout=300)
        assert big.status_code in (400, 424), big.text
        deadline = time.monotonic() + 15
        while (grown := rss_mib(process.proc.pid) - before) > 100 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert grown <= 100, f"the ServeCore kept {grown:.0f} MiB after a big prompt (from {before:.0f} MiB)"
    finally:
        process.kill()


def test_transform_limits_come_from_flags_and_variables():
    import argparse

    from parrot.cli.settings import ServeSettings, add_serve_arguments

    def settings(argv: list[str], env: dict[str, str]) -> ServeSettings:
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser, env)
        return ServeSettings.from_args(parser.parse_args(argv))

    default = settings([], {}).transforms
    assert (default.budget_s, default.workers) == (2.0, 2)
    env = {"PARROT_TRANSFORM_BUDGET": "0.5", "PARROT_TRANSFORM_WORKERS": "4"}
    assert settings([], env).transforms.budget_s == 0.5
    assert settings(["--transform-budget", "3"], env).transforms.budget_s == 3.0
    assert settings([], env).transforms.workers == 4
    with pytest.raises(ValueError, match="budget must be positive"):
        settings(["--transform-budget", "0"], {})
