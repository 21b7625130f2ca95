"""Performance criteria and the other policies: a latency-critical get (or output_criteria on
submit) marks the producers of a variable backwards through the DAG with their depth; the
queue orders by criteria, task groups and application; placement by prefix and load."""

from __future__ import annotations

import pytest
from waiting import until

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import WaitTimeoutError
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import LATENCY, THROUGHPUT, CompletionTask

pytestmark = pytest.mark.asyncio(loop_scope="function")


def idle_slot() -> EngineSlot:
    """An engine slot that is never dispatched to (the core is not started): text contexts,
    so prompts need no tokenizer."""
    return EngineSlot("e", "m", client=None, text=True)


async def chain_session(core: ServeCore, criteria: str | None = None):
    """a -> b -> c, and an unrelated d, submitted to a core that is not started (nothing is
    dispatched, so the marks can be read)."""
    core.scheduler.add_engine(idle_slot())
    session, _ = await core.sessions.create()
    outs = {}
    for template, src, dst in (
        ("Topic: {{a}}", None, "a"),
        ("{{a}} then {{b}}", "a", "b"),
        ("{{b}} so {{c}}", "b", "c"),
    ):
        params = [Binding(name=dst, is_output=True)]
        if src:
            params.insert(0, Binding(name=src, var_id=outs[src]))
        _, out = await core.calls.submit(session, template, params, [], criteria if dst == "c" else None)
        outs.update(out)
    _, out = await core.calls.submit(session, "Other: {{d}}", [Binding(name="d", is_output=True)], [], None)
    outs.update(out)
    # the watchers queue the chains whose inputs are ready (a and d)
    await until(lambda: len(core.scheduler.queue) == 2, what="a and d queued")
    return session, outs


def marks(session) -> dict[str, int]:
    return {
        chain.gen.var.name: chain.latency_depth
        for request in session.calls.values()
        for chain in request.chains
    }


async def test_a_latency_get_marks_the_producers_with_their_depth():
    core = ServeCore()
    session, outs = await chain_session(core)
    assert marks(session) == {"a": 0, "b": 0, "c": 0, "d": 0}
    with pytest.raises(WaitTimeoutError):
        await core.vars.get(session, outs["c"], LATENCY, 0.01)
    assert marks(session) == {"a": 3, "b": 2, "c": 1, "d": 0}
    queued = {t.chain.gen.var.name: (t.latency, t.depth) for t in core.scheduler.queue}
    assert queued == {"a": (True, 3), "d": (False, 0)}
    # The queue's order: latency-critical first, the deepest of them first.
    assert [t.chain.gen.var.name for t in core.scheduler.queue.ordered()] == ["a", "d"]


async def test_a_throughput_get_marks_nothing():
    core = ServeCore()
    session, outs = await chain_session(core)
    with pytest.raises(WaitTimeoutError):
        await core.vars.get(session, outs["c"], THROUGHPUT, 0.01)
    assert set(marks(session).values()) == {0}


async def test_output_criteria_on_submit_marks_the_upstream_producers_too():
    core = ServeCore()
    session, _ = await chain_session(core, criteria=LATENCY)
    assert marks(session) == {"a": 3, "b": 2, "c": 1, "d": 0}


async def test_a_consumer_makes_its_queued_producers_a_group_whenever_it_arrives():
    """The maps are queued before the reduce is submitted: they join its group then."""
    core = ServeCore()
    core.scheduler.add_engine(idle_slot())
    session, _ = await core.sessions.create()
    maps = []
    for i in range(3):
        _, out = await core.calls.submit(
            session, f"Part {i}: {{{{s}}}}", [Binding(name="s", is_output=True)], [], None
        )
        maps.append(out["s"])
    await until(lambda: len(core.scheduler.queue) == 3, what="the maps queued")
    assert {t.group for t in core.scheduler.queue} == {None}
    params = [Binding(name=f"s{i}", var_id=v) for i, v in enumerate(maps)]
    params.append(Binding(name="total", is_output=True))
    reduce, _ = await core.calls.submit(session, "{{s0}} {{s1}} {{s2}} All: {{total}}", params, [], None)
    groups = {t.group for t in core.scheduler.queue}
    assert groups == {(next(iter(session.calls.values())).seq, reduce.seq)}  # by application, then consumer


class FakeChain:
    """Only what the queue's order reads of a chain."""

    def __init__(self, key: str, depth: int = 0, group=None) -> None:
        self.key, self.latency_depth, self.group = key, depth, group


def task(name, seq, app_seq, criteria=THROUGHPUT, depth=0, group=None) -> CompletionTask:
    return CompletionTask(
        FakeChain(name, depth, group), session_id=name, seq=seq, app_seq=app_seq, criteria=criteria
    )


async def test_each_policy_of_the_order_can_be_switched_off():
    tasks = [
        task("new-app", seq=5, app_seq=5),
        task("old-app-downstream", seq=6, app_seq=1),
        task("grouped", seq=7, app_seq=7, group=(7, 42)),
        task("latency", seq=8, app_seq=8, criteria=LATENCY, depth=1),
        task("latency-deeper", seq=9, app_seq=9, criteria=LATENCY, depth=2),
        task("new-app-grouped", seq=10, app_seq=5, group=(5, 60)),
    ]

    def ordered(**policy) -> list[str]:
        return [t.session_id for t in sorted(tasks, key=SchedulingPolicy(**policy).order)]

    # An earlier application's own tasks (a reduce) go before a later one's groups (its
    # maps); within an application, its groups first.
    assert ordered() == [
        "latency-deeper",
        "latency",
        "old-app-downstream",
        "new-app-grouped",
        "new-app",
        "grouped",
    ]
    assert ordered(criteria=False)[:2] == ["old-app-downstream", "new-app-grouped"]
    assert ordered(task_groups=False) == [
        "latency-deeper",
        "latency",
        "old-app-downstream",
        "new-app",
        "new-app-grouped",
        "grouped",
    ]
    assert ordered(app_fifo=False) == [
        "latency-deeper",
        "latency",
        "new-app-grouped",
        "grouped",
        "new-app",
        "old-app-downstream",
    ]
    assert ordered(criteria=False, task_groups=False, app_fifo=False) == [t.session_id for t in tasks]


async def test_groups_sort_by_their_application_not_by_arrival():
    early_app_late_group = task("a", seq=9, app_seq=1, group=(1, 50))
    late_app_early_group = task("b", seq=2, app_seq=3, group=(3, 10))
    ordered = sorted([late_app_early_group, early_app_late_group], key=SchedulingPolicy().order)
    assert [t.session_id for t in ordered] == ["a", "b"]


async def test_placement_goes_where_the_least_work_is_ahead():
    policy = SchedulingPolicy()
    latency, bulk = task("l", 1, 1, criteria=LATENCY), task("t", 2, 2)
    # Engines as (matched prefix, load) for a 300-token prompt: a cached prefix is work saved.
    engines = {"cached": (250, 100), "idle": (0, 0), "busy": (0, 500)}

    def best(t, **kw) -> str:
        p = SchedulingPolicy(**kw) if kw else policy
        return min(engines, key=lambda e: p.placement(t, *engines[e], 300))

    assert best(latency) == best(bulk) == "cached"  # 150 tokens of work vs 300 and 800
    assert best(latency, context_affinity=False) == best(bulk, context_affinity=False) == "idle"
    engines["cached"] = (250, 400)  # its load now outweighs what its cache saves
    assert best(latency) == best(bulk) == "idle"
    assert policy.priority(latency) == 1 and policy.priority(bulk) == 0
    assert SchedulingPolicy(criteria=False).priority(latency) == 0
