"""The llama.cpp slot planner (issue 39): which slot a request runs in, whether it waits for
the slot that holds its prefix, and that no waiter is lost or leaks a slot. Unit tests of
one component; the planner against a real llama-server is in test_llama_fleet.py."""

from __future__ import annotations

import asyncio

import pytest

from parrot.engines.openai.slots import SlotPlanner, shared_prefix

pytestmark = pytest.mark.asyncio(loop_scope="function")
SYSTEM = "You are the librarian of a reading room. " * 30  # 1,230 characters


class Clock:
    def __init__(self, step: float = 1.0) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step  # every reading is later: least recently used is well defined
        return self.now


async def hold(planner: SlotPlanner, prompt: str, release: asyncio.Event, got: list) -> None:
    async with planner.slot(prompt, max_tokens=8) as slot:
        got.append((prompt[-3:], slot.index))
        await release.wait()
        slot.text = prompt + " answer"


async def started(*tasks: asyncio.Task) -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_shared_prefix():
    assert shared_prefix("abcdef", "abcxyz") == 3 and shared_prefix("", "abc") == 0
    assert shared_prefix("abc", "abc") == 3 and shared_prefix("abc", "abcd") == 3
    assert shared_prefix(SYSTEM + "x", SYSTEM + "y") == len(SYSTEM)


async def test_requests_sharing_a_prefix_wait_for_its_slot_and_spread_once_too_many_wait():
    """Before the server's timings are known, at most ``max_waiting`` wait for one slot."""
    planner = SlotPlanner(3, max_waiting=2, clock=Clock())
    release, got = asyncio.Event(), []
    tasks = [asyncio.create_task(hold(planner, f"{SYSTEM} q{i:02d}", release, got)) for i in range(5)]
    await started(*tasks)
    # q00 computes the prefix in a slot, q01 and q02 wait for that slot; q03 computes it in
    # another (a third waiter is one too many), and q04 waits for q03's slot.
    assert sorted(index for _, index in got) == [0, 1] and planner.waiting == 3
    assert planner.waited == 3 and planner.running == 2
    release.set()
    await asyncio.gather(*tasks)
    slots = dict(got)
    assert slots["q01"] == slots["q02"] == slots["q00"] != slots["q03"] == slots["q04"]
    assert planner.running == planner.waiting == 0


async def test_with_the_servers_timings_a_request_waits_only_when_that_is_quicker():
    """A CPU-like server (a prompt token costs 6 ms, an output token 14 ms): waiting for the
    slot that holds a 1,230-character prefix beats computing it again. A GPU-like one
    (0.05 ms a prompt token): the prefix is computed again in a free slot."""
    for prompt_ms, expect_wait in ((6.0, True), (0.05, False)):
        planner = SlotPlanner(2, clock=Clock(step=0))
        planner.rates.observe(
            {"prompt_n": 300, "prompt_ms": 300 * prompt_ms, "predicted_n": 8, "predicted_per_token_ms": 14.0},
            prompt_chars=1200,
            prompt_tokens=300,
        )
        release, got = asyncio.Event(), []
        first = asyncio.create_task(hold(planner, SYSTEM + " q1", release, got))
        await started(first)
        second = asyncio.create_task(hold(planner, SYSTEM + " q2", release, got))
        await started(second)
        assert (planner.waiting == 1) is expect_wait, (prompt_ms, got)
        release.set()
        await asyncio.gather(first, second)


async def test_a_short_shared_prefix_has_one_waiter_and_the_next_requests_spread():
    """A 150-token prefix (an agents' team prompt) is cheap to compute again in a batch with
    the others: one request waits for the slot computing it, the next ones take free slots
    (a queue behind one slot ran a whole phase serially). The prefix counts as usable on
    this server only while a request may still wait for it."""
    planner = SlotPlanner(2, clock=Clock(step=0))
    planner.rates.observe(
        {"prompt_n": 300, "prompt_ms": 1800.0, "predicted_n": 8, "predicted_per_token_ms": 14.0},
        prompt_chars=1200,
        prompt_tokens=300,
    )
    team = "You are one of three agents of a team. " * 15  # 600 characters: 150 tokens
    release, got, tasks = asyncio.Event(), [], []
    for i in range(4):
        tasks.append(asyncio.create_task(hold(planner, f"{team} task {i}", release, got)))
        await started(*tasks)
        if i == 0:  # one request may still wait for the slot computing it
            assert planner.kept_prefix(f"{team} task 9") > len(team)
    # task 0 and task 2 run, computing the prefix each; task 1 and task 3 wait, one per slot
    assert [index for _, index in got] == [0, 1] and planner.waiting == 2
    assert planner.kept_prefix(f"{team} task 9") == 0  # its slots are taken: no better placed here
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(index for _, index in got) == [0, 0, 1, 1]


async def test_distinct_prompts_take_the_least_recently_used_free_slot_and_the_rest_wait_in_order():
    planner = SlotPlanner(2, clock=Clock())
    release, got = asyncio.Event(), []
    prompts = [f"Prompt number {i} of its own kind." for i in range(4)]
    tasks = []
    for prompt in prompts:
        tasks.append(asyncio.create_task(hold(planner, prompt, release, got)))
        await started(*tasks)
    assert [index for _, index in got] == [0, 1] and planner.waiting == 2
    release.set()
    await asyncio.gather(*tasks)
    assert len(got) == 4 and sorted(index for _, index in got) == [0, 0, 1, 1]
    assert planner.running == planner.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_a_failed_request_forgets_its_slot():
    planner = SlotPlanner(1, clock=Clock())
    release, got = asyncio.Event(), []
    first = asyncio.create_task(hold(planner, "first prompt", release, got))
    await started(first)
    waiter = asyncio.create_task(hold(planner, "second prompt", release, got))
    await started(waiter)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert planner.waiting == 0
    release.set()
    await first
    with pytest.raises(RuntimeError):
        async with planner.slot("a prompt that fails", max_tokens=4):
            raise RuntimeError("the endpoint failed")
    assert planner.slots[0].text == "" and not planner.slots[0].busy
    async with planner.slot("third prompt", max_tokens=4) as slot:  # the slot is free again
        assert slot.index == 0


async def test_across_replicas_a_request_queues_for_its_prefix_only_when_that_is_quicker():
    """This server's one slot is taken and holds a 1,230-character prefix (~1.9 s to compute
    on this CPU-like server): a request sharing it had better wait here when the slot frees
    soon, or when the other replica is busy (its compute shared); not when the other replica
    is idle and this slot is busy for seconds, nor on a GPU-like server; unknown speed or a
    full queue: no."""
    planner = SlotPlanner(1, clock=Clock(step=0))
    assert not planner.worth_queueing(SYSTEM + " q2", 0, 0)  # speed unknown: as before
    timings = {"prompt_n": 300, "prompt_ms": 1800.0, "predicted_n": 8, "predicted_per_token_ms": 14.0}
    planner.rates.observe(timings, prompt_chars=1200, prompt_tokens=300)
    release, got = asyncio.Event(), []
    first = asyncio.create_task(hold(planner, SYSTEM + " q1", release, got))
    await started(first)
    planner.slots[0].ends_at = 0.2  # it frees in 0.2 s
    assert planner.worth_queueing(SYSTEM + " q2", 0, 0)
    assert not planner.worth_queueing(SYSTEM + " q2", len(SYSTEM), 0)  # kept there too
    planner.slots[0].ends_at = 5.0  # in 5 s
    assert not planner.worth_queueing(SYSTEM + " q2", 0, 0) and planner.worth_queueing(SYSTEM + " q2", 0, 4)
    assert not planner.worth_queueing("Another prompt altogether " * 40, 0, 0)  # nothing held here
    waiters = [asyncio.create_task(hold(planner, SYSTEM + f" w{i}", release, got)) for i in range(4)]
    await started(*waiters)
    assert planner.waiting == 4 and not planner.worth_queueing(SYSTEM + " q2", 0, 4)  # its queue is full
    release.set()
    await asyncio.gather(first, *waiters)
    gpu = SlotPlanner(1, clock=Clock(step=0))
    gpu.rates.observe({**timings, "prompt_ms": 15.0}, prompt_chars=1200, prompt_tokens=300)
    busy = asyncio.create_task(hold(gpu, SYSTEM + " q1", release := asyncio.Event(), got))
    await started(busy)
    gpu.slots[0].ends_at = 5.0  # its request runs another 5 s
    assert not gpu.worth_queueing(SYSTEM + " q2", 0, 0)
    release.set()
    await busy
