"""Concurrent sessions, each a 4-call DAG over the REST API:

    topic ─▶ a = facts(topic) ─┬─▶ b = title(a)   ─┐
                               └─▶ c = question(a) ─┴─▶ d = answer(b, c)

Every response is counted by status; a value that is not ready (or empty) at the end is
"lost"; each session is deleted at the end, and the contexts left on the engine beyond
those the ServeCore still tracks (shared prefixes it may evict) are "leaked".
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

CALLS = (  # template, inputs, output
    ("Topic: {{topic}}\nThree facts about it:\n{{a}}", ("topic",), "a"),
    ("Facts: {{a}}\nA title for them: {{b}}", ("a",), "b"),
    ("Facts: {{a}}\nA question they raise: {{c}}", ("a",), "c"),
    ("Title: {{b}}\nQuestion: {{c}}\nAnswer: {{d}}", ("b", "c"), "d"),
)


@dataclass
class DagResult:
    sessions: int = 0
    calls: int = 0
    statuses: Counter = field(default_factory=Counter)
    lost_values: int = 0
    failed_calls: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def summary(self) -> dict:
        return {
            "sessions": self.sessions,
            "calls": self.calls,
            "5xx": self.server_errors,
            "lost_values": self.lost_values,
            "failed_calls": len(self.failed_calls),
            "seconds": round(self.seconds, 2),
            "calls_per_s": round(self.calls / self.seconds, 2) if self.seconds else 0.0,
        }


async def _session(api: httpx.AsyncClient, topic: str, max_tokens: int, result: DagResult) -> None:
    async def call(method: str, path: str, **kw) -> httpx.Response:
        r = await api.request(method, path, **kw)
        result.statuses[r.status_code] += 1
        return r

    r = await call("POST", "/v1/session")
    if r.status_code != 201:
        result.lost_values += len(CALLS)
        return
    sid = r.json()["session_id"]
    auth = {"Authorization": f"Bearer {r.json()['session_auth']}"}
    r = await call(
        "POST", "/v1/semantic_var", json={"session_id": sid, "name": "topic", "value": topic}, headers=auth
    )
    ids = {"topic": r.json()["var_id"]} if r.status_code == 201 else {}
    sampling = {"max_tokens": max_tokens, "temperature": 0}
    for template, inputs, output in CALLS:
        if any(name not in ids for name in inputs):
            break
        params = [{"name": n, "var_id": ids[n]} for n in inputs]
        params.append({"name": output, "is_output": True, "sampling": sampling})
        r = await call(
            "POST",
            "/v1/semantic_call",
            json={"session_id": sid, "template": template, "parameters": params},
            headers=auth,
        )
        if r.status_code == 201:
            ids[output] = r.json()["outputs"][output]
            result.calls += 1
    for name in ("d", "a", "b", "c"):  # the final value first: its get activates the whole DAG
        if name not in ids:
            result.lost_values += 1
            continue
        r = await call(
            "GET", f"/v1/semantic_var/{ids[name]}", params={"session_id": sid, "timeout": 600}, headers=auth
        )
        if r.status_code != 200 or not r.json().get("ready") or not r.json().get("value"):
            result.lost_values += 1
    info = await call("GET", f"/v1/session/{sid}", headers=auth)
    if info.status_code == 200:
        result.failed_calls += [
            f"{c['call_id']}: {c.get('error')}" for c in info.json()["calls"] if c["state"] != "done"
        ]
    await call("DELETE", f"/v1/session/{sid}", headers=auth)
    result.sessions += 1


async def dag_load(url: str, sessions: int, max_tokens: int = 8) -> DagResult:
    """``sessions`` sessions at once, each a 4-call DAG (``max_tokens`` per call)."""
    result = DagResult()
    limits = httpx.Limits(max_connections=sessions + 8)
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as api:
        await asyncio.gather(
            *(_session(api, f"subject number {i}", max_tokens, result) for i in range(sessions))
        )
    result.seconds = time.monotonic() - start
    return result


async def leaked_contexts(url: str, admin_token: str, baseline: int = 0, timeout_s: float = 60) -> int:
    """Contexts on the ServeCore's engines beyond those it tracks, once the engines are idle,
    less ``baseline`` (what other users of the engines held before: 0 when the ServeCore is
    their only user). Waits up to ``timeout_s`` for it to come down to 0."""
    deadline = time.monotonic() + timeout_s
    admin = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=url, timeout=10) as api:
        while True:
            surplus, busy = 0, False
            for engine in (await api.get("/v1/engines")).json():
                ping = (await api.get(f"{engine['url']}/ping")).json()
                r = await api.get(f"/v1/engines/{engine['engine_id']}/contexts", headers=admin)
                if r.status_code != 200:
                    raise RuntimeError(f"the ServeCore's context tree: {r.status_code} {r.text}")
                tree = r.json()
                busy |= ping["num_running"] > 0 or ping["num_waiting"] > 0
                surplus += ping["num_contexts"] - tree["contexts"]
            if (not busy and surplus == baseline) or time.monotonic() > deadline:
                return surplus - baseline
            await asyncio.sleep(0.25)
