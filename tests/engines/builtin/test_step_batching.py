"""Requests that reach the engine together start together: forks of a prefix computed in
the step they join, and a burst sent one request at a time to an idle engine (the real
default model, exact weights: outputs compared with each prompt computed alone)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from test_engine_forks import PROMPT, alone, freed_after, tokenize

from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.jobs import Job, JobKind
from parrot.engines.builtin.local_scheduler import LocalScheduler, SchedulerConfig
from parrot.wire.sampling import SamplingParams


@pytest.fixture
def ids(ids, client):
    """Context ids for one test, freed after it (test_engine_forks.py)."""
    yield from freed_after(ids, client)


@pytest.mark.parametrize("length", [37, 48])  # inside a block, on a block edge
@pytest.mark.parametrize("of", ["checkpoint", "prompt"])
def test_forks_of_a_checkpoint_join_the_step_that_computes_it(client, ids, engine, length, of):
    """Users behind one system prompt, sent together (a DAG's ready calls, concurrent
    apps): the first one's request computes the prompt and checkpoints it, the others fork
    the checkpoint. They share the blocks the first one writes in that same step and get
    take), and answer exactly what each prompt answers alone. Forks of the prompt's own
    context at that length join alike."""
    system = tokenize(client, PROMPT * 3)[:length]
    users = [tokenize(client, f"Question {n}: which bird is the loudest?") for n in range(4)]
    main, cp, *forks = (next(ids) for _ in range(2 + len(users) - 1))
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    hold = threading.Event()

    async def together() -> list:
        # The engine thread waits in a command while the requests queue up behind it: they
        # reach it together, as requests within its gather window do.
        engine._submit(hold.wait, (10,), None, reply=False)
        first = engine.generate(main, sampling, token_ids=system + users[0], checkpoints=[(cp, length)])
        parent = cp if of == "checkpoint" else main
        others = [
            engine.generate(f, sampling, parent, parent_len=length, token_ids=u, parent_timeout_ms=10_000)
            for f, u in zip(forks, users[1:], strict=True)
        ]
        tasks = [asyncio.ensure_future(c) for c in (first, *others)]
        await asyncio.sleep(0.2)
        before = engine.core.steps
        hold.set()
        results = await asyncio.gather(*tasks)
        return [engine.core.steps - before, *results]

    steps, *results = asyncio.run(together())
    assert steps == sampling.max_tokens  # every first token in the first step
    for result, user in zip(results, users, strict=True):
        assert list(result.token_ids) == alone(client, ids, system + user, 4)["token_ids"]


def test_plain_requests_that_compute_one_prompt_together_keep_one_copy_of_it(client, ids, engine):
    """Plain requests with one long system prompt, sent together (the chatbot's users on
    the OpenAI route): each computes the prompt in the first step, since none finds it
    cached yet. Once computed, the copies' full blocks are dropped for the first one's, so
    the requests share one prefix (attended once, one copy held), and each still answers
    what its prompt answers alone."""
    system = tokenize(client, "Tide tables of the harbour, read aloud. " + PROMPT * 4)  # cached nowhere yet
    prompts = [system + tokenize(client, f"Question {n}: which bird is the loudest?") for n in range(3)]
    cids = [next(ids) for _ in prompts]
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    hold = threading.Event()
    full = len(system) // 16

    async def together() -> tuple[list, list, int]:
        engine._submit(hold.wait, (10,), None, reply=False)
        tasks = [
            asyncio.ensure_future(engine.generate(c, sampling, token_ids=p))
            for c, p in zip(cids, prompts, strict=True)
        ]
        await asyncio.sleep(0.2)
        computed = engine.core.tokens_computed
        hold.set()
        results = await asyncio.gather(*tasks)
        tables = await engine._call(lambda: [list(engine.core.pool.contexts[c].blocks[:full]) for c in cids])
        return results, tables, engine.core.tokens_computed - computed

    results, tables, computed = asyncio.run(together())
    assert computed >= len(prompts) * len(system)  # each computed the prompt: none was cached yet
    assert tables[1] == tables[0] and tables[2] == tables[0]  # one copy of its full blocks
    for result, prompt in zip(results, prompts, strict=True):
        assert list(result.token_ids) == alone(client, ids, prompt, 4)["token_ids"]


def test_requests_that_keep_coming_to_an_idle_engine_start_in_one_step(client, ids, engine, monkeypatch):
    """A burst reaches an idle engine one request at a time (the consumers of calls that
    ended in one step, sent one after another): the engine waits while they keep coming,
    each within the gather window of the last, and starts them in one prefill step, where
    a window counted from the first left the later ones a step behind. The window is widened
    here (50 ms, at most 1 s) so that a loaded machine's scheduling cannot make the test lie;
    the requests come 20 ms apart, 100 ms in all."""
    import parrot.engines.builtin.engine as engine_module

    monkeypatch.setattr(engine_module, "GATHER_S", 0.05)
    monkeypatch.setattr(engine_module, "GATHER_MAX_S", 1.0)
    prompts = [tokenize(client, f"Question {n}: which bird sings at dawn?") for n in range(6)]
    sampling = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)

    async def burst() -> int:
        before = engine.core.steps
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.ensure_future(engine.generate(next(ids), sampling, token_ids=prompt)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        return engine.core.steps - before

    assert asyncio.run(burst()) == sampling.max_tokens  # every prompt in the first step


def test_a_fork_past_its_unmade_parents_fork_point_waits_for_it():
    """A fork of a fork not made yet takes the grandparent's blocks only for the tokens its
    parent takes from there: past that point the parent's own tokens come, so it waits for
    the parent as before (here the parent is a background fill, scheduled after it)."""
    contexts = ContextPool(BlockManager(64, 4), torch.zeros(1, 2, 64 * 4, 1, 2))
    sched = LocalScheduler(SchedulerConfig(max_batched_tokens=64), contexts)
    prompt = Context(context_id=1)
    parent = Context(context_id=2, parent=prompt, parent_id=1, parent_len=8)
    inside = Context(context_id=3, parent=parent, parent_id=2, parent_len=8)
    past = Context(context_id=4, parent=parent, parent_id=2, parent_len=10)
    sched.add(Job(JobKind.GENERATE, prompt, None, 1, fill_tokens=list(range(12)), sampling=SamplingParams()))
    sched.add(Job(JobKind.FILL, parent, None, 2, fill_tokens=[100, 101, 102], background=True))
    for n, ctx in ((3, inside), (4, past)):
        sched.add(Job(JobKind.GENERATE, ctx, None, n, fill_tokens=[200 + n], sampling=SamplingParams()))
    first = {item.context.context_id for item in sched.schedule()}
    assert {1, 3} <= first and 4 not in first  # the one within the fork point joins the step
    assert inside.token_ids == [*range(8), 203]
    while not past.materialized:
        for item in sched.schedule():
            item.context.num_computed = item.start + item.num_tokens
    assert past.token_ids == [*range(8), 100, 101, 204]  # its parent's tokens, not the prompt's
