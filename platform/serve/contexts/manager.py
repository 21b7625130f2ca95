"""The one owner of the contexts the ServeCore holds on its engines.

Every change to a context on an engine goes through the :class:`ContextManager`: placing a
task (which returns a :class:`Lease` on the contexts its request forks from and makes),
filling a waiting chain's known prefix ahead (an :class:`AheadLease`, whose context is then
held for the chain until it runs), dropping a session, relieving an engine's memory,
forgetting what a lost engine held, freeing the orphans of earlier runs, and the actual
requests that free contexts on engines. The scheduler picks engines and the task runner
talks to them; neither changes a context.

The bookkeeping is checked by :meth:`ContextManager.check_integrity` (the tests run it
after every module that uses an engine): each context's ``refs`` is the number of live
leases and fill-ahead holds that use it, every context in a tree is held by its radix
path, and per engine the contexts made minus the contexts freed are the contexts still in
its trees. A context is only ever freed by removing it from its tree first, and only what
was removed is sent to the engine, so none is freed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Coroutine, Sequence

from parrot.platform.serve.contexts.frees import BatchedFrees
from parrot.platform.serve.contexts.leases import AheadFill, AheadLease, Lease, Result
from parrot.platform.serve.contexts.orphans import claim_region, free_orphans, region_range
from parrot.platform.serve.contexts.tree import (
    READY,
    ContextTree,
    EngineContext,
    MemoryPressure,
    context_ids,
    free_on_engine,
)
from parrot.platform.serve.scheduler.prompt import Prompt
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask

log = logging.getLogger(__name__)


def spawn(tasks: set[asyncio.Task], work: Coroutine) -> None:
    """Run ``work`` off the critical path, kept in ``tasks`` while it runs (to be awaited or
    cancelled at stop); a failure is logged, not raised to anyone."""
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        with contextlib.suppress(Exception):
            log.warning("background work failed: %r", task.exception())


class ContextAccountingError(RuntimeError):
    """The context manager's bookkeeping does not add up (a bug: some code changed a
    context behind its owner's back, or forgot to end a lease)."""


class ContextManager:
    def __init__(self, pressure: MemoryPressure) -> None:
        self.pressure = pressure
        self.ids = context_ids()
        self._trees: dict[EngineSlot, ContextTree] = {}  # by engine: the contexts held there
        # Context-id regions of earlier runs: their contexts are freed on each engine
        # registered (platform/serve/contexts/orphans.py).
        self.orphan_regions: tuple[int, ...] = ()
        self.evicted = 0  # cached contexts freed under engine memory pressure
        self._leases: set[Lease] = set()
        self._holds: dict[str, AheadFill] = {}  # chain key -> contexts filled ahead for it
        self._stale: dict[EngineSlot, list[ContextTree]] = {}  # trees of before an engine went down
        self._counts: dict[EngineSlot, list[int]] = {}  # contexts made, freed
        self._frees: set[asyncio.Task] = set()
        self.batched = BatchedFrees(self._background)  # frees nothing waits for (closed one-shot sessions)

    # -- engines ----------------------------------------------------------------------------
    async def claim_region(self, store) -> None:
        """This run's context ids; contexts of earlier runs are freed on their engines."""
        region, self.orphan_regions = await claim_region(store)
        self.ids = context_ids(region_range(region)[0])

    def track(self, slot: EngineSlot) -> None:
        """``slot`` is a new engine of this ServeCore: an empty tree of contexts for it."""
        self._trees[slot] = ContextTree(self.ids, slot.text)

    def tree(self, slot: EngineSlot) -> ContextTree:
        """The contexts held on ``slot`` (to read: only this manager changes them)."""
        return self._trees[slot]

    def matched(self, slot: EngineSlot, symbols: Sequence) -> int:
        """How much of ``symbols`` a context on ``slot`` holds (or is computing); on an
        endpoint whose engine knows what the server keeps (a llama.cpp server's planned
        slots, which keep prompts after their contexts are gone and compute a prefix again
        in each slot), what a request could use there now."""
        kept = getattr(slot.client, "kept_prefix", None) if slot.text else None
        usable = kept(symbols) if kept is not None else None
        return self._trees[slot].matched(symbols) if usable is None else usable

    async def free_orphans(self, engine_name: str, client) -> int:
        return await free_orphans(engine_name, client, self.orphan_regions)

    def engine_lost(self, slot: EngineSlot) -> None:
        """``slot`` was marked down: its contexts are (most likely) gone with it. A fresh
        tree starts for when it returns; the old one is kept to free what survived (a
        network blip leaves a builtin engine's KV). Its fill-ahead holds are dropped."""
        for hold in self._holds.values():
            for lease in [h for h in hold.held if h.slot is slot]:
                hold.held.remove(lease)
                self._unref(lease, lease.context)
        self._stale.setdefault(slot, []).append(self._trees[slot])
        self._trees[slot] = ContextTree(self.ids, slot.text)

    def forget(self, slot: EngineSlot) -> None:
        """``slot`` is no longer an engine of this ServeCore."""
        self._stale.pop(slot, None)
        self._counts.pop(slot, None)
        self._trees.pop(slot, None)

    async def free_stale(self, slot: EngineSlot) -> None:
        """``slot`` answers again: free what its trees of before it went down held."""
        while self._stale.get(slot):
            tree = self._stale[slot].pop()
            gone = list(tree.contexts.values())
            for ctx in gone:
                self._forget(slot, tree, ctx)
            await free_on_engine(slot.client, [c.context_id for c in gone])

    # -- tasks ------------------------------------------------------------------------------
    def place(self, task: CompletionTask, slot: EngineSlot, prompt: Prompt) -> Lease:
        """The task's contexts on ``slot``: it forks from the context holding its longest
        prefix, at the length matched; at least one token is computed by its request."""
        tree, symbols = self._trees[slot], prompt.symbols
        point = tree.fork_point(symbols)
        length = min(point.length, len(symbols) - 1)
        parent = point.parent if length > 0 else None
        marks = [n for n in prompt.shared if n > length and not tree.shares_at(symbols[:n])]
        context = self._add(slot, tree, symbols, task.session_id)
        checkpoints = [self._add(slot, tree, symbols[:n], None) for n in marks]
        lease = Lease(self, slot, tree, prompt, context, parent, length if parent else 0, checkpoints)
        for held in lease.refs():
            held.refs += 1
            tree.touch(held)
        self._leases.add(lease)
        return lease

    def settle(self, lease: Lease, result: Result) -> None:
        self._end(lease)
        ctx = lease.context
        ctx.state = READY
        for mark in lease.checkpoints:
            mark.state = READY
        if lease.slot.text or not result.stop_string:  # the context holds exactly prompt + output
            lease.tree.extend(ctx, result.text if lease.slot.text else tuple(result.token_ids))
        else:  # a stop string cut the text: its KV holds more than the value; not reusable
            self._free(lease.slot, lease.tree, [ctx])

    def discard(self, lease: Lease) -> None:
        self._free(lease.slot, lease.tree, [lease.context, *lease.checkpoints])
        self._end(lease)

    def _end(self, lease: Lease) -> None:
        if lease not in self._leases:
            raise ContextAccountingError(f"lease of context {lease.context.context_id} ended twice")
        self._leases.remove(lease)
        for held in lease.refs():
            self._unref(lease, held)

    # -- fill-ahead -------------------------------------------------------------------------
    def hold(
        self, key: str, session_id: str, slot: EngineSlot, prompt: Prompt, min_new: int
    ) -> AheadLease | None:
        """Contexts for filling ``prompt`` (a waiting chain's known prefix) ahead on ``slot``,
        held for the chain; None when under ``min_new`` symbols of it are new there, or the
        engine's memory is for running tasks first."""
        tree, symbols = self._trees[slot], prompt.symbols
        point = tree.fork_point(symbols)
        if len(symbols) - point.length < min_new:
            return None  # (nearly) all of it is there already
        if slot.token_capacity and tree.held_symbols() + len(symbols) > slot.token_capacity // 2:
            return None
        owner = None if prompt.shared and prompt.shared[-1] == len(symbols) else session_id
        ctx = self._add(slot, tree, symbols, owner)
        parent = point.parent
        marks = [
            n
            for n in prompt.shared
            if n > point.length and n < len(symbols) and not tree.shares_at(symbols[:n])
        ]
        checkpoints = [self._add(slot, tree, symbols[:n], None) for n in marks]
        lease = AheadLease(
            self, slot, tree, prompt, ctx, parent, point.length if parent else 0, checkpoints, key
        )
        ctx.refs += 1
        if parent is not None:
            parent.refs += 1
        self._holds.setdefault(key, AheadFill(session_id)).held.append(lease)
        self._leases.add(lease)
        return lease

    def settle_ahead(self, lease: AheadLease) -> None:
        self._end(lease)
        lease.context.state = READY
        for mark in lease.checkpoints:
            mark.state = READY

    def release_hold(self, key: str) -> None:
        """The chain runs (or never will): the contexts filled ahead for it are plain cached
        contexts from now on."""
        ahead = self._holds.pop(key, None)
        for lease in ahead.held if ahead is not None else ():
            self._unref(lease, lease.context)

    # -- sessions and memory ----------------------------------------------------------------
    def of_session(self, session_id: str) -> dict[EngineSlot, list[EngineContext]]:
        return {slot: tree.of_session(session_id) for slot, tree in self._trees.items()}

    async def drop_session(
        self, session_id: str, before: dict[EngineSlot, list[EngineContext]], batched: bool = False
    ) -> None:
        """Free a session's contexts (``before``: those it had before its running tasks
        were stopped) on their engines, before this returns: nothing of the session keeps
        computing. Its fill-ahead holds go. ``batched``: nothing of it was computing, so
        the frees may wait for a batch (:mod:`.frees`); they leave its trees at once."""
        for key in [k for k, ahead in self._holds.items() if ahead.session_id == session_id]:
            self.release_hold(key)
        for slot, gone in before.items():
            if slot not in self._trees:
                continue  # removed meanwhile
            tree = self._trees[slot]
            gone = gone + tree.of_session(session_id)  # made while the jobs stopped
            for ctx in set(gone):
                if ctx.refs > 0 and ctx.state == READY:
                    # Another session's task forks from it (its request may not have reached
                    # the engine yet): it is freed when the last such task is done with it.
                    ctx.doomed = True
                else:
                    self._forget(slot, tree, ctx)
            # Those its stopped tasks discarded too: their frees run in the background.
            ids = sorted({c.context_id for c in gone if not c.doomed})
            if batched:
                self.batched.add(slot.client, ids)
            else:
                await free_on_engine(slot.client, ids)

    async def relieve(self, slot: EngineSlot, queued: list[Sequence]) -> int:
        """Free contexts no task needs (``queued``: the prompts of the queued tasks, which
        will fork from them), least recently used first, while the engine's KV use is
        above the pressure mark, or the contexts held exceed what the engine can hold."""
        tree = self._trees[slot]
        info = slot.info
        total, used, block = info.get("kv_blocks_total"), info.get("kv_blocks_used"), info.get("block_size")
        to_free = 0  # symbols
        if total and block and used is not None and used > self.pressure.high * total:
            to_free = int((used - self.pressure.low * total) * block)
        limit = self.pressure.text_chars if slot.text else slot.token_capacity
        if limit is not None:
            to_free = max(to_free, tree.held_symbols() - limit)
        if to_free <= 0:
            return 0
        protected = tree.protected_by(queued)
        protected.update(h.context.context_id for a in self._holds.values() for h in a.held if h.slot is slot)
        gone: list[EngineContext] = []
        for ctx in tree.evictable(protected):
            if to_free <= 0:
                break
            to_free -= self._forget(slot, tree, ctx)  # what only it held: a fork's parent part is not counted
            gone.append(ctx)
        self.evicted += len(gone)
        await free_on_engine(slot.client, [c.context_id for c in gone])
        return len(gone)

    async def stop(self, free_timeout_s: float) -> None:
        """Free everything held on the engines that are up (the contexts would outlive this
        ServeCore there), each engine bounded by ``free_timeout_s``."""
        self.batched.flush()
        if self._frees:
            await asyncio.wait(list(self._frees), timeout=free_timeout_s)
        frees = []
        for slot, tree in self._trees.items():
            gone = list(tree.contexts.values())
            if not slot.up or not gone:
                continue
            for ctx in gone:
                self._forget(slot, tree, ctx)
            frees.append(
                asyncio.wait_for(free_on_engine(slot.client, [c.context_id for c in gone]), free_timeout_s)
            )
        await asyncio.gather(*frees, return_exceptions=True)

    # -- the bookkeeping --------------------------------------------------------------------
    def _add(
        self, slot: EngineSlot, tree: ContextTree, symbols: Sequence, owner: str | None
    ) -> EngineContext:
        self._counts.setdefault(slot, [0, 0])[0] += 1
        return tree.add(symbols, owner)

    def _forget(self, slot: EngineSlot, tree: ContextTree, ctx: EngineContext) -> int:
        """Take ``ctx`` out of ``tree`` (the caller frees it on the engine if it was there);
        returns the symbols only it held."""
        if ctx.context_id not in tree.contexts:
            return 0
        self._counts.setdefault(slot, [0, 0])[1] += 1
        return tree.remove(ctx)

    def _free(self, slot: EngineSlot, tree: ContextTree, contexts: list[EngineContext]) -> None:
        """Forget contexts and free them on their engine, off the critical path. Those of
        a tree from before the engine went down stay in it: they are freed all at once if
        the engine answers again."""
        if tree is not self._trees.get(slot):
            return
        gone = [c for c in contexts if c.context_id in tree.contexts]
        for ctx in gone:
            self._forget(slot, tree, ctx)
        if gone:
            self._background(free_on_engine(slot.client, [c.context_id for c in gone]))

    def _unref(self, lease: Lease, ctx: EngineContext) -> None:
        if lease.tree.unref(ctx):  # doomed, and its last user is done
            self._free(lease.slot, lease.tree, [ctx])

    def _background(self, work: Coroutine) -> None:
        spawn(self._frees, work)

    def check_integrity(self) -> None:
        """Raise :class:`ContextAccountingError` unless the bookkeeping adds up (see the
        module's docstring). Valid at any moment between two awaits."""
        expected: Counter[EngineContext] = Counter()
        for lease in self._leases:
            expected.update(lease.refs())
        problems: list[str] = []
        for key, ahead in self._holds.items():
            for lease in ahead.held:
                expected[lease.context] += 1
                if lease.context.context_id not in lease.tree.contexts:
                    problems.append(f"context {lease.context.context_id} held for {key} after it was freed")
        for slot, current in self._trees.items():
            live = 0
            for tree in [current, *self._stale.get(slot, ())]:
                problems += [f"engine {slot.engine_id}: {p}" for p in tree.problems()]
                for ctx in tree.contexts.values():
                    live += 1
                    if ctx.refs != expected[ctx]:
                        problems.append(
                            f"engine {slot.engine_id}: context {ctx.context_id} has refs={ctx.refs}, "
                            f"but {expected[ctx]} leases and holds use it"
                        )
                    if ctx.doomed and ctx.refs <= 0 and tree is current:
                        problems.append(
                            f"engine {slot.engine_id}: doomed context {ctx.context_id} is not freed"
                        )
            made, freed = self._counts.get(slot, (0, 0))
            if made - freed != live:
                problems.append(
                    f"engine {slot.engine_id}: {made} contexts made, {freed} freed, but {live} in its trees"
                )
        if problems:
            raise ContextAccountingError("context accounting is off:\n  " + "\n  ".join(problems))
