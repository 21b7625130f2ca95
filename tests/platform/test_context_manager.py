"""The prefix tree of engine contexts against the real engine: sharing, freeing, eviction."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import pytest_asyncio

from parrot.engines.protocol.errors import BadRequestError, UnknownContextError
from parrot.engines.protocol.sampling import SamplingParams
from parrot.platform.serve.context_manager import ContextTree, MemoryPressure, Piece
from parrot.platform.serve.engine_client import HttpEngine

pytestmark = pytest.mark.asyncio(loop_scope="function")

SYSTEM = "You are the lighthouse museum's guide. Answer in one short sentence. " * 8
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest_asyncio.fixture(loop_scope="function")
async def tree(engine_server, ids):
    engine = HttpEngine(engine_server.url)
    tree = ContextTree(engine, ids)
    yield tree
    for root in list(tree.roots.values()):
        await tree.free_subtree(root)
    await engine.aclose()


async def used_blocks(url: str) -> int:
    async with httpx.AsyncClient(base_url=url) as c:
        return (await c.get("/ping")).json()["kv_blocks_used"]


async def test_sessions_share_the_constant_prefix_context(tree, engine_server):
    before = await used_blocks(engine_server.url)
    a = await tree.acquire([Piece.constant(SYSTEM), Piece.variable("va", "Opening hours?", "s1")])
    after_one = await used_blocks(engine_server.url)
    b = await tree.acquire([Piece.constant(SYSTEM), Piece.variable("vb", "Ticket price?", "s2")])
    after_two = await used_blocks(engine_server.url)
    assert a.parent is b.parent and len(tree) == 3
    # The second session adds only its own piece's blocks, not the system prompt's again.
    assert after_two - after_one <= 2 < after_one - before
    # Generating from a fork of the shared tree equals generating from an unshared copy.
    engine = tree.engine
    forked = await engine.generate(next(tree.ids), GREEDY, parent_context_id=a.context_id)
    async with httpx.AsyncClient(base_url=engine_server.url) as c:
        tokens = []
        for text in (SYSTEM, "Opening hours?"):
            tokens += (await c.post("/tokenize", json={"text": text})).json()["token_ids"]
    alone = next(tree.ids)
    await engine.fill(alone, token_ids=tokens)
    unshared = await engine.generate(alone, GREEDY)
    assert forked.token_ids == unshared.token_ids
    await engine.free_context(alone)
    await engine.free_context(forked.context_id)
    tree.release(a)
    tree.release(b)


async def test_free_session_keeps_shared_and_held_contexts(tree):
    a = await tree.acquire([Piece.constant(SYSTEM), Piece.variable("va", "Q1", "s1")])
    tree.release(a)
    b = await tree.acquire([Piece.constant(SYSTEM), Piece.variable("vb", "Q2", "s2")])
    assert await tree.free_session("s1") == 1
    assert len(tree) == 2 and a.key not in a.parent.children
    with pytest.raises(UnknownContextError):
        await tree.engine.generate(a.context_id, GREEDY)
    assert await tree.free_session("s2") == 0  # still held by a task
    tree.release(b)
    assert await tree.free_session("s2") == 1


async def test_eviction_is_lru_and_never_touches_held_contexts(tree):
    held = await tree.acquire([Piece.constant("held prompt")])
    for i in range(3):
        tree.release(await tree.acquire([Piece.constant(f"prompt {i}")]))
    assert len(tree) == 4
    assert await tree.evict(max_contexts=2) == 2
    assert set(tree.roots) == {("text", "held prompt"), ("text", "prompt 2")}
    assert await tree.evict(max_contexts=0) == 1  # the held one stays
    assert set(tree.roots) == {("text", "held prompt")}
    tree.release(held)


async def test_a_failed_fill_leaves_nothing_held(tree):
    with pytest.raises(Exception, match="at least one token"):
        await tree.acquire([Piece.constant(SYSTEM), Piece.variable("v", "", "s1")])
    root = tree.roots[("text", SYSTEM)]
    assert root.refs == 0 and not root.children


async def test_memory_pressure_frees_the_least_recently_used_unneeded_contexts(tree, engine_server):
    """Above the high mark, unused leaves go, oldest first, until usage is at the low mark;
    a held context and one a queued task will need stay."""
    texts = [f"Archive record {n}: " + f"the keeper logged storm number {n} at dawn. " * 12 for n in range(5)]
    held = []
    for n, text in enumerate(texts):
        held.append(await tree.acquire([Piece.variable(f"v{n}", text, "pressure")]))
    for node in held[:4]:
        tree.release(node)  # held[4] stays in use
    async with httpx.AsyncClient(base_url=engine_server.url) as c:
        info = (await c.get("/ping")).json()
    per_context = -(-len(texts[0]) // 4 // info["block_size"])  # a rough lower bound, in blocks
    total, used = info["kv_blocks_total"], info["kv_blocks_used"]
    pressure = MemoryPressure(high=(used - 1) / total, low=(used - per_context) / total)
    keep = [[Piece.variable("v0", texts[0], "pressure")]]  # a queued task starts with v0
    evicted = await tree.relieve(info, pressure, keep)
    left = {n.key for n in tree._all()}
    assert evicted >= 1
    assert ("var", "v0") in left and ("var", "v4") in left  # queued-for and in use
    assert ("var", "v1") not in left  # the least recently used free one went first
    after = await used_blocks(engine_server.url)
    assert after <= used - per_context
    # Below the high mark nothing happens.
    calm = {**info, "kv_blocks_used": 0}
    assert await tree.relieve(calm, pressure, keep) == 0
    tree.release(held[4])
    with pytest.raises(ValueError):
        MemoryPressure(high=0.5, low=0.9)


async def test_concurrent_prompts_with_one_prefix_fill_it_once(tree, engine_server):
    async with httpx.AsyncClient(base_url=engine_server.url) as c:
        before = (await c.get("/ping")).json()["num_contexts"]
    nodes = await asyncio.gather(
        *(
            tree.acquire([Piece.constant(SYSTEM + " (concurrent)"), Piece.variable(f"c{n}", f"Q{n}?", "cc")])
            for n in range(8)
        )
    )
    assert len({n.parent.context_id for n in nodes}) == 1  # one shared prefix context
    async with httpx.AsyncClient(base_url=engine_server.url) as c:
        assert (await c.get("/ping")).json()["num_contexts"] - before == 1 + 8
    for node in nodes:
        tree.release(node)


async def test_a_failed_fill_fails_every_prompt_waiting_on_it_and_leaves_no_node(tree):
    huge = Piece.constant("tide " * 7000)  # more KV than the engine's whole cache
    results = await asyncio.gather(
        *(tree.acquire([huge, Piece.variable(f"h{n}", "x", "hh")]) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, BadRequestError) for r in results), results
    assert huge.key not in tree.roots


async def test_contexts_of_a_tree_marked_down_are_freed_when_the_engine_returns(tree, engine_server):
    from parrot.platform.serve.executor import EngineSlot

    node = await tree.acquire([Piece.variable("blip", "A network blip leaves this context behind.", "bl")])
    tree.release(node)
    slot = EngineSlot("e", "m", tree.engine, tree)
    async with httpx.AsyncClient(base_url=engine_server.url) as c:
        before = (await c.get("/ping")).json()["num_contexts"]
        slot.mark_down()
        assert len(slot.tree) == 0 and len(slot.stale) == 1
        await slot.free_stale()
        assert (await c.get("/ping")).json()["num_contexts"] == before - 1 and not slot.stale
