"""The load suite at full size (issue 14): ``/healthz`` latency while the server is loaded.

Scenarios (each against a fresh ``parrot serve`` on its own data folder, on an engine this
script starts, or on ``--engine URL``):

- ``dag``: N concurrent sessions x a 4-call DAG (200; ``--quick`` 16);
- ``flood``: M slow clients trickling request heads (5,000; ``--quick`` 300) beside
  sessions keeping the engine busy (32; ``--quick`` 8);
- ``bigdag``: issue 24's defect 2: a session of 10,000 calls (``--quick`` 1,000; native
  transforms in a binary tree, so it builds in a minute without the engine) open in 4 live
  dashboard tabs (``/live/sessions/{id}``) for 30 s;
- ``acceptance``: issue 14's acceptance 3: a 64-input catastrophic-regex transform
  (``(a|aa)+$`` on ``"a" * 40 + "b"``: the ``regex`` module takes ``(a+)+$`` in well under
  a millisecond, so the classic example would test nothing), a 4 MiB prompt on
  ``/v1/completions`` and 2,000 slow clients (``--quick``: 200) in flight together.

``/healthz`` is probed on a fresh connection every 50 ms throughout; p50/p99 (and max) are
reported with throughput, 5xx count, lost values and leaked contexts. ``--write`` puts the
table into ``docs/reliability.md`` (between its ``reliability-load`` markers). Run:

    python -m benchmarks.reliability_load [--quick] [--scenarios dag,flood,acceptance] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from httpx_sse import aconnect_sse

from benchmarks._servers import free_port, launched, parrot_command
from benchmarks.reliability.dag import dag_load, leaked_contexts
from benchmarks.reliability.flood import slow_flood
from benchmarks.reliability.health import HealthProbe, ProbeProcess
from parrot.engines.protocol.server import raise_fd_limit

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
ADMIN = "reliability-bench"
BEGIN, END = "<!-- reliability-load:begin -->", "<!-- reliability-load:end -->"
FULL = {
    "dag_sessions": 200, "flood": 5000, "flood_sessions": 32, "acceptance_slow": 2000, "big_calls": 10_000
}  # fmt: skip
FLOOD_HOLD_S = 30.0
QUICK = {"dag_sessions": 16, "flood": 300, "flood_sessions": 8, "acceptance_slow": 200, "big_calls": 1_000}
TABS, TABS_HOLD_S = 4, 30.0  # live tabs open on the big session, and for how long


@contextlib.contextmanager
def process(args: list[str], ready_url: str, what: str) -> Iterator[None]:
    def ready() -> bool:
        return httpx.get(ready_url, timeout=2).status_code == 200

    # SIGINT: ``parrot serve`` stops as on Ctrl-C, with what it holds on the engine.
    with launched(parrot_command(*args), ready, what, timeout_s=600, stop=signal.SIGINT):
        yield


@contextlib.contextmanager
def servecore(engine_url: str, extra: tuple[str, ...] = ()) -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        args = [
            "serve",
            "--port",
            str(port),
            "--engine",
            engine_url,
            "--admin-token",
            ADMIN,
            "--data-dir",
            data,
            *extra,
        ]
        url = f"http://127.0.0.1:{port}"
        with process(args, f"{url}/healthz", "parrot serve"):
            yield url


async def _probed(url: str, work) -> tuple[HealthProbe, object]:
    """Run ``work`` while ``/healthz`` is probed from a separate process (see ProbeProcess)."""
    stop = asyncio.Event()
    with ProbeProcess(url, interval_s=0.05, timeout_s=5.0) as probing:
        await asyncio.sleep(1.0)  # the prober's start, and a few probes of the idle server
        try:
            result = await work(stop)
        finally:
            stop.set()
    return probing.result, result


def _row(name: str, probe: HealthProbe, detail: str) -> dict:
    return {"scenario": name, **probe.summary(), "detail": detail}


async def scenario_dag(url: str, sizes: dict) -> dict:
    async def work(_stop):
        return await dag_load(url, sizes["dag_sessions"], max_tokens=16)

    probe, dags = await _probed(url, work)
    leaked = await leaked_contexts(url, ADMIN)
    s = dags.summary()
    return _row(
        f"{s['sessions']} sessions x 4-call DAG",
        probe,
        f"{s['calls']} calls in {s['seconds']} s ({s['calls_per_s']} calls/s); 5xx: {s['5xx']}; "
        f"lost values: {s['lost_values']}; failed calls: {s['failed_calls']}; leaked contexts: {leaked}",
    )


async def scenario_flood(url: str, sizes: dict, fd_room: int) -> dict:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    slow = min(sizes["flood"], fd_room)

    async def work(_stop):
        # The slow clients keep trickling until the server cuts them off (its header
        # timeout, 10 s by default) or FLOOD_HOLD_S is over: those still open then were not.
        flooding = asyncio.create_task(slow_flood(host, port, slow, duration_s=FLOOD_HOLD_S, ramp_s=5.0))
        dags = await dag_load(url, sizes["flood_sessions"], max_tokens=16)
        return dags, await flooding

    probe, (dags, flood) = await _probed(url, work)
    leaked = await leaked_contexts(url, ADMIN)
    s = dags.summary()
    return _row(
        f"{slow} slow clients beside {s['sessions']} sessions",
        probe,
        f"slow clients closed by the server: {flood.closed} ({flood.answered_408} x 408, "
        f"{flood.answered_503} x 503), still open after {FLOOD_HOLD_S:g} s: {flood.still_open}, "
        f"refused: {flood.refused}; sessions: {s['calls']} calls, "
        f"5xx: {s['5xx']}, lost values: {s['lost_values']}; leaked contexts: {leaked}",
    )


async def _regex_transform(api: httpx.AsyncClient) -> str:
    s = (await api.post("/v1/session")).json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    body = {
        "session_id": sid,
        "inputs": [{"value": "a" * 40 + "b"}] * 64,
        "steps": [{"type": "regex", "pattern": "(a|aa)+$"}, {"type": "join"}],
        "output": "matched",
    }
    start = time.monotonic()
    r = await api.post("/v1/semantic_transform", json=body, headers=auth)
    if r.status_code != 201:
        return f"transform: {r.status_code} in {time.monotonic() - start:.1f} s"
    var_id = r.json()["outputs"]["matched"]
    got = await api.get(
        f"/v1/semantic_var/{var_id}", params={"session_id": sid, "timeout": 600}, headers=auth
    )
    return f"transform: {got.status_code} in {time.monotonic() - start:.1f} s"


async def _huge_prompt(api: httpx.AsyncClient) -> str:
    start = time.monotonic()
    prompt = "lorem ipsum " * (4 * 2**20 // 12)  # 4 MiB
    r = await api.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    return f"4 MiB prompt: {r.status_code} in {time.monotonic() - start:.1f} s"


async def scenario_acceptance(url: str, sizes: dict, fd_room: int) -> dict:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    slow = min(sizes["acceptance_slow"], fd_room)

    async def work(stop):
        flooding = asyncio.create_task(slow_flood(host, port, slow, duration_s=3600, ramp_s=2.0, stop=stop))
        async with httpx.AsyncClient(base_url=url, timeout=900) as api:
            done = await asyncio.gather(_regex_transform(api), _huge_prompt(api))
        stop.set()
        await flooding
        return done

    probe, done = await _probed(url, work)
    return _row(f"acceptance 3: regex x 64 + 4 MiB prompt + {slow} slow clients", probe, "; ".join(done))


async def _big_session(api: httpx.AsyncClient, calls: int) -> tuple[str, dict]:
    """A session of ``calls`` transforms in a binary tree (call i reads call (i-1)//2's
    output), submitted level by level, 32 at a time."""
    s = (await api.post("/v1/session")).json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    seed_body = {"session_id": sid, "name": "seed", "value": "x"}
    seed = await api.post("/v1/semantic_var", json=seed_body, headers=auth)
    outputs = [seed.json()["var_id"]]  # outputs[i + 1]: call i's

    async def submit(i: int) -> str:
        body = {
            "session_id": sid,
            "inputs": [{"var_id": outputs[(i - 1) // 2 + 1 if i else 0]}],
            "steps": [{"type": "upper"}],
            "output": f"t{i}",
        }
        r = await api.post("/v1/semantic_transform", json=body, headers=auth)
        r.raise_for_status()
        return r.json()["outputs"][f"t{i}"]

    level_start = 0
    while level_start < calls:
        level = range(level_start, min(calls, 2 * level_start + 1))
        for chunk in range(level.start, level.stop, 32):
            outputs += await asyncio.gather(*(submit(i) for i in range(chunk, min(chunk + 32, level.stop))))
        level_start = level.stop
    return sid, auth


async def _tab(url: str, sid: str, stop: asyncio.Event) -> tuple[int, int]:
    """One browser tab on the session's live page: (events, bytes) until ``stop``."""
    counts = [0, 0]

    async def read() -> None:
        async with (
            httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60, read=300)) as tab,
            aconnect_sse(tab, "GET", f"/live/sessions/{sid}") as source,
        ):
            source.response.raise_for_status()
            async for event in source.aiter_sse():
                counts[0] += 1
                counts[1] += len(event.data)

    reading = asyncio.create_task(read())
    await stop.wait()
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    return counts[0], counts[1]


async def scenario_bigdag(url: str, sizes: dict) -> dict:
    calls = sizes["big_calls"]
    async with httpx.AsyncClient(base_url=url, timeout=600) as api:
        built = time.monotonic()
        sid, _auth = await _big_session(api, calls)
        built = time.monotonic() - built
        start = time.monotonic()
        page = await api.get(f"/sessions/{sid}")
        page_s = time.monotonic() - start

    async def work(stop):
        tabs = [asyncio.create_task(_tab(url, sid, stop)) for _ in range(TABS)]
        await asyncio.sleep(TABS_HOLD_S)
        stop.set()
        return await asyncio.gather(*tabs)

    probe, tabs = await _probed(url, work)
    events = sum(e for e, _ in tabs)
    return _row(
        f"{TABS} live tabs on a {calls}-call session",
        probe,
        f"session built in {built:.0f} s; its page: {page.status_code}, {len(page.content) / 1e6:.2f} MB "
        f"in {page_s:.2f} s; {events} live updates to the tabs in {TABS_HOLD_S:g} s",
    )


def table(rows: list[dict], setup: str) -> str:
    lines = [
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {setup}.",
        "",
        "| scenario | `/healthz` probes | failed | p50 ms | p99 ms | max ms | details |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['probes']} | {r['failed']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['max_ms']} | {r['detail']} |"
        )
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


async def run_all(url: str, names: list[str], sizes: dict) -> list[dict]:
    fd_room = max(64, raise_fd_limit() - 1024)  # this process's own sockets: one per slow client
    rows = []
    for name in names:
        if name == "dag":
            rows.append(await scenario_dag(url, sizes))
        elif name == "flood":
            rows.append(await scenario_flood(url, sizes, fd_room))
        elif name == "acceptance":
            rows.append(await scenario_acceptance(url, sizes, fd_room))
        elif name == "bigdag":
            rows.append(await scenario_bigdag(url, sizes))
        else:
            raise SystemExit(f"unknown scenario {name!r}")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (a minute or two)")
    p.add_argument("--scenarios", default="dag,flood,acceptance,bigdag")
    p.add_argument("--engine", default=None, metavar="URL", help="a running engine (default: start one)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the engine started")
    p.add_argument("--write", action="store_true", help="write the table into docs/reliability.md")
    args = p.parse_args()
    sizes = QUICK if args.quick else FULL
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    with contextlib.ExitStack() as stack:
        engine_url = args.engine
        if engine_url is None:
            port = free_port()
            cmd = ["engine", "--port", str(port), "--kv-cache-memory", "1GiB"]
            cmd += ["--threads", str(args.threads)] if args.threads else []
            engine_url = f"http://127.0.0.1:{port}"
            stack.enter_context(process(cmd, f"{engine_url}/ping", "parrot engine"))
        rows = []
        for name in names:  # a fresh ServeCore per scenario: one's leftovers do not load the next
            # The big session needs more than the default 10,000 variables of a session.
            extra = ("--max-vars-per-session", "100000", "--max-calls-per-session", "100000")
            with servecore(engine_url, extra if name == "bigdag" else ()) as url:
                rows += asyncio.run(run_all(url, [name], sizes))
    setup = (
        f"{'quick' if args.quick else 'full'} sizes, {os.cpu_count()} CPU cores, "
        f"engine {'given' if args.engine else 'started by the script (default model)'}"
    )
    text = table(rows, setup)
    print(text)
    if args.write:
        write_doc(text)


if __name__ == "__main__":
    main()
