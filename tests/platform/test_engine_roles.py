"""Engine roles (``EngineRoles`` in platform/serve/scheduler/policy.py; issue 35, §3): with
two engines, a chat turn and throughput work keep to engines of their own, throughput work
beyond an engine's window waits in the ServeCore's queue for an engine whose latency work
ended, and with ``--no-engine-roles`` the work is shared as before. Checked by where calls ran, on two fake
engines served over HTTP; the timing of the mixed workload is benchmarks/apps/mixed.py."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine, FakeEngineServer
from waiting import until

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.scheduler.policy import EngineRoles, RoleSettings, SchedulingPolicy
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")


def out(tokens: int) -> Binding:
    return Binding("text", is_output=True, sampling=SamplingParams(max_tokens=tokens, temperature=0))


async def run_mixed(roles: bool, bulk: int = 6, bulk_tokens: int = 40, step_s: float = 0.005) -> dict:
    """A long chat turn, then ``bulk`` throughput calls, then a second chat turn, on two
    engines; the engine each ran on, by name (``chat-1``, ``chat-2``, ``bulk-n``)."""
    policy = SchedulingPolicy(engine_roles=roles, roles=RoleSettings(memory_s=0.05))
    with FakeEngineServer(FakeEngine(step_s=step_s)) as a, FakeEngineServer(FakeEngine(step_s=step_s)) as b:
        core = ServeCore(policy=policy)
        await core.start()
        try:
            for engine in (a, b):
                await core.engines.register_builtin(engine.url)
            session, _ = await core.sessions.create()
            names = {}

            async def chat(name: str, tokens: int) -> None:
                sampling = SamplingParams(max_tokens=tokens, ignore_eos=True)
                call = await core.calls.submit_prompt(session, [f"User: {name}\nAssistant:"], sampling, [])
                names[call.call_id] = name
                await until(lambda: "started_at" in call.timings, what=f"{name} started")

            await chat("chat-1", 120)
            for n in range(bulk):
                call, _ = await core.calls.submit(
                    session, f"Batch job {n}: {{{{text}}}}", [out(bulk_tokens)], [], "throughput"
                )
                names[call.call_id] = f"bulk-{n}"
            await until(lambda: any("started_at" in c.timings for c in session.calls.values()
                                    if names.get(c.call_id, "").startswith("bulk")), what="bulk started")
            await chat("chat-2", 10)
            await until(lambda: all(c.state.settled for c in session.calls.values()), what="every call done")
            return {names[c.call_id]: c.engine_id for c in session.calls.values()}
        finally:
            await core.stop()


async def test_chat_and_throughput_work_keep_to_engines_of_their_own():
    ran = await run_mixed(roles=True)
    chat_engine = ran["chat-1"]
    assert ran["chat-2"] == chat_engine, ran  # the engine without throughput work
    assert all(ran[f"bulk-{n}"] != chat_engine for n in range(6)), ran


async def test_without_roles_throughput_work_shares_the_chat_engine():
    ran = await run_mixed(roles=False)
    assert any(ran[f"bulk-{n}"] == ran["chat-1"] for n in range(6)), ran  # the least work ahead


async def test_work_past_the_window_waits_for_the_latency_engine_to_free():
    # Each bulk call may add ~1,000 KV tokens: two fill the other engine's window (2 x 1,024,
    # the fake's pings name no step budget), the rest wait in the queue; once the chats
    # ended, the chat engine takes some (without the window all would have gone at once to
    # the other engine, the only one allowed while the chats ran).
    ran = await run_mixed(roles=True, bulk=6, bulk_tokens=600, step_s=0.002)
    assert sum(ran[f"bulk-{n}"] == ran["chat-1"] for n in range(6)) >= 1, ran


# -- the rules, one slot at a time ---------------------------------------------------------
class Task:
    def __init__(self, latency: bool) -> None:
        self.latency = latency


def slot(name: str, **state) -> EngineSlot:
    s = EngineSlot(name, "m", client=None, info={"max_batched_tokens": 512})
    for key, value in state.items():
        setattr(s, key, value)
    return s


async def test_the_rules():
    now = [100.0]
    roles = EngineRoles(RoleSettings(memory_s=1.0, pack=2, window_steps=2), clock=lambda: now[0])
    chat = slot("chat", latency_running={"c1"})
    bulk = slot("bulk", throughput_load=900)
    idle = slot("idle")
    latency, throughput = Task(True), Task(False)
    # Throughput work: never to a latency engine while another engine serves; to each engine
    # up to 2 x 512 tokens (one task always fits an engine without throughput work).
    assert roles.admissible(throughput, [chat, bulk, idle], [chat, bulk, idle], lambda s: 200) == [idle]
    assert roles.admissible(throughput, [chat, bulk], [chat, bulk], lambda s: 100) == [bulk]
    assert roles.admissible(throughput, [chat, bulk], [chat, bulk], lambda s: 200) == []  # waits
    assert roles.admissible(throughput, [chat], [chat], lambda s: 5000) == [chat]  # no other engine
    # A latency engine stays one for memory_s after its last latency task.
    chat.latency_running.clear()
    chat.latency_ended_at = 99.5
    assert roles.is_latency_engine(chat)
    now[0] = 100.6
    assert not roles.is_latency_engine(chat)
    # Latency work: least throughput work first, then a latency engine gathering (below pack).
    chat.latency_ended_at, chat.latency_running = float("-inf"), {"c1"}
    assert min([bulk, idle, chat], key=lambda s: roles.rank(latency, s)) is chat
    chat.latency_running = {"c1", "c2"}  # packed: the next goes to an idle engine
    assert min([bulk, idle, chat], key=lambda s: roles.rank(latency, s)) is idle
    assert roles.rank(throughput, chat) == roles.rank(throughput, idle)  # no role order
