"""Performance criteria: a latency-critical get (or output_criteria on submit) marks the
producers of a variable backwards through the DAG with the criteria and their depth."""

from __future__ import annotations

import asyncio

import pytest

from parrot.engines.protocol.errors import WaitTimeoutError
from parrot.platform.serve.core import CallParameter, ServeCore
from parrot.platform.serve.executor import LATENCY, THROUGHPUT, EngineSlot

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def chain_session(core: ServeCore, criteria: str | None = None):
    """a -> b -> c, and an unrelated d, submitted to a core that is not started (nothing is
    dispatched, so the marks can be read)."""
    core.scheduler.add_engine(EngineSlot("e", "m", client=None, tree=None))  # never dispatched to
    session, _ = await core.create_session()
    outs = {}
    for template, src, dst in (
        ("Topic: {{a}}", None, "a"),
        ("{{a}} then {{b}}", "a", "b"),
        ("{{b}} so {{c}}", "b", "c"),
    ):
        params = [CallParameter(name=dst, is_output=True)]
        if src:
            params.insert(0, CallParameter(name=src, var_id=outs[src]))
        _, out = await core.submit_call(session, template, params, [], criteria if dst == "c" else None)
        outs.update(out)
    _, out = await core.submit_call(
        session, "Other: {{d}}", [CallParameter(name="d", is_output=True)], [], None
    )
    outs.update(out)
    await asyncio.sleep(0.05)  # the watchers queue the chains whose inputs are ready (a and d)
    return session, outs


def marks(core: ServeCore, session) -> dict[str, int | None]:
    return {
        chain.gen.var.name: core.scheduler.latency_chains.get(id(chain))
        for request in session.calls.values()
        for chain in request.chains
    }


async def test_a_latency_get_marks_the_producers_with_their_depth():
    core = ServeCore()
    session, outs = await chain_session(core)
    assert marks(core, session) == {"a": None, "b": None, "c": None, "d": None}
    with pytest.raises(WaitTimeoutError):
        await core.get_var(session, outs["c"], LATENCY, 0.01)
    assert marks(core, session) == {"a": 3, "b": 2, "c": 1, "d": None}
    queued = {t.chain.gen.var.name: (t.criteria, t.depth) for t in core.scheduler.queue}
    assert queued == {"a": (LATENCY, 3), "d": (THROUGHPUT, 0)}
    # The scheduler's order: latency-critical first, the deepest of them first.
    core.scheduler.queue.sort(key=core.scheduler.order)
    assert [t.chain.gen.var.name for t in core.scheduler.queue] == ["a", "d"]


async def test_a_throughput_get_marks_nothing():
    core = ServeCore()
    session, outs = await chain_session(core)
    with pytest.raises(WaitTimeoutError):
        await core.get_var(session, outs["c"], THROUGHPUT, 0.01)
    assert set(marks(core, session).values()) == {None}


async def test_output_criteria_on_submit_marks_the_upstream_producers_too():
    core = ServeCore()
    session, _ = await chain_session(core, criteria=LATENCY)
    assert marks(core, session) == {"a": 3, "b": 2, "c": 1, "d": None}


async def test_each_policy_of_the_order_can_be_switched_off():
    from parrot.platform.serve.executor import CompletionTask, GlobalScheduler, SchedulingPolicy
    from parrot.platform.serve.variables import Variables

    def task(name, seq, app_seq, criteria=THROUGHPUT, depth=0, group=None):
        t = CompletionTask(
            chain=None, session_id=name, seq=seq, criteria=criteria, group=group, app_seq=app_seq
        )
        t.depth = depth
        return t

    tasks = [
        task("new-app", seq=5, app_seq=5),
        task("old-app-downstream", seq=6, app_seq=1),
        task("grouped", seq=7, app_seq=7, group=42),
        task("latency", seq=8, app_seq=8, criteria=LATENCY, depth=1),
        task("latency-deeper", seq=9, app_seq=9, criteria=LATENCY, depth=2),
    ]

    def ordered(**policy) -> list[str]:
        scheduler = GlobalScheduler(Variables(), policy=SchedulingPolicy(**policy))
        return [t.session_id for t in sorted(tasks, key=scheduler.order)]

    assert ordered() == ["latency-deeper", "latency", "grouped", "old-app-downstream", "new-app"]
    assert ordered(criteria=False)[:2] == ["grouped", "old-app-downstream"]
    assert ordered(task_groups=False) == [
        "latency-deeper",
        "latency",
        "old-app-downstream",
        "new-app",
        "grouped",
    ]
    assert ordered(app_fifo=False) == [
        "latency-deeper",
        "latency",
        "grouped",
        "new-app",
        "old-app-downstream",
    ]
    assert ordered(criteria=False, task_groups=False, app_fifo=False) == [t.session_id for t in tasks]
