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
            await until(
                lambda: any(
                    "started_at" in c.timings
                    for c in session.calls.values()
                    if names.get(c.call_id, "").startswith("bulk")
                ),
                what="bulk started",
            )
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
    def __init__(self, latency: bool, session_id: str = "s1", **order) -> None:
        self.latency = latency
        self.session_id = session_id
        self.depth, self.group, self.app_seq, self.seq = 0, None, 0, 0
        for key, value in order.items():
            setattr(self, key, value)


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


class Running:
    """A running task as ``EngineSlot.throughput_left`` reads it: tokens still to compute."""

    def __init__(self, left: int) -> None:
        self._left = left

    def left(self, key) -> int:
        return self._left


async def test_an_engine_takes_its_fair_share_of_the_throughput_work_left():
    roles = EngineRoles(RoleSettings(window_steps=4))  # a window of 2,048 tokens: not the bound
    busy = slot("busy", throughput_load=600, running={"b": Running(100)})
    free = slot("free", throughput_load=300, running={"f": Running(300)})
    task = Task(False)
    # 1,000 tokens queued and 400 left on the two engines: 700 each. "free" holds 300: a task
    # of 400 fits, one of 900 does not (at least half of a task must fit its share).
    waiting = {("m", False): 1000}.get
    assert roles.admissible(task, [busy, free], [free], lambda s: 400, waiting) == [free]
    assert roles.admissible(task, [busy, free], [free], lambda s: 900, waiting) == []
    # Nothing left elsewhere to share it with: the window alone bounds it.
    assert roles.admissible(task, [free], [free], lambda s: 900, waiting) == [free]
    # Counted from what is left, not what was placed: a batch near its end counts little.
    busy.running = {"b": Running(0)}
    assert roles.admissible(task, [busy, free], [free], lambda s: 800, {("m", False): 1200}.get) == [free]


async def test_a_cpu_engine_keeps_to_the_end_of_an_applications_critical_path():
    now = [100.0]
    roles = EngineRoles(RoleSettings(memory_s=1.0), clock=lambda: now[0])
    cpu = slot("cpu", info={"max_batched_tokens": 512, "cpu": {"isa": "avx512"}})
    gpu = slot("gpu")
    mine, theirs = Task(False, "app-a"), Task(False, "app-b")
    for engine in (cpu, gpu):  # app a's last map runs there, 300 tokens from its end
        engine.tails, engine.running = {"a-map-7": "app-a"}, {"a-map-7": Running(300)}
    up = [cpu, gpu]
    assert roles.admissible(theirs, up, up, lambda s: 100) == [gpu]  # rows beside it cost little on a GPU
    assert roles.admissible(mine, up, up, lambda s: 100) == up
    cpu.running = {"a-map-7": Running(5000)}  # a long tail (past the window) does not hold it
    assert roles.admissible(theirs, up, up, lambda s: 100) == up
    cpu.running = {}
    # Its group's last task ended: the consumer (the reduce) comes next, for memory_s.
    cpu.tails, cpu.tail_ended = {}, ("app-a", 99.5)
    assert roles.admissible(theirs, up, up, lambda s: 100) == [gpu]
    assert roles.admissible(mine, up, up, lambda s: 100) == up
    now[0] = 100.6
    assert roles.admissible(theirs, up, up, lambda s: 100) == up
    assert roles.admissible(Task(True, "app-b"), up, [cpu], lambda s: 100) == [cpu]  # latency work: any


async def test_an_applications_own_tasks_go_before_a_later_applications_groups():
    policy = SchedulingPolicy()
    reduce_a = Task(False, app_seq=1, seq=40)
    maps_b = [Task(False, group=(2, 30), app_seq=2, seq=10 + n) for n in range(3)]
    maps_a = [Task(False, group=(1, 40), app_seq=1, seq=20 + n) for n in range(3)]
    ordered = sorted([*maps_b, reduce_a, *maps_a], key=policy.order)
    assert ordered == [*maps_a, reduce_a, *maps_b]


async def test_two_map_reduces_on_two_cpu_engines_keep_each_critical_path_apart():
    """Two map-reduce applications for throughput at once on two CPU engines: while an
    application's last map or its reduce runs, no task of the other runs on that engine
    (without the rule, the fair share puts the second's first maps beside the first's last)."""
    maps = {"a": 4, "b": 12}
    ran = await run_map_reduces(maps)
    for app, other in (("a", "b"), ("b", "a")):
        last_map = max((ran[f"{app}-map-{n}"] for n in range(maps[app])), key=lambda r: r[1])
        for engine, started, finished in (last_map, ran[f"{app}-reduce"]):
            beside = [
                name
                for name, (e, s, f) in ran.items()
                if name.startswith(other) and e == engine and s < finished and f > started
            ]
            assert not beside, (app, beside, ran)


async def run_map_reduces(maps: dict[str, int]) -> dict[str, tuple[str, float, float]]:
    """Each call's engine, start and end: applications of ``maps[app]`` maps and a reduce,
    submitted together on two fake CPU engines."""
    policy = SchedulingPolicy(roles=RoleSettings(memory_s=0.2))
    engines = [FakeEngineServer(FakeEngine(step_s=0.004, cpu=True)) for _ in range(2)]
    with engines[0] as a, engines[1] as b:
        core = ServeCore(policy=policy)
        await core.start()
        try:
            for engine in (a, b):
                await core.engines.register_builtin(engine.url)
            calls = {}
            for app, count in maps.items():
                session, _ = await core.sessions.create()
                outs = []
                for n in range(count):
                    call, made = await core.calls.submit(
                        session, f"App {app}, part {n}: {{{{text}}}}", [out(30)], [], "throughput"
                    )
                    calls[f"{app}-map-{n}"], outs = call, [*outs, made["text"]]
                inputs = [Binding(f"s{n}", var_id=var) for n, var in enumerate(outs)]
                template = f"App {app}: " + " ".join(f"{{{{s{n}}}}}" for n in range(count)) + " {{text}}"
                calls[f"{app}-reduce"], _ = await core.calls.submit(
                    session, template, [*inputs, out(30)], [], "throughput"
                )
            await until(lambda: all(c.state.settled for c in calls.values()), what="every call done")
            return {
                name: (c.engine_id, c.timings["started_at"], c.timings["finished_at"])
                for name, c in calls.items()
            }
        finally:
            await core.stop()
