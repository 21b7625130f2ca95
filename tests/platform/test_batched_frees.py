"""Frees nothing waits for go in batches (platform/serve/contexts/frees.py): the contexts of
one-shot sessions, closed after their answers, are freed on their engine by one request
for many; a session with work still running is freed at once."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from waiting import until

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.contexts.frees import BatchedFrees
from parrot.platform.serve.contexts.manager import spawn
from parrot.platform.serve.core import ServeCore
from parrot.wire.sampling import SamplingParams

SHORT = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


class Recorder:
    """An engine client that records its ``abort`` requests."""

    def __init__(self) -> None:
        self.aborts: list[list[int]] = []

    async def abort(self, context_ids):
        self.aborts.append(list(context_ids))


@pytest.mark.asyncio(loop_scope="function")
async def test_frees_wait_for_their_batch_per_engine_then_go_in_one_request():
    tasks: set[asyncio.Task] = set()
    frees = BatchedFrees(lambda work: spawn(tasks, work), delay_s=0.05, batch=5)
    a, b = Recorder(), Recorder()
    frees.add(a, [1, 2])
    frees.add(b, [7])
    frees.add(a, [3])
    frees.add(a, [])
    assert (a.aborts, b.aborts, frees.pending()) == ([], [], 4)
    await until(lambda: a.aborts and b.aborts, what="both batches sent after the delay")
    assert (a.aborts, b.aborts, frees.requests, frees.pending()) == ([[1, 2, 3]], [[7]], 2, 0)
    frees.add(a, [4, 5, 6, 8])
    frees.add(a, [9])  # the batch is full: sent without waiting
    await asyncio.sleep(0)
    assert a.aborts[-1] == [4, 5, 6, 8, 9]
    frees.add(b, [10])
    frees.flush()  # at stop: sent now
    await asyncio.gather(*tasks)
    assert (b.aborts[-1], frees.pending()) == ([10], 0)
    await asyncio.sleep(0.1)
    assert frees.requests == 4  # the flushed batch's timer did not send it again


@pytest_asyncio.fixture(loop_scope="function")
async def core(fake_engine):
    fake_engine.engine.step_s = 0.005
    core = ServeCore()
    await core.start()
    await core.engines.register_builtin(fake_engine.url)
    yield core, fake_engine.engine
    await core.stop()


async def done_session(core: ServeCore, n: int):
    session, _ = await core.sessions.create(stored=False)
    params = [Binding(name="x", value=f"note {n}"), Binding(name="y", is_output=True, sampling=SHORT)]
    _, out = await core.calls.submit(session, "One-shot {{x}}: {{y}}", params, [], None)
    await core.vars.get(session, out["y"], "latency", 30)
    return session


async def running(core: ServeCore, n: int) -> bool:
    return (await core.engines.slots()[0].client.ping())["num_running"] == n


def aborts(engine) -> list[list[int]]:
    return [args["context_ids"] for op, args in engine.requests if op == "abort"]


@pytest.mark.asyncio(loop_scope="function")
async def test_one_shot_sessions_closed_together_are_freed_by_one_request(core):
    core, engine = core
    before = len(engine.contexts)
    sessions = [await done_session(core, n) for n in range(6)]
    held = len(engine.contexts)
    assert held > before
    sent = len(aborts(engine))
    for session in sessions:
        await core.sessions.delete(session, batch_frees=True)
    # They left the ServeCore's trees at once; the engine frees them with the batch.
    assert not any(core.contexts.tree(core.engines.slots()[0]).of_session(s.session_id) for s in sessions)
    core.contexts.check_integrity()
    await until(lambda: len(engine.contexts) <= before + 1, what="the batch freed on the engine")
    assert len(aborts(engine)) - sent == 1  # one request for the six sessions


@pytest.mark.asyncio(loop_scope="function")
async def test_a_session_with_running_work_is_freed_at_once(core):
    core, _engine = core
    session, _ = await core.sessions.create(stored=False)
    params = [Binding(name="x", value="tale"), Binding(name="y", is_output=True, sampling=LONG)]
    await core.calls.submit(session, "A long {{x}}: {{y}}", params, [], None)
    await until(lambda: running(core, 1), what="the generation running")
    await core.sessions.delete(session, batch_frees=True)
    # Aborted before the delete returned, not after a batch's delay.
    assert await running(core, 0)
    assert core.contexts.batched.pending() == 0
