"""``/healthz`` probed on a fresh connection every ``interval_s`` (a new connection is what
a load balancer's probe, or a new client, needs the server to accept)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class HealthProbe:
    latencies_s: list[float] = field(default_factory=list)  # answered 200
    failures: list[str] = field(default_factory=list)  # no answer in time, or not 200

    def percentile(self, q: float) -> float:
        """The q-th percentile of the answered probes (nearest rank), in seconds."""
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]

    def summary(self) -> dict:
        return {
            "probes": len(self.latencies_s) + len(self.failures),
            "failed": len(self.failures),
            "p50_ms": round(self.percentile(50) * 1000, 1),
            "p99_ms": round(self.percentile(99) * 1000, 1),
            "max_ms": round(max(self.latencies_s, default=float("nan")) * 1000, 1),
        }


async def probe_health(
    url: str, stop: asyncio.Event, interval_s: float = 0.05, timeout_s: float = 2.0
) -> HealthProbe:
    probe = HealthProbe()
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each time
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        while not stop.is_set():
            start = time.monotonic()
            try:
                r = await client.get(f"{url}/healthz")
                if r.status_code == 200:
                    probe.latencies_s.append(time.monotonic() - start)
                else:
                    probe.failures.append(f"status {r.status_code}")
            except httpx.HTTPError as error:
                probe.failures.append(repr(error))
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - start)))
    return probe
