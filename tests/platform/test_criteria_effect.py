"""What the latency criterion buys in the mixed workload (issue 35, §3): a latency-critical
call (a chat turn of the OpenAI front, a call with ``output_criteria="latency"``, or one a
latency ``get`` waits on) that arrives while throughput work is queued on the ServeCore
runs as soon as an engine slot frees, ahead of that work; with the criterion off
(``--no-criteria``) it waits its turn behind all of it. Checked by the order the calls
started in, not by time. On the fake engine (its generation takes the same time on every
side); the mixed workload's timing is benchmarks/apps/mixed.py."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from waiting import until

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.task import LATENCY
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")
SLOTS = 2  # tasks at once on the engine
BULK = 6  # throughput calls, SLOTS of them running when the urgent one arrives
URGENT = ("output_criteria", "latency get", "chat turn")


def out(tokens: int) -> Binding:
    return Binding("text", is_output=True, sampling=SamplingParams(max_tokens=tokens, temperature=0))


async def started_order(fake_engine, criteria: bool, urgent_kind: str) -> list[str]:
    """The calls by the time they started: ``bulk-n`` and ``urgent``."""
    fake_engine.engine = FakeEngine(step_s=0.01)
    core = ServeCore(policy=SchedulingPolicy(criteria=criteria))
    await core.start()
    try:
        await core.engines.register_builtin(fake_engine.url, capacity=SLOTS)
        session, _ = await core.sessions.create()
        names = {}
        for n in range(BULK):
            call, _ = await core.calls.submit(
                session, f"Batch job {n}: {{{{text}}}}", [out(20)], [], "throughput"
            )
            names[call.call_id] = f"bulk-{n}"
        await until(lambda: sum("started_at" in c.timings for c in session.calls.values()) == SLOTS)
        if urgent_kind == "chat turn":  # as the OpenAI front runs a request
            call = await core.calls.submit_prompt(
                session, ["User: hi\nAssistant:"], SamplingParams(max_tokens=4), []
            )
            var_id = call.outputs()["completion"]
        else:
            criteria_on_submit = "latency" if urgent_kind == "output_criteria" else None
            call, outputs = await core.calls.submit(
                session, "Answer now: {{text}}", [out(4)], [], criteria_on_submit
            )
            var_id = outputs["text"]
        names[call.call_id] = "urgent"
        await core.vars.get(
            session, var_id, LATENCY if urgent_kind != "output_criteria" else "throughput", 60
        )
        await until(lambda: all(c.state.settled for c in session.calls.values()), what="every call done")
        calls = sorted(session.calls.values(), key=lambda c: c.timings["started_at"])
        return [names[c.call_id] for c in calls]
    finally:
        await core.stop()


@pytest.mark.parametrize("urgent_kind", URGENT)
async def test_a_latency_call_goes_ahead_of_queued_throughput_work(fake_engine, urgent_kind):
    order = await started_order(fake_engine, criteria=True, urgent_kind=urgent_kind)
    assert order.index("urgent") == SLOTS, order  # the first slot that freed was its


async def test_without_the_criterion_it_waits_behind_the_queue(fake_engine):
    order = await started_order(fake_engine, criteria=False, urgent_kind="output_criteria")
    assert order[-1] == "urgent", order
