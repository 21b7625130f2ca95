"""The global scheduler: the dispatch loop over the ready queue and the engines.

Ready tasks wait in the queue in the policies' order and are placed on an engine as soon as
one has room for them (its running-task limit and KV tokens, from its pings). Placing a
task makes its contexts in the engine's tree at once, so the tasks placed right after it
(its task group, and queued tasks sharing its prompt's prefix) find it and go with it: the
engine sees them together and batches their shared prefix. A task whose engine is lost runs
again elsewhere; a session that goes takes its queued and running tasks and its contexts
with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.call_ledger import CallLedger
from parrot.platform.serve.contexts import READY, EngineContext, MemoryPressure, free_on_engine
from parrot.platform.serve.graph import CompletionChain
from parrot.platform.serve.metrics import ServeMetrics
from parrot.platform.serve.prompt import PromptBuilder
from parrot.platform.serve.radix import common_prefix
from parrot.platform.serve.scheduler.health import EngineMonitor, HealthSettings
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.queue import TaskQueue
from parrot.platform.serve.scheduler.runner import Requeue, SchedulerStats, TaskRunner
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask
from parrot.platform.serve.variables import Variables

log = logging.getLogger(__name__)


@dataclass(eq=False)
class AheadFill:
    """Contexts filled ahead for a waiting chain of a session, held until it runs."""

    session_id: str
    held: list[tuple[EngineSlot, EngineContext]] = field(default_factory=list)


MAX_ATTEMPTS = 4  # runs of one task (an engine lost, a parent context gone) before it fails
FILL_AHEAD_MIN = 16  # tokens: shorter known prefixes are not worth a request of their own


class GlobalScheduler:
    def __init__(
        self,
        variables: Variables,
        prompts: PromptBuilder,
        policy: SchedulingPolicy | None = None,
        pressure: MemoryPressure | None = None,
        health: HealthSettings | None = None,
        metrics: ServeMetrics | None = None,
        *,
        calls: CallLedger,
    ) -> None:
        self.variables = variables
        self.calls = calls  # told when a task starts: the call's state advances there
        self.metrics = metrics or ServeMetrics()
        self.prompts = prompts
        self.policy = policy or SchedulingPolicy()
        self.queue = TaskQueue(self.policy)
        self.engines: dict[str, EngineSlot] = {}
        self.fixed_limits: dict[str, int] = {}  # engines with a configured task limit
        self.stats = SchedulerStats()
        self.health = health or HealthSettings()
        parent_wait_ms = round(1000 * self.health.parent_wait_s)
        self.runner = TaskRunner(prompts, self.policy, self.stats, self._free, self.metrics, parent_wait_ms)
        self.monitor = EngineMonitor(
            self.health,
            pressure or MemoryPressure(),
            on_down=self._engine_lost,
            on_up=lambda slot: self.wake(),
            keep=self._protected,
            fixed_limit=lambda slot: self.fixed_limits.get(slot.engine_id),
            on_round=self.wake,
        )
        self._jobs: dict[str, tuple[CompletionTask, asyncio.Task]] = {}  # running, by chain key
        self._ahead: dict[str, AheadFill] = {}  # chain key -> contexts filled ahead for it
        self._background: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task] = []

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, monitor: bool = True) -> None:
        self._loops.append(asyncio.create_task(self._dispatch_loop()))
        if monitor:
            self._loops.append(asyncio.create_task(self.monitor.run(lambda: list(self.engines.values()))))

    async def stop(self, free_timeout_s: float = 5.0) -> None:
        """Stop dispatching and running; free what this ServeCore holds on its engines (its
        contexts would outlive it there), each engine bounded by ``free_timeout_s``."""
        jobs = [job for _, job in self._jobs.values()]
        for task in [*self._loops, *jobs, *self._background]:
            task.cancel()
        await asyncio.gather(*self._loops, *jobs, return_exceptions=True)
        frees = [
            asyncio.wait_for(free_on_engine(slot.client, list(slot.contexts.contexts)), free_timeout_s)
            for slot in self.engines.values()
            if slot.up and len(slot.contexts)
        ]
        await asyncio.gather(*frees, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()

    def add_engine(self, slot: EngineSlot, task_limit: int | None = None) -> None:
        if task_limit is not None:
            self.fixed_limits[slot.engine_id] = task_limit
            slot.task_limit = task_limit
        self.engines[slot.engine_id] = slot
        self.wake()

    def remove_engine(self, engine_id: str) -> EngineSlot | None:
        slot = self.engines.pop(engine_id, None)
        self.fixed_limits.pop(engine_id, None)
        if slot is not None:
            slot.mark_down()  # its running tasks leave it
            self.wake()
        return slot

    # -- tasks ------------------------------------------------------------------------------
    def submit(self, task: CompletionTask) -> None:
        self.queue.add(task)
        self.wake()

    def prioritize(self, producers: list[tuple[CompletionChain, int]]) -> None:
        """A latency-critical get: these chains (with their depth upstream of the awaited
        variable) go first, queued now or later; the deepest first, as the rest wait on it."""
        for chain, depth in producers:
            chain.latency_depth = max(depth, chain.latency_depth)
        self.wake()

    def serving(self, models: tuple[str, ...]) -> list[EngineSlot]:
        return [s for s in self.engines.values() if not models or s.model in models]

    async def drop_session(self, session_id: str) -> None:
        """Stop everything of a session: its queued tasks leave, its running generations are
        aborted on their engines, and its contexts are freed there."""
        self.queue.take_session(session_id)
        # Its contexts, running generations included, are aborted on their engines before
        # this returns: nothing of the session keeps computing.
        doomed = {slot: slot.contexts.of_session(session_id) for slot in self.engines.values()}
        jobs = [job for task, job in self._jobs.values() if task.session_id == session_id]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        for key in [k for k, ahead in self._ahead.items() if ahead.session_id == session_id]:
            self.release_ahead(key)
        for slot, gone in doomed.items():
            gone += slot.contexts.of_session(session_id)  # made while the jobs stopped
            for ctx in set(gone):
                if ctx.refs > 0 and ctx.state == READY:
                    # Another session's task forks from it (its request may not have reached
                    # the engine yet): it is freed when the last such task is done with it.
                    ctx.doomed = True
                else:
                    slot.contexts.remove(ctx)
            await free_on_engine(slot.client, sorted({c.context_id for c in gone if not c.doomed}))

    # -- dispatch ---------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.dispatch()

    def dispatch(self) -> None:
        for task in self.queue.ordered():
            if task not in self.queue:
                continue  # placed with its group or a task sharing its prefix
            try:
                self._dispatch(task)
            except Exception as error:  # a bug: this task fails, the loop and the rest go on
                log.exception("dispatching call %s failed", task.chain.request.call_id)
                self.queue.remove(task)
                self._fail(task, f"internal error: {error!r}")

    def _dispatch(self, task: CompletionTask) -> None:
        slot = self._pick(task)
        if slot is None:
            return
        self._start(task, slot)
        for other in self._companions(task, slot):
            if slot.fits(self._need(other, slot)):
                self._start(other, slot)

    def _pick(self, task: CompletionTask) -> EngineSlot | None:
        serving = self.serving(task.models)
        candidates = [s for s in serving if s.up]
        if not candidates:
            now = time.monotonic()
            task.stranded_at = task.stranded_at or now
            if serving and now - task.stranded_at < self.health.down_grace_s:
                return None  # its engines may come back (the monitor wakes us each round)
            self.queue.remove(task)
            why = f"every engine that serves them is down (for {self.health.down_grace_s:g} s)"
            reason = why if serving else "no engine serves them"
            self._fail(task, f"cannot run for models {list(task.models) or 'any'}: {reason}")
            return None
        task.stranded_at = None
        ready = [s for s in candidates if s.prompt_key in task.prompts]
        if not ready:  # an engine of a model its prompt was not made for: make it first
            self._prepare_prompt(task, candidates[0])
            return None
        free = [s for s in ready if s.fits(self._need(task, s))]
        if not free:
            return None

        def key(slot: EngineSlot) -> int:
            symbols = task.prompts[slot.prompt_key].symbols
            return self.policy.placement(task, slot.contexts.matched(symbols), slot.load, len(symbols))

        return min(free, key=key)

    @staticmethod
    def _need(task: CompletionTask, slot: EngineSlot) -> int:
        """KV tokens the task may add on ``slot``: its output and the part of its prompt the
        engine does not hold (or is not computing) already. Counting the whole prompt made
        64 users of one 2,048-token system prompt look like 134k tokens on a 46k-token
        engine: they ran in three waves."""
        symbols = task.prompts[slot.prompt_key].symbols
        return task.need(slot.prompt_key) - slot.contexts.matched(symbols)

    def _companions(self, task: CompletionTask, slot: EngineSlot) -> list[CompletionTask]:
        """Queued tasks that should go where ``task`` went: its task group, and (context
        affinity) prompts sharing a long prefix with it, so the engine batches them."""
        out: list[CompletionTask] = []
        if self.policy.task_groups and task.group is not None:
            out += [t for t in self.queue.in_group(task.group) if slot.prompt_key in t.prompts]
        if self.policy.context_affinity:
            mine = task.prompts[slot.prompt_key].symbols
            for other in self.queue.ordered():
                theirs = other.prompts.get(slot.prompt_key)
                if other in out or theirs is None or other.latency != task.latency:
                    continue
                if common_prefix(mine, theirs.symbols) >= self.policy.cluster_min_shared:
                    out.append(other)
        return out

    def _start(self, task: CompletionTask, slot: EngineSlot) -> None:
        self.queue.remove(task)
        self.release_ahead(task.key)
        need = self._need(task, slot)  # before placing: the task's own context joins the tree
        placed = self.runner.place(task, slot, task.prompts[slot.prompt_key])
        slot.running[task.key] = task
        slot.load += need
        task.engine_id = slot.engine_id
        task.attempts += 1
        self.calls.started(task.chain.request, slot.engine_id)
        job = asyncio.create_task(self._execute(placed, need))
        self._jobs[task.key] = (task, job)

    async def _execute(self, placed, need: int) -> None:
        task, slot = placed.task, placed.slot
        var = task.gen.var
        try:
            result = await self.runner.run(placed)
            task.chain.result = result
            self.variables.set_value(var, result.text)
        except Requeue as why:
            if task.attempts >= MAX_ATTEMPTS:
                self._fail(task, f"gave up after {task.attempts} attempts: {why}")
            else:
                log.warning("call %s runs again: %s", task.chain.request.call_id, why)
                self.stats.requeued += 1
                if why.engine_failed and slot.up:  # the monitor brings it back once it answers
                    slot.mark_down()
                    self._engine_lost(slot)
                self.queue.add(task)
        except asyncio.CancelledError:
            raise  # its session is gone (or the ServeCore stops): nothing to report
        except ParrotError as error:
            self._fail(task, str(error))
        except Exception as error:  # a bug: the variable still carries the reason
            log.exception("task of call %s failed", task.chain.request.call_id)
            self._fail(task, f"internal error: {error!r}")
        finally:
            slot.running.pop(task.key, None)
            slot.load -= need
            self._jobs.pop(task.key, None)
            self.wake()

    def _fail(self, task: CompletionTask, reason: str) -> None:
        self.stats.failed += 1
        self.variables.fail(task.gen.var, reason)

    def _engine_lost(self, slot: EngineSlot) -> None:
        """Its running tasks already see ``slot.lost``; what it held is gone with it."""
        for ahead in self._ahead.values():
            ahead.held = [(s, c) for s, c in ahead.held if s is not slot]
        self.wake()

    def _prepare_prompt(self, task: CompletionTask, slot: EngineSlot) -> None:
        async def prepare() -> None:
            try:
                await self.runner.prompt(task, slot)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # else the task would stay queued, its call pending
                if not isinstance(error, ParrotError):
                    log.exception("the prompt of call %s failed", task.chain.request.call_id)
                self.queue.remove(task)
                self._fail(task, f"could not tokenize the prompt for {slot.model}: {error}")
            self.wake()

        self.background(prepare())

    # -- contexts ---------------------------------------------------------------------------
    def _free(self, slot: EngineSlot, contexts: list[EngineContext]) -> None:
        for ctx in contexts:
            slot.contexts.remove(ctx)
        self.background(free_on_engine(slot.client, [c.context_id for c in contexts]))

    def _protected(self, slot: EngineSlot) -> set[int]:
        prompts = [t.prompts[slot.prompt_key].symbols for t in self.queue if slot.prompt_key in t.prompts]
        keep = slot.contexts.protected_by(prompts)
        keep.update(c.context_id for ahead in self._ahead.values() for s, c in ahead.held if s is slot)
        return keep

    async def fill_ahead(
        self, chain: CompletionChain, session_id: str, models: tuple[str, ...], latency: bool
    ) -> None:
        """Fill a waiting chain's known prompt prefix (up to its first input without a value)
        on the engine it will likely run on, so only the rest is computed once it is ready."""
        candidates = [s for s in self.serving(models) if s.up]
        if not candidates:
            return
        slot = min(candidates, key=lambda s: s.load)
        fetch = None if slot.text else slot.tokenize
        try:
            prompt = await self.prompts.known_prefix(chain, slot.model, fetch, slot.text)
        except ParrotError:
            return  # an optimization only
        if prompt is None or len(prompt) < FILL_AHEAD_MIN or chain.settled or not slot.up:
            return
        tree, symbols = slot.contexts, prompt.symbols
        point = tree.fork_point(symbols)
        if len(symbols) - point.length < FILL_AHEAD_MIN:
            return  # (nearly) all of it is there already
        if slot.token_capacity and tree.held_symbols() + len(symbols) > slot.token_capacity // 2:
            return  # memory is for running tasks first
        owner = None if prompt.shared and prompt.shared[-1] == len(symbols) else session_id
        ctx = tree.add(symbols, owner)
        parent = point.parent
        ctx.refs += 1
        if parent is not None:
            parent.refs += 1
        self._ahead.setdefault(chain.key, AheadFill(session_id)).held.append((slot, ctx))
        marks = [
            n
            for n in prompt.shared
            if n > point.length and n < len(symbols) and not tree.shares_at(symbols[:n])
        ]
        checkpoints = [tree.add(symbols[:n], owner=None) for n in marks]
        tail = symbols[point.length :]
        pending = parent is not None and parent.state != READY
        try:
            await slot.client.fill(
                ctx.context_id,
                **({"text": tail} if slot.text else {"token_ids": list(tail)}),
                parent_context_id=parent.context_id if parent is not None else None,
                parent_len=point.length if parent is not None else None,
                priority=1 if latency and self.policy.criteria else 0,
                checkpoints=[(c.context_id, c.length) for c in checkpoints],
                parent_timeout_ms=self.runner.parent_wait_ms if pending else 0,
                background=not latency,  # rides along the steps running work leaves room in
            )
        except ParrotError as error:
            log.info("fill-ahead of %s failed (%s); the call fills it when it runs", chain.key, error)
            self.release_ahead(chain.key)
            self._free(slot, [ctx, *checkpoints])
            return
        finally:
            if parent is not None and tree.unref(parent):
                self._free(slot, [parent])
        ctx.state = READY
        for mark in checkpoints:
            mark.state = READY
        self.stats.filled_ahead += len(tail)

    def release_ahead(self, key: str) -> None:
        """The chain runs (or never will): the contexts filled ahead for it are plain cached
        contexts from now on."""
        ahead = self._ahead.pop(key, None)
        for slot, ctx in ahead.held if ahead is not None else ():
            if slot.contexts.unref(ctx):
                self._free(slot, [ctx])

    def background(self, work: Coroutine) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        with contextlib.suppress(Exception):
            log.warning("background work failed: %r", task.exception())
