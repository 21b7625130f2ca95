"""The global scheduler: the dispatch loop over the ready queue and the engines.

Ready tasks wait in the queue in the policies' order and are placed on an engine as soon as
one has room for them (its running-task limit and KV tokens, from its pings). Placing a
task makes its contexts in the engine's tree at once, so the tasks placed right after it
(its task group, and queued tasks sharing its prompt's prefix) find it and go with it: the
engine sees them together and batches their shared prefix. A task whose engine is lost runs
again elsewhere; a session that goes takes its queued and running tasks and its contexts
with it. The scheduler owns the set of engine slots; what they hold is the context
manager's (platform/serve/contexts/manager.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.calls.graph import CompletionChain
from parrot.platform.serve.calls.ledger import CallLedger
from parrot.platform.serve.contexts.leases import Lease
from parrot.platform.serve.contexts.manager import ContextManager, spawn
from parrot.platform.serve.contexts.radix import common_prefix
from parrot.platform.serve.ops.metrics import ServeMetrics
from parrot.platform.serve.scheduler.health import EngineMonitor, HealthSettings
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.prompt import PromptBuilder
from parrot.platform.serve.scheduler.queue import TaskQueue
from parrot.platform.serve.scheduler.runner import Requeue, SchedulerStats, TaskRunner
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask
from parrot.platform.serve.variables.values import Variables

log = logging.getLogger(__name__)


MAX_ATTEMPTS = 4  # runs of one task (an engine lost, a parent context gone) before it fails
FILL_AHEAD_MIN = 16  # tokens: shorter known prefixes are not worth a request of their own


class GlobalScheduler:
    def __init__(
        self,
        variables: Variables,
        prompts: PromptBuilder,
        contexts: ContextManager,
        engines: dict[str, EngineSlot],
        policy: SchedulingPolicy | None = None,
        health: HealthSettings | None = None,
        metrics: ServeMetrics | None = None,
        *,
        calls: CallLedger,
    ) -> None:
        """``engines``: the slots, empty; this scheduler adds and removes them, ``contexts``
        (which the ServeCore built over the same slots) owns what they hold."""
        self.variables = variables
        self.calls = calls  # told when a task starts: the call's state advances there
        self.metrics = metrics or ServeMetrics()
        self.prompts = prompts
        self.policy = policy or SchedulingPolicy()
        self.queue = TaskQueue(self.policy)
        self.engines = engines
        self.fixed_limits: dict[str, int] = {}  # engines with a configured task limit
        self.stats = SchedulerStats()
        self.health = health or HealthSettings()
        parent_wait_ms = round(1000 * self.health.parent_wait_s)
        self.runner = TaskRunner(prompts, self.policy, self.stats, self.metrics, parent_wait_ms, calls)
        self.contexts = contexts
        self.monitor = EngineMonitor(
            self.health,
            self.contexts,
            on_down=lambda slot: self.wake(),
            on_up=lambda slot: self.wake(),
            queued=self._queued_prompts,
            fixed_limit=lambda slot: self.fixed_limits.get(slot.engine_id),
            on_round=self.wake,
        )
        self._jobs: dict[str, tuple[CompletionTask, asyncio.Task]] = {}  # running, by chain key
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
        await asyncio.gather(*self._loops, *jobs, *self._background, return_exceptions=True)
        await self.contexts.stop(free_timeout_s)

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
            self.contexts.engine_lost(slot)
            self.contexts.forget(slot)
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
        before = self.contexts.of_session(session_id)
        jobs = [job for task, job in self._jobs.values() if task.session_id == session_id]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self.contexts.drop_session(session_id, before)

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
        self.contexts.release_hold(task.key)
        need = self._need(task, slot)  # before placing: the task's own context joins the tree
        lease = self.contexts.place(task, slot, task.prompts[slot.prompt_key])
        self.stats.prompt_tokens += len(lease.prompt)
        self.stats.reused_tokens += lease.length
        slot.running[task.key] = task
        slot.load += need
        task.engine_id = slot.engine_id
        task.attempts += 1
        self.calls.started(task.chain.request, slot.engine_id)
        job = asyncio.create_task(self._execute(task, lease, need))
        self._jobs[task.key] = (task, job)

    @property
    def idle(self) -> bool:
        """No task is running."""
        return not self._jobs

    async def _execute(self, task: CompletionTask, lease: Lease, need: int) -> None:
        slot = lease.slot
        var = task.gen.var
        try:
            result = await self.runner.run(task, lease)
            task.chain.result = result
            self.variables.set_value(var, result.text, result.finish_reason)
        except Requeue as why:
            if task.attempts >= MAX_ATTEMPTS:
                self._fail(task, f"gave up after {task.attempts} attempts: {why}")
            else:
                log.warning("call %s runs again: %s", task.chain.request.call_id, why)
                self.stats.requeued += 1
                if why.engine_failed and slot.up:  # the monitor brings it back once it answers
                    slot.mark_down()
                    self.contexts.engine_lost(slot)
                    self.wake()
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
    def _queued_prompts(self, slot: EngineSlot) -> list:
        """The prompts queued tasks have on ``slot`` (what they fork from is never evicted)."""
        return [t.prompts[slot.prompt_key].symbols for t in self.queue if slot.prompt_key in t.prompts]

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
        lease = self.contexts.hold(chain.key, session_id, slot, prompt, FILL_AHEAD_MIN)
        if lease is None:
            return
        try:
            await self.runner.fill(lease, latency)
        except ParrotError as error:
            log.info("fill-ahead of %s failed (%s); the call fills it when it runs", chain.key, error)
            lease.discard()
            return
        except BaseException:
            lease.discard()
            raise
        lease.settle()
        self.stats.filled_ahead += len(lease.tail)

    def background(self, work: Coroutine) -> None:
        spawn(self._background, work)
