"""The local scheduler's priorities: latency-critical jobs are admitted first, run in small
steps (a cap on the sequences and tokens sharing their step), and are preempted last; and
its chunking of prompts."""

from __future__ import annotations

import torch

from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.jobs import Job, JobKind
from parrot.engines.builtin.local_scheduler import LocalScheduler, SchedulerConfig
from parrot.wire.sampling import SamplingParams


def pool(blocks: int = 64) -> ContextPool:
    return ContextPool(BlockManager(blocks, 4), torch.zeros(1, 2, blocks * 4, 1, 2))


def scheduler(config: SchedulerConfig, contexts: ContextPool) -> LocalScheduler:
    return LocalScheduler(config, contexts)


def job(seq: int, priority: int, prompt: int = 6, kind: JobKind = JobKind.GENERATE) -> Job:
    ctx = Context(context_id=seq)
    return Job(
        kind,
        ctx,
        sink=None,
        seq=seq,
        fill_tokens=list(range(prompt)),
        sampling=SamplingParams(),
        priority=priority,
    )


def computed(items) -> dict[int, int]:
    """What a step computes, by context: (and marks it computed, as the runner does)."""
    out = {}
    for item in items:
        out[item.context.context_id] = item.num_tokens
        item.context.num_computed = item.start + item.num_tokens
        item.context.last_hidden = torch.zeros(1)
    return out


def test_a_latency_job_runs_in_small_steps_beside_bulk_work():
    config = SchedulerConfig(
        max_batched_tokens=64, max_running=16, latency_max_batch=3, latency_max_prefill_tokens=8
    )
    contexts = pool()
    sched = scheduler(config, contexts)
    for seq in range(6):
        sched.add(job(seq, priority=0, prompt=20))
    assert sum(computed(sched.schedule()).values()) == 64  # bulk alone: the full budget
    sched.add(job(99, priority=1, prompt=5))
    step = computed(sched.schedule())
    # The urgent job is in the step, first; at most 3 sequences, 8 prompt tokens of others.
    assert 99 in step and len(step) <= 3 and sum(step.values()) - step[99] <= 8
    assert step[99] == 5  # its own prefill is not cut for the others
    for _ in range(3):  # while it runs, every step stays small and includes it
        step = computed(sched.schedule())
        assert 99 in step and len(step) <= 3 and sum(step.values()) - step[99] <= 8
    urgent = next(j for j in sched.running if j.seq == 99)
    sched.remove(urgent)  # it finished: the cap is lifted
    step = computed(sched.schedule())
    assert len(step) > 3 and sum(step.values()) > 8


def test_beside_a_latency_job_other_decodes_go_on_and_only_prefill_waits():
    config = SchedulerConfig(max_batched_tokens=64, max_running=16, latency_max_prefill_tokens=0)
    contexts = pool()
    sched = scheduler(config, contexts)
    decoding = [job(seq, priority=0, prompt=4) for seq in range(3)]
    for j in decoding:
        sched.add(j)
    computed(sched.schedule())  # their prompts
    sched.add(job(99, priority=1, prompt=5))
    sched.add(job(50, priority=0, prompt=20))  # a new prompt: it waits
    for j in decoding:
        j.context.token_ids.append(1)  # each sampled a token: one to compute
    step = computed(sched.schedule())
    assert step == {0: 1, 1: 1, 2: 1, 99: 5}


def test_without_a_cap_latency_jobs_only_go_first():
    config = SchedulerConfig(max_batched_tokens=64, max_running=16, latency_max_prefill_tokens=None)
    sched = scheduler(config, pool())
    for seq in range(4):
        sched.add(job(seq, priority=0, prompt=20))
    sched.add(job(9, priority=1, prompt=20))
    step = computed(sched.schedule())
    assert next(iter(step)) == 9 and sum(step.values()) == 64


def test_when_blocks_run_out_the_lowest_priority_newest_job_gives_way():
    contexts = pool(blocks=12)  # 48 tokens in all
    sched = scheduler(SchedulerConfig(max_batched_tokens=64, max_running=16), contexts)
    urgent, old_bulk, new_bulk = job(1, 1, prompt=14), job(2, 0, prompt=14), job(3, 0, prompt=14)
    for j in (urgent, old_bulk, new_bulk):
        sched.add(j)
    computed(sched.schedule())
    for _ in range(8):  # decode until the cache is full and someone must give way
        for j in list(sched.running):
            j.context.token_ids.append(1)
        computed(sched.schedule())
        if sched.num_preemptions:
            break
    assert sched.num_preemptions >= 1
    assert urgent in sched.running and new_bulk in sched.waiting


def test_latency_jobs_are_never_held_back_by_the_caps_only_the_work_beside_them():
    config = SchedulerConfig(
        max_batched_tokens=64, max_running=16, latency_max_batch=2, latency_max_prefill_tokens=8
    )
    sched = scheduler(config, pool())
    for seq in range(5):
        sched.add(job(seq, priority=1, prompt=4))
    sched.add(job(50, priority=0, prompt=20))
    step = computed(sched.schedule())
    assert set(step) == {0, 1, 2, 3, 4}  # all five latency jobs, beyond the caps; no bulk


def test_a_background_fill_takes_what_the_step_can_spare():
    config = SchedulerConfig(max_batched_tokens=64, max_running=16, background_max_batched_tokens=6)
    sched = scheduler(config, pool())
    bulk = job(1, priority=0, prompt=4)
    ahead = job(2, priority=0, prompt=40, kind=JobKind.FILL)
    ahead.background = True
    sched.add(ahead)  # first in, yet the normal job goes first
    sched.add(bulk)
    step = computed(sched.schedule())
    assert step == {1: 4, 2: 6}  # beside other work: a slice per step
    assert computed(sched.schedule()) == {1: 0, 2: 6}
    sched.remove(bulk)
    assert computed(sched.schedule()) == {2: 28}  # alone: all it needs


def test_a_prompt_s_small_tail_joins_its_last_chunk():
    """A prompt just over the budget is not cut into a full chunk and a few tokens: the
    tail (at most budget / 32) costs no step of its own; a longer one does."""
    config = SchedulerConfig(max_batched_tokens=64, max_running=16)
    sched = scheduler(config, pool())
    sched.add(job(1, priority=0, prompt=66))
    assert computed(sched.schedule()) == {1: 66}
    sched = scheduler(config, pool())
    sched.add(job(2, priority=0, prompt=67))
    assert computed(sched.schedule()) == {2: 64}
    assert computed(sched.schedule()) == {2: 3}
