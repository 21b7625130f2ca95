"""The global scheduler: the dispatch loop over the ready queue and the engines.

Ready tasks wait in the queue in the policies' order and are placed on an engine as soon as
one has room for them (its running-task limit and KV tokens, from its pings; a llama.cpp
replica's queue for the slot holding their prefix: policy.prefix_queue). Placing a task makes
its contexts in the engine's tree at once, so the tasks placed right after it (its task
group, queued tasks sharing its prompt's prefix) go with it: the engine batches their shared
prefix. A task whose engine is lost runs again elsewhere; a session that goes takes its
queued and running tasks and its contexts with it.

The scheduler changes no call: it reports what happened to each task (started, finished, failed)
on the task's queue, and its submitter advances the call. It owns the engine slots, the one writer
of their state (tasks, load; health, capacity from pings); the context manager owns what engines hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.contexts.leases import Lease
from parrot.platform.serve.contexts.manager import ContextManager, spawn
from parrot.platform.serve.contexts.radix import common_prefix
from parrot.platform.serve.ops.metrics import ServeMetrics
from parrot.platform.serve.scheduler.fill_ahead import FillAhead
from parrot.platform.serve.scheduler.health import EngineMonitor, HealthSettings, Ping
from parrot.platform.serve.scheduler.policy import EngineRoles, SchedulingPolicy, prefix_queue
from parrot.platform.serve.scheduler.prompt import PromptBuilder
from parrot.platform.serve.scheduler.queue import TaskQueue
from parrot.platform.serve.scheduler.runner import Requeue, TaskRunner
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import (
    CompletionTask,
    Failed,
    Finished,
    Report,
    SchedulerStats,
    Started,
)

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4  # runs of one task (an engine lost, a parent context gone) before it fails


class GlobalScheduler:
    def __init__(
        self,
        prompts: PromptBuilder,
        contexts: ContextManager,
        policy: SchedulingPolicy | None = None,
        health: HealthSettings | None = None,
        metrics: ServeMetrics | None = None,
        parent_wait_s: float = 10.0,
        engine_loading: Callable[[], bool] = lambda: False,
    ) -> None:
        """``contexts`` owns what the engines hold; this scheduler owns the engines' slots.
        ``engine_loading``: whether the engine ``parrot serve`` started is still loading its
        model (tasks no engine serves yet wait for it instead of failing)."""
        self.engine_loading = engine_loading
        self.metrics = metrics or ServeMetrics()
        self.policy = policy or SchedulingPolicy()
        self.queue = TaskQueue(self.policy)
        self.engines: dict[str, EngineSlot] = {}  # by engine id
        self.fixed_limits: dict[str, int] = {}  # engines with a configured task limit
        self.stats = SchedulerStats()
        self.health = health or HealthSettings()
        self.runner = TaskRunner(prompts, self.policy, self.metrics, round(1000 * parent_wait_s))
        self.contexts = contexts
        self.monitor = EngineMonitor(self.health)
        self.ahead = FillAhead(prompts, contexts, self.runner, self.stats)
        self.roles = EngineRoles(self.policy.roles, self.policy.engine_roles and self.policy.criteria)
        self._jobs: dict[str, tuple[CompletionTask, asyncio.Task]] = {}  # running, by chain key
        self._background: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._loops: list[asyncio.Task] = []

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, monitor: bool = True) -> None:
        self._loops.append(asyncio.create_task(self._dispatch_loop()))
        if monitor:
            self._loops.append(asyncio.create_task(self._monitor_loop()))

    async def stop(self, free_timeout_s: float = 5.0) -> None:
        """Stop; free what this ServeCore holds on its engines (its contexts would outlive it)."""
        jobs = [job for _, job in self._jobs.values()]
        for task in [*self._loops, *jobs, *self._background]:
            task.cancel()
        await asyncio.gather(*self._loops, *jobs, *self._background, return_exceptions=True)
        await self.contexts.stop(free_timeout_s)

    def wake(self) -> None:
        """Look at the queue again (its order changed: a latency get, a new task group)."""
        self._wake.set()

    # -- engines ----------------------------------------------------------------------------
    def add_engine(
        self, slot: EngineSlot, task_limit: int | None = None, info: dict | None = None, up: bool = True
    ) -> None:
        """A new engine (``info``: its first ping; ``up``: False when it did not answer)."""
        if task_limit is not None:
            self.fixed_limits[slot.engine_id] = task_limit
            slot.task_limit = task_limit
        slot.up = up
        self._update(slot, info or {})
        self.engines[slot.engine_id] = slot
        self.contexts.track(slot)
        self._wake.set()

    def remove_engine(self, engine_id: str) -> EngineSlot | None:
        slot = self.engines.pop(engine_id, None)
        self.fixed_limits.pop(engine_id, None)
        if slot is not None:
            self._lose(slot)  # its running tasks leave it
            self.contexts.forget(slot)
            self._wake.set()
        return slot

    def serving(self, models: tuple[str, ...]) -> list[EngineSlot]:
        return [s for s in self.engines.values() if not models or s.model in models]

    def _lose(self, slot: EngineSlot) -> None:
        """The engine is gone: it is down, its contexts are forgotten (kept to free if it
        comes back), and its running tasks leave it at once, to run again elsewhere (a hung
        engine answers nothing: its tasks must not wait for an HTTP timeout)."""
        slot.up = False
        self.contexts.engine_lost(slot)
        for task in list(slot.running.values()):
            job = self._jobs[task.key][1]
            if job is not asyncio.current_task():  # (a task that saw the failure itself requeues)
                task.lost = True
                job.cancel()

    def _update(self, slot: EngineSlot, info: dict) -> None:
        """Capacity from a ping: the engine's KV size and its running-job limit."""
        slot.info = info
        total, block = info.get("kv_blocks_total"), info.get("block_size")
        if total and block:
            slot.token_capacity = int(total) * int(block)
        if slot.engine_id not in self.fixed_limits and info.get("max_running"):
            slot.task_limit = int(info["max_running"])

    async def _monitor_loop(self) -> None:
        while True:
            await self.check_engines()
            await asyncio.sleep(self.health.interval_s)

    async def check_engines(self) -> None:
        """One round of pings, each answer applied to its engine (the monitor loop runs one
        every ``interval_s``)."""
        for ping in await self.monitor.ping_all(list(self.engines.values())):
            try:
                await self._health(ping)
            except Exception:  # a bug in one engine's check must not end the monitoring
                log.exception("engine %s: health check failed", ping.slot.engine_id)
        self._wake.set()

    async def _health(self, ping: Ping) -> None:
        """Apply one ping: an engine that stops answering (killed, or stopped and still
        holding its port) is down after ``max_missed`` pings in a row; when it answers
        again it is up, and whatever its earlier contexts left on it is freed. Each answer
        carries its capacity and KV use: above the pressure mark, contexts no task needs
        are freed, least recently used first."""
        slot = ping.slot
        if ping.info is None:
            slot.missed_pings += 1
            if slot.up and slot.missed_pings >= self.health.max_missed:
                log.warning(
                    "engine %s missed %d pings (%s): down", slot.engine_id, slot.missed_pings, ping.error
                )
                self._lose(slot)
            return
        slot.missed_pings = 0
        self._update(slot, ping.info)
        if not slot.up:
            log.info("engine %s answers again: up", slot.engine_id)
            slot.up = True
            await self.contexts.free_stale(slot)
        await self.contexts.relieve(slot, self._queued_prompts(slot))

    # -- tasks ------------------------------------------------------------------------------
    async def run(self, task: CompletionTask) -> AsyncIterator[Report]:
        """Queue ``task`` and report what happens to it, until it finished or failed."""
        self.queue.add(task)
        self._wake.set()
        try:
            while not isinstance(report := await task.reports.get(), Finished | Failed):
                yield report
            yield report
        finally:
            self.queue.remove(task)  # its submitter went (its session is gone)

    async def prepare(self, task: CompletionTask) -> None:
        """The task's prompt for every kind of engine that may run it (usually one: a model,
        on builtin engines)."""
        slots = {s.prompt_key: s for s in self.serving(task.models) if s.up}
        for slot in slots.values():
            await self.runner.prompt(task, slot)

    def fill_ahead(
        self, chain, session_id: str, models: tuple[str, ...], latency: bool, beside_producer: bool = False
    ) -> None:
        """Fill a waiting chain's known prefix in the background (see :mod:`.fill_ahead`);
        ``beside_producer``: its input's producer is about to run."""
        candidates = [s for s in self.serving(models) if s.up]
        self.background(self.ahead.fill(chain, session_id, candidates, latency, beside_producer))

    async def drop_session(self, session_id: str, batch_frees: bool = False) -> None:
        """Stop everything of a session: its queued tasks leave, its running generations are
        aborted on their engines, and its contexts are freed there (``batch_frees``: with
        other sessions' in one request, if nothing of it was running)."""
        self.queue.take_session(session_id)
        # Its contexts, running generations included, are aborted on their engines before
        # this returns: nothing of the session keeps computing.
        before = self.contexts.of_session(session_id)
        jobs = [job for task, job in self._jobs.values() if task.session_id == session_id]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self.contexts.drop_session(session_id, before, batched=batch_frees and not jobs)

    @property
    def idle(self) -> bool:
        return not self._jobs  # no task is running

    # -- dispatch ---------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.queue.recount()
            for task in self.queue.ordered():
                if task not in self.queue:
                    continue  # placed with its group or a task sharing its prefix
                try:
                    if (slot := self._pick(task)) is None:
                        continue
                    lease, need = self._place(task, slot)
                    self._jobs[task.key] = (task, asyncio.create_task(self._execute(task, lease, need)))
                    for other in self._companions(task, slot):  # placed with it, in order
                        if self._admissible(other, [slot]):
                            lease, need = self._place(other, slot)
                            job = asyncio.create_task(self._execute(other, lease, need))
                            self._jobs[other.key] = (other, job)
                except Exception as error:  # a bug: this task fails, the loop and the rest go on
                    log.exception("dispatching call %s failed", task.chain.call.call_id)
                    self.queue.remove(task)
                    self._fail(task, f"internal error: {error!r}")

    def _pick(self, task: CompletionTask) -> EngineSlot | None:
        serving = self.serving(task.models)
        candidates = [s for s in serving if s.up]
        if not candidates:
            if not serving and self.engine_loading():
                return None  # registered once loaded (which wakes this loop)
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
        free = self._admissible(task, ready)
        waits = prefix_queue(task, ready, free, self.contexts.matched)  # a replica past its slots
        if waits is not None or not free:
            return waits

        def key(slot: EngineSlot) -> tuple:
            symbols = task.prompts[slot.prompt_key].symbols
            ahead = self.policy.placement(task, self.contexts.matched(slot, symbols), slot.load, len(symbols))
            return (*self.roles.rank(task, slot), ahead, slot.placed)  # ties: spread prompts

        return min(free, key=key)

    def _admissible(self, task: CompletionTask, ready: list[EngineSlot]) -> list[EngineSlot]:
        """The engines of ``ready`` with room for ``task`` that its role allows now."""
        free = [s for s in ready if s.fits(self._need(task, s))]
        up = [s for s in self.serving(task.models) if s.up]
        waiting = self.queue.waiting_throughput
        return self.roles.admissible(task, up, free, lambda s: self._need(task, s), waiting)

    def _need(self, task: CompletionTask, slot: EngineSlot) -> int:
        """KV tokens the task may add on ``slot``: its output and the part of its prompt the
        engine does not hold (or is not computing) already. Counting the whole prompt made
        64 users of one 2,048-token system prompt look like 134k tokens on a 46k-token
        engine: they ran in three waves."""
        return task.need(slot.prompt_key) - self.contexts.matched(slot, task.prompts[slot.prompt_key].symbols)

    def _companions(self, task: CompletionTask, slot: EngineSlot) -> list[CompletionTask]:
        """Queued tasks that should go where ``task`` went: its task group, and (context
        affinity) prompts sharing a long prefix with it that the engine can use there now (not
        a llama.cpp server's busy slots), so the engine batches them."""
        out: list[CompletionTask] = []
        if self.policy.task_groups and task.group is not None:
            out += [t for t in self.queue.in_group(task.group) if slot.prompt_key in t.prompts]
        if self.policy.context_affinity:
            mine = task.prompts[slot.prompt_key].symbols
            for other in self.queue.ordered():
                theirs = other.prompts.get(slot.prompt_key)
                if other in out or theirs is None or other.latency != task.latency:
                    continue
                shared = min(common_prefix(mine, theirs.symbols), self.contexts.matched(slot, theirs.symbols))
                if shared >= self.policy.cluster_min_shared:
                    out.append(other)
        return out

    def _place(self, task: CompletionTask, slot: EngineSlot) -> tuple[Lease, int]:
        """The task's contexts and load on ``slot``; its lease, and the KV tokens it may add."""
        self.queue.remove(task)
        task.tail = not task.latency and (task.chain.gathers or self.queue.ends_group(task))
        self.contexts.release_hold(task.key)
        need = self._need(task, slot)  # before placing: the task's own context joins the tree
        lease = self.contexts.place(task, slot, task.prompts[slot.prompt_key])
        self.stats.prompt_tokens += len(lease.prompt)
        self.stats.reused_tokens += lease.length
        slot.take(task, need)
        task.attempts += 1
        task.lost = False
        return lease, need

    async def _execute(self, task: CompletionTask, lease: Lease, need: int) -> None:
        slot = lease.slot
        task.reports.put_nowait(Started(slot.engine_id))
        report: Report | None
        try:
            report = await self.runner.generate(task, lease)
            self.stats.done += 1
        except asyncio.CancelledError:
            if not task.lost:
                raise  # its session is gone (or the ServeCore stops): nothing to report
            asyncio.current_task().uncancel()  # its engine went away: it runs again
            report = self._retry(task, f"engine {slot.engine_id} stopped answering its pings")
        except Requeue as why:
            if why.engine_failed and slot.up:  # the monitor brings it back once it answers
                self._lose(slot)
            report = self._retry(task, str(why))
        except ParrotError as error:
            report = Failed(str(error))
        except Exception as error:  # a bug: the variable still carries the reason
            log.exception("task of call %s failed", task.chain.call.call_id)
            report = Failed(f"internal error: {error!r}")
        finally:
            if slot.release(task, need):  # its engine may take throughput work after a while
                asyncio.get_running_loop().call_later(self.roles.settings.memory_s, self._wake.set)
            self._jobs.pop(task.key, None)
            self._wake.set()
        if isinstance(report, Failed):
            self.stats.failed += 1
        if report is not None:
            task.reports.put_nowait(report)

    def _retry(self, task: CompletionTask, reason: str) -> Failed | None:
        """Queue the task again (None), unless it ran too often or a client already saw some
        of its text (a rerun would repeat it, or say something else)."""
        stream = task.gen.var.stream
        if stream.seen:
            return Failed(reason)
        if task.attempts >= MAX_ATTEMPTS:
            return Failed(f"gave up after {task.attempts} attempts: {reason}")
        log.warning("call %s runs again: %s", task.chain.call.call_id, reason)
        stream.restart()
        self.stats.requeued += 1
        self.queue.add(task)
        return None

    def _fail(self, task: CompletionTask, reason: str) -> None:
        self.stats.failed += 1
        task.reports.put_nowait(Failed(reason))

    def _prepare_prompt(self, task: CompletionTask, slot: EngineSlot) -> None:
        async def prepare() -> None:
            try:
                await self.runner.prompt(task, slot)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # else the task would stay queued, its call pending
                if not isinstance(error, ParrotError):
                    log.exception("the prompt of call %s failed", task.chain.call.call_id)
                self.queue.remove(task)
                self._fail(task, f"could not tokenize the prompt for {slot.model}: {error}")
            self._wake.set()

        self.background(prepare())

    def _queued_prompts(self, slot: EngineSlot) -> list[Sequence]:
        """The prompts queued tasks have on ``slot`` (what they fork from is never evicted)."""
        return [t.prompts[slot.prompt_key].symbols for t in self.queue if slot.prompt_key in t.prompts]

    def background(self, work: Coroutine) -> None:
        spawn(self._background, work)
