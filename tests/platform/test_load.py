"""The load suite (issue 14), quick size: concurrent sessions of 4-call DAGs beside a
slow-client flood, against the real ``parrot serve`` process of the test session, with
``/healthz`` probed throughout on fresh connections. Nothing is asserted on speed but a
generous bound (each probe answered within 2 s); the measured p50/p99 are printed. The full
size is ``python -m benchmarks.reliability_load`` (figures in ``docs/reliability.md``)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from conftest import ADMIN_TOKEN

from benchmarks.reliability.dag import dag_load, leaked_contexts
from benchmarks.reliability.flood import slow_flood
from benchmarks.reliability.health import probe_health


async def _load(url: str, sessions: int, slow: int):
    host, port = urlsplit(url).hostname, urlsplit(url).port
    # Other tests' contexts on the shared engine, beyond what this ServeCore tracks.
    baseline = await leaked_contexts(url, ADMIN_TOKEN, timeout_s=0)
    stop = asyncio.Event()
    probing = asyncio.create_task(probe_health(url, stop, interval_s=0.05, timeout_s=2.0))
    flooding = asyncio.create_task(slow_flood(host, port, slow, duration_s=600, stop=stop))
    dags = await dag_load(url, sessions=sessions, max_tokens=4)
    stop.set()
    probe, flood = await probing, await flooding
    leaked = await leaked_contexts(url, ADMIN_TOKEN, baseline=baseline)
    return dags, probe, flood, leaked


def test_session_dags_beside_slow_clients_lose_nothing_and_healthz_answers(parrot_url):
    dags, probe, flood, leaked = asyncio.run(_load(parrot_url, sessions=8, slow=200))
    print(f"load: {dags.summary()}; healthz {probe.summary()}; slow clients opened {flood.opened}")
    assert dags.sessions == 8 and dags.calls == 8 * 4
    assert dags.server_errors == 0, dags.statuses
    assert dags.lost_values == 0 and not dags.failed_calls, dags.failed_calls[:5]
    assert not probe.failures, probe.failures[:5]
    assert leaked == 0
    assert flood.opened == 200
