"""One owner per piece of state (issues 23 and 34): a context on an engine, a semantic call, a
variable's value and an engine slot are each changed only by their owner, on both sides of the
wire. A source scan, so that a new write elsewhere fails here rather than going unnoticed until
the integrity checks (or a call left ``running``) catch it."""

from __future__ import annotations

import re

import pytest
from conftest import REPO_ROOT

# (owner module, folder scanned, writes that only the owner may make)
OWNED = [
    (
        "engines/builtin/context_pool.py",  # the engine's contexts: tokens, blocks, progress
        "engines",
        r"\.(num_computed|last_hidden|block_hashes|freed|materialized)\s*(=|\+=|-=)[^=]"
        r"|\.token_ids\.(append|extend)\(|\.blocks\.(append|extend)\(|\.blocks\s*=[^=]",
    ),
    (
        "engines/builtin/block_manager.py",  # KV block reference counts and the free list
        "engines",
        r"\._refs\b|\b(blocks|block_manager|manager)\._(free|cached|hash_of|block_of)\b",
    ),
    (
        "platform/serve/contexts/manager.py",  # the ServeCore's contexts on engines
        "platform",
        r"\.(refs|doomed)\s*(=|\+=|-=)[^=]|\b(contexts|tree)\.(add|extend|remove|unref|touch)\(",
    ),
    (
        "platform/serve/calls/drive.py",  # a call's order, engine, timings, chains' results
        "platform",
        r"\.(seq|engine_id|latency_depth|group|result|timings|prompt_ids_by_model)\s*(=|\+=)[^=]"
        r"|\.timings\[[^]]*\]\s*=[^=]|\.timings\.(setdefault|pop|update|clear)\("
        r"|\.prompt_ids_by_model\[[^]]*\]\s*=[^=]",
    ),
    (
        "platform/serve/variables/values.py",  # a variable's value or error (a call's outcome)
        "platform/serve",
        r"\.(value|error)\s*=[^=]",
    ),
    (
        "platform/serve/scheduler/global_scheduler.py",  # an engine slot's load and health
        "platform",
        r"\.(task_limit|token_capacity|up|missed_pings|info|load|throughput_load|latency_ended_at)"
        r"\s*(=|\+=|-=)[^=]|\.running\[[^]]*\]\s*=[^=]|\.running\.(pop|clear|update)\("
        r"|\.latency_running\.(add|discard)\(|\bslot\.(take|release)\(",
    ),
]
# Where those fields are defined or built (a dataclass, a constructor), not changed.
DEFINERS = {
    "platform/serve/contexts/tree.py",
    "platform/serve/calls/graph.py",
    "platform/serve/variables/variable.py",
    "platform/serve/scheduler/slot.py",  # its take and release, which only the scheduler calls
}


@pytest.mark.parametrize(("owner", "folder", "pattern"), OWNED, ids=[o for o, _, _ in OWNED])
def test_only_the_owner_changes_context_state(owner, folder, pattern):
    writes = []
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel == owner or rel in DEFINERS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line.split("#")[0]):
                writes.append(f"{rel}:{n}: {line.strip()}")
    assert not writes, f"only {owner} may make these writes:\n" + "\n".join(writes)


def test_the_scan_sees_a_write():
    """The patterns match the writes they are for (else the test above could never fail)."""
    samples = {
        OWNED[0][2]: ["ctx.num_computed += n", "ctx.token_ids.append(t)", "ctx.blocks = []"],
        OWNED[1][2]: ["pool.blocks._refs[b] += 1", "manager._free.append(b)"],
        OWNED[2][2]: ["ctx.refs -= 1", "slot.contexts.remove(ctx)", "tree.add(symbols, owner)"],
        OWNED[3][2]: [
            "call.engine_id = engine_id",
            'call.timings["started_at"] = now',
            'request.timings.setdefault("first_token_at", t)',
            "chain.latency_depth = max(depth, chain.latency_depth)",
            "chain.group = (app, seq)",
            "chain.result = result",
            "chain.prompt_ids_by_model[model] = ids",
            "call.seq = next(self._seq)",
        ],
        OWNED[4][2]: ["var.value = value", "var.error = reason"],
        OWNED[5][2]: [
            "slot.up = False",
            "slot.missed_pings += 1",
            "slot.load -= need",
            "slot.running[key] = task",
            "slot.take(task, need)",
            "slot.throughput_load -= need",
        ],
    }
    for pattern, lines in samples.items():
        for line in lines:
            assert re.search(pattern, line), line
    assert not re.search(OWNED[0][2], "if ctx.num_computed == n:")
    assert not re.search(OWNED[3][2], "if call.seq == 0:")
    assert not re.search(OWNED[5][2], "if slot.up == up:")


@pytest.mark.parametrize(("owner", "folder", "pattern"), OWNED, ids=[o for o, _, _ in OWNED])
def test_the_owner_makes_the_writes_its_pattern_names(owner, folder, pattern):
    """Each pattern matches real writes in its owner's code (a pattern that matched nothing
    there would guard nothing)."""
    lines = (REPO_ROOT / owner).read_text().splitlines()
    assert any(re.search(pattern, line.split("#")[0]) for line in lines), owner
