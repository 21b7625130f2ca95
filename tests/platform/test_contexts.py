"""The radix tree of engine contexts: matching, forking points, ownership, exact accounting."""

from __future__ import annotations

import itertools
import random

import pytest

from parrot.platform.serve.contexts.radix import RadixTree, common_prefix
from parrot.platform.serve.contexts.tree import READY, ContextTree


def test_common_prefix_on_tokens_and_text():
    assert common_prefix((1, 2, 3, 4), (1, 2, 9)) == 2
    assert common_prefix("harbour", "harbor") == 5
    assert common_prefix((), (1,)) == 0 and common_prefix((5, 6), (5, 6)) == 2
    rng = random.Random(7)
    for _ in range(200):
        a = tuple(rng.randrange(3) for _ in range(rng.randrange(20)))
        b = tuple(rng.randrange(3) for _ in range(rng.randrange(20)))
        naive = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == naive


def test_paths_split_where_they_diverge_and_prune_when_released():
    tree: RadixTree[str] = RadixTree()
    end_a = tree.insert((1, 2, 3, 4, 5), "a")
    end_b = tree.insert((1, 2, 3, 9), "b")
    match = tree.match((1, 2, 3, 4, 7))
    assert match.length == 4 and match.node.holders == {"a"}
    shared = tree.match((1, 2, 3)).node
    assert shared.holders == {"a", "b"} and shared.end == 3
    assert tree.exclusive(end_a, "a") == 2 and tree.exclusive(end_b, "b") == 1
    tree.release(end_a, "a")
    assert tree.match((1, 2, 3, 4)).length == 3  # a's own part is gone, the shared prefix stays
    assert tree.exclusive(end_b, "b") == 4  # now b alone holds all of it
    tree.release(end_b, "b")
    assert list(tree.nodes()) == [] and tree.match((1, 2)).length == 0


def test_a_context_can_continue_from_its_end():
    tree: RadixTree[str] = RadixTree("")
    end = tree.insert("system prompt", "a")
    end = tree.insert(" and more", "a", start=end)
    assert tree.match("system prompt and more!").length == len("system prompt and more")
    assert end.end == len("system prompt and more")


def test_random_paths_match_what_was_inserted():
    rng = random.Random(3)
    tree: RadixTree[int] = RadixTree()
    paths = {}
    for holder in range(60):
        base = paths[rng.randrange(holder)] if holder and rng.random() < 0.7 else ()
        path = base[: rng.randrange(len(base) + 1)] + tuple(
            rng.randrange(4) for _ in range(rng.randrange(1, 9))
        )
        paths[holder] = path
        tree.insert(path, holder)
    for _ in range(300):
        query = tuple(rng.randrange(4) for _ in range(rng.randrange(12)))
        best = max(common_prefix(p, query) for p in paths.values())
        match = tree.match(query)
        assert match.length == best
        if best:  # every holder of the node holds the matched prefix
            assert all(paths[h][:best] == query[:best] for h in match.node.holders)


def test_fork_points_prefer_computed_shared_contexts():
    tree = ContextTree(itertools.count(1))
    mine = tree.add((1, 2, 3, 4, 5, 6), owner="s1")
    assert tree.fork_point((1, 2, 3, 7)).parent is mine  # pending: forks wait for it on the engine
    shared = tree.add((1, 2, 3), owner=None)
    shared.state = mine.state = READY
    point = tree.fork_point((1, 2, 3, 4, 9))
    assert point.parent is mine and point.length == 4  # only mine holds 4 tokens of it
    point = tree.fork_point((1, 2, 3, 8))
    assert point.parent is shared and point.length == 3  # both do: the shared one wins
    assert tree.fork_point((8, 8)).parent is None
    assert tree.shares_at((1, 2, 3)) and tree.shares_at((1, 2)) and not tree.shares_at((1, 2, 3, 4))


def test_owned_contexts_free_only_what_they_alone_hold():
    tree = ContextTree(itertools.count(1))
    system = tree.add(tuple(range(100)), owner=None)
    a = tree.add((*range(100), 500, 501), owner="a")
    b = tree.add((*range(100), 600), owner="b")
    assert tree.exclusive(a) == 2 and tree.exclusive(b) == 1 and tree.exclusive(system) == 0
    assert tree.held_symbols() == 103  # the shared prefix counted once
    assert [c.context_id for c in tree.of_session("a")] == [a.context_id]
    assert tree.remove(a) == 2 and tree.remove(a) == 0
    assert tree.remove(system) == 0  # b still holds the prefix: freeing it frees nothing
    assert tree.remove(b) == 101


def test_eviction_order_leaves_first_least_recently_used_never_in_use():
    tree = ContextTree(itertools.count(1))
    prefix = tree.add((1, 2, 3), owner=None)
    old = tree.add((1, 2, 3, 4), owner="s")
    new = tree.add((1, 2, 3, 5), owner="s")
    busy = tree.add((9, 9), owner="s")
    for ctx in (prefix, old, new, busy):
        ctx.state = READY
    old.last_used, new.last_used, prefix.last_used = 1.0, 2.0, 0.5
    busy.refs = 1
    assert tree.evictable() == [old, new, prefix]  # the prefix has children: after the leaves
    assert tree.evictable(protected={old.context_id}) == [new, prefix]
    pending = tree.add((7,), owner="s")  # being filled: not evictable
    assert pending not in tree.evictable()


def test_text_contexts_use_characters():
    tree = ContextTree(itertools.count(1), text=True)
    a = tree.add("<system>Be brief.</system>Q1", owner="s1")
    a.state = READY
    point = tree.fork_point("<system>Be brief.</system>Q2 and more")
    assert point.parent is a and point.length == len("<system>Be brief.</system>Q")


def test_a_task_needs_only_the_kv_its_engine_does_not_hold_yet():
    from types import SimpleNamespace

    from parrot.platform.serve.contexts.manager import ContextManager
    from parrot.platform.serve.contexts.tree import MemoryPressure
    from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
    from parrot.platform.serve.scheduler.slot import EngineSlot

    def user(question: int):
        symbols = tuple(range(2048)) + (10_000 + question,) * 40  # a shared prompt, then its own
        return SimpleNamespace(
            prompts={slot.prompt_key: SimpleNamespace(symbols=symbols)}, need=lambda key: len(symbols) + 32
        )

    slot = EngineSlot("e", "m", client=None)
    contexts = ContextManager(MemoryPressure())
    scheduler = GlobalScheduler(None, contexts)
    scheduler.add_engine(slot, info={"kv_blocks_total": 2912, "block_size": 16})
    slot.running = {"first": None}
    assert slot.token_capacity == 46_592
    first, second = user(1), user(2)
    assert scheduler._need(first, slot) == 2048 + 40 + 32  # nothing held yet
    contexts.tree(slot).add(first.prompts[slot.prompt_key].symbols, owner="s1")  # placed (still computing)
    slot.load = 2048 + 40 + 32  # what the first one added
    assert scheduler._need(second, slot) == 40 + 32  # the shared prompt is there
    # 64 such users fit in a 46k-token engine together (their whole prompts would not).
    assert slot.load + 63 * scheduler._need(second, slot) <= slot.token_capacity


class FreeLog:
    """An engine client that only records what it is asked to free (a unit-test fake)."""

    def __init__(self) -> None:
        self.freed: list[int] = []

    async def abort(self, context_ids: list[int]) -> None:
        self.freed += context_ids


def leased_engine():
    """A context manager with one engine slot (no engine behind it: bookkeeping only)."""
    from parrot.platform.serve.contexts.manager import ContextManager
    from parrot.platform.serve.contexts.tree import MemoryPressure
    from parrot.platform.serve.scheduler.slot import EngineSlot

    slot = EngineSlot("e", "m", client=FreeLog())
    manager = ContextManager(MemoryPressure(text_chars=0))
    manager.track(slot)
    return manager, slot


async def test_a_lease_holds_its_contexts_until_it_settles_and_the_accounting_adds_up():
    from types import SimpleNamespace

    from parrot.platform.serve.contexts.manager import ContextAccountingError
    from parrot.platform.serve.scheduler.prompt import Prompt

    manager, slot = leased_engine()
    first = manager.place(SimpleNamespace(session_id="s1"), slot, Prompt(tuple(range(40)), shared=(16,)))
    assert first.parent is None and [c.length for c in first.checkpoints] == [16]
    first.settle(SimpleNamespace(stop_string=None, text="", token_ids=[7, 8]))
    manager.check_integrity()
    # A second task of another session forks from the first one's whole prompt and output.
    second = manager.place(SimpleNamespace(session_id="s2"), slot, Prompt((*range(40), 7, 8, 9)))
    assert second.parent is first.context and second.length == 42 and list(second.tail) == [9]
    assert first.context.refs == 1 and second.request()["parent_len"] == 42
    manager.check_integrity()
    # The first session goes while the second task forks from its context: it is doomed,
    # and freed when the second task is done with it.
    await manager.drop_session("s1", manager.of_session("s1"))
    assert first.context.doomed and first.context.context_id in manager.tree(slot).contexts
    second.discard()
    assert first.context.context_id not in manager.tree(slot).contexts
    assert second.context.context_id not in manager.tree(slot).contexts
    manager.check_integrity()
    await manager.stop(free_timeout_s=5)  # the frees ran, each context freed once
    gone = [first.context.context_id, second.context.context_id, first.checkpoints[0].context_id]
    assert sorted(slot.client.freed) == sorted(gone) and not manager.tree(slot).contexts
    with pytest.raises(ContextAccountingError, match="ended twice"):
        second.settle(SimpleNamespace(stop_string=None, text="", token_ids=[1]))


def test_the_integrity_check_finds_accounting_that_does_not_add_up():
    from types import SimpleNamespace

    from parrot.platform.serve.contexts.manager import ContextAccountingError
    from parrot.platform.serve.scheduler.prompt import Prompt

    manager, slot = leased_engine()
    lease = manager.place(SimpleNamespace(session_id="s1"), slot, Prompt(tuple(range(40)), shared=(16,)))
    manager.check_integrity()
    lease.context.refs += 1  # a reference no lease or hold accounts for
    with pytest.raises(ContextAccountingError, match="has refs=2, but 1 leases and holds use it"):
        manager.check_integrity()
    lease.context.refs -= 1
    manager.check_integrity()
    manager.tree(slot).remove(lease.checkpoints[0])  # freed behind its owner's back
    with pytest.raises(ContextAccountingError, match="2 contexts made, 0 freed, but 1 in its trees"):
        manager.check_integrity()
    manager.tree(slot).contexts[lease.checkpoints[0].context_id] = lease.checkpoints[0]  # back, off its path
    with pytest.raises(ContextAccountingError, match="not where its path ends"):
        manager.check_integrity()
    del manager.tree(slot).contexts[lease.checkpoints[0].context_id]
    lease.context.doomed = True
    lease.context.refs = 0  # a doomed context that lost its last user without being freed
    with pytest.raises(ContextAccountingError, match="doomed context"):
        manager.check_integrity()
