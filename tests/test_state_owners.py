"""One owner per piece of context state (issue 23): a context on an engine is changed only by
its owner, on both sides of the wire. A source scan, so that a new write elsewhere fails here
rather than going unnoticed until the integrity checks catch a leak."""

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
]
DEFINERS = {"platform/serve/contexts/tree.py"}  # the tree itself defines those methods


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
    }
    for pattern, lines in samples.items():
        for line in lines:
            assert re.search(pattern, line), line
    assert not re.search(OWNED[0][2], "if ctx.num_computed == n:")
