"""Contexts a killed ServeCore left on its engines.

Each run of a ServeCore takes its context ids from a region of its own (2**48 ids, see
:func:`~parrot.platform.serve.contexts.tree.context_ids`). A run that dies without freeing its
contexts (SIGKILL, a lost machine) leaves them on the engines, holding KV memory that no
one will ever fork from: the restarted ServeCore's context tree starts empty (KV caches
are not stored; restored calls build new contexts, in the new run's region). So the store
remembers the regions of the latest runs, and every builtin engine is asked, when it is
registered (at start, or later over the API), to free the contexts in those regions.
Other ServeCores sharing an engine (with their own databases) use other regions and keep
their contexts; a direct client of the engine uses ids below 2**48 and keeps its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.contexts.tree import ID_REGIONS, SERVECORE_CONTEXT_IDS

log = logging.getLogger(__name__)

STATE_NAME = "context_regions"
REGIONS_KEPT = 16  # earlier runs remembered: an engine down for more restarts keeps its orphans


def region_range(region: int) -> tuple[int, int]:
    """The context ids of a region: ``[start, end)``."""
    return region * SERVECORE_CONTEXT_IDS, (region + 1) * SERVECORE_CONTEXT_IDS


async def claim_region(store) -> tuple[int, tuple[int, ...]]:
    """A fresh region for this run, recorded in the store before any context is made; and
    the regions of the earlier runs (their contexts are orphans now)."""
    state = await store.get_state(STATE_NAME) or {}
    earlier = tuple(int(r) for r in state.get("regions", ()))
    region = 1 + secrets.randbelow(ID_REGIONS - 1)
    while region in earlier:
        region = 1 + secrets.randbelow(ID_REGIONS - 1)
    try:
        regions = {"regions": [region, *earlier][:REGIONS_KEPT]}
        await store.write(lambda db: db.set_state(STATE_NAME, regions))
    except Exception as error:  # a database that refuses writes must not stop the start
        log.warning("could not record this run's context ids (%s): a restart will not free them", error)
    return region, earlier


async def free_orphans(engine_name: str, client, regions: tuple[int, ...]) -> int:
    """Free the contexts of ``regions`` on one engine; returns how many were freed. An
    engine that cannot free by range (an OpenAI endpoint: its contexts lived in the dead
    process) or does not answer is left alone."""
    abort_range = getattr(client, "abort_range", None)
    if abort_range is None or not regions:
        return 0
    freed = 0
    for region in regions:
        with contextlib.suppress(ParrotError, asyncio.TimeoutError):
            freed += (await abort_range(*region_range(region))).freed_contexts
    if freed:
        log.warning("freed %d contexts an earlier run left on engine %s", freed, engine_name)
    return freed
