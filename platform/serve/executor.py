"""The global scheduler: ready completion tasks of every session, run on the engines.

The graph executor (:mod:`parrot.platform.serve.graph_executor`) turns a chain into a
:class:`CompletionTask` once every input has a value (and the chain before it in its call
has generated). The scheduler picks an engine (model, capacity, prefix affinity,
criteria) and runs the task: its prompt pieces are taken from the engine's context tree
(forking the longest cached prefix), the output is generated in a fork, and the value
lands in the output variable, which wakes the chains that consume it. No client round
trip happens between dependent calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from parrot.engines.protocol.errors import (
    EngineUnavailableError,
    ParrotError,
)
from parrot.engines.protocol.schemas import GenerateResponse, StreamEnd
from parrot.platform.serve.context_manager import ContextTree, MemoryPressure, Piece
from parrot.platform.serve.engine_client import Engine
from parrot.platform.serve.graph import (
    CompletionChain,
    ConstantFill,
    PlaceholderGen,
)
from parrot.platform.serve.variables import Variables

log = logging.getLogger(__name__)

LATENCY, THROUGHPUT = "latency", "throughput"


@dataclass(frozen=True)
class SchedulingPolicy:
    """The global scheduler's policies, each on by default and each switchable."""

    app_fifo: bool = True  # downstream tasks of applications in progress before new ones
    task_groups: bool = True  # tasks one consumer waits on are scheduled together
    context_affinity: bool = True  # the engine holding the longest prompt prefix wins
    criteria: bool = True  # latency tasks first, to lightly loaded engines; throughput fills up


@dataclass(eq=False)
class EngineSlot:
    """An engine as the scheduler sees it."""

    engine_id: str
    model: str
    client: Engine
    tree: ContextTree
    capacity: int = 8  # tasks at once
    running: int = 0
    up: bool = True
    missed_pings: int = 0

    stale: list[ContextTree] = field(default_factory=list)  # trees of before it went down

    def mark_down(self) -> None:
        """The engine is gone, and its contexts (most likely) with it: start a fresh tree for
        when it returns, and keep the old one to free what survived (an in-process OpenAI
        engine keeps its text contexts; a network blip leaves a builtin engine's KV)."""
        self.up = False
        self.stale.append(self.tree)
        self.tree = ContextTree(self.client, self.tree.ids, self.tree.tokenize)

    async def free_stale(self) -> None:
        while self.stale:
            tree = self.stale.pop()
            with contextlib.suppress(ParrotError):
                for root in list(tree.roots.values()):
                    await tree.free_subtree(root)


@dataclass(eq=False)
class CompletionTask:
    chain: CompletionChain
    session_id: str
    seq: int  # arrival order of the task
    criteria: str = THROUGHPUT
    group: int | None = None  # tasks a consumer waits on together
    models: tuple[str, ...] = ()
    engine_id: str | None = None
    depth: int = 0  # of a latency-critical task: how far upstream of the awaited variable
    app_seq: int = 0  # arrival order of its session's first task, for app-FIFO
    streamed: bool = False  # some of its output already went to a streaming client

    def pieces(self) -> list[Piece]:
        out = []
        for node in self.chain.prompt_nodes():
            if isinstance(node, ConstantFill):
                if node.text:
                    out.append(Piece.constant(node.text))
            elif node.var.value:  # an input, or an earlier output of the call (empty: nothing)
                out.append(Piece.variable(node.var.var_id, node.var.value, self.session_id))
        return out


@dataclass
class SchedulerStats:
    done: int = 0
    failed: int = 0
    task_seconds: float = 0.0  # summed over done tasks
    pieces: int = 0  # prompt pieces of started tasks
    pieces_reused: int = 0  # of those, found in an engine's context tree (prefix hits)
    evicted: int = 0  # cached contexts freed under engine memory pressure


class GlobalScheduler:
    """Assigns ready tasks to engines and runs them."""

    def __init__(
        self,
        variables: Variables,
        pressure: MemoryPressure | None = None,
        policy: SchedulingPolicy | None = None,
    ) -> None:
        self.variables = variables
        self.pressure = pressure or MemoryPressure()
        self.policy = policy or SchedulingPolicy()
        self.engines: dict[str, EngineSlot] = {}
        self.queue: list[CompletionTask] = []
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._monitor_task: asyncio.Task | None = None
        self.on_start: Callable[[CompletionTask], None] | None = None
        self.on_done: Callable[[CompletionTask], None] | None = None
        # Chains a latency-critical get waits on (by id), with their depth upstream of it.
        self.latency_chains: dict[int, int] = {}
        self.stats = SchedulerStats()

    def add_engine(self, slot: EngineSlot) -> None:
        self.engines[slot.engine_id] = slot
        self._wake.set()

    def submit(self, task: CompletionTask) -> None:
        if id(task.chain) in self.latency_chains:
            task.criteria, task.depth = LATENCY, self.latency_chains[id(task.chain)]
        self.queue.append(task)
        self._wake.set()

    def start(self, monitor_interval_s: float | None = 2.0) -> None:
        self._loop_task = asyncio.create_task(self._dispatch_loop())
        if monitor_interval_s:
            self._monitor_task = asyncio.create_task(self.monitor(monitor_interval_s))

    def prioritize(self, chains: dict[int, int]) -> None:
        """A latency-critical get: its producers (chain id -> depth upstream of the awaited
        variable) go first, queued now or later; the deepest first, as the rest wait on it."""
        for chain_id, depth in chains.items():
            self.latency_chains[chain_id] = max(depth, self.latency_chains.get(chain_id, 0))
        for task in self.queue:
            if id(task.chain) in chains:
                task.criteria, task.depth = LATENCY, self.latency_chains[id(task.chain)]
        self._wake.set()

    def forget(self, chain: CompletionChain) -> None:
        """The chain is settled: drop its latency mark."""
        self.latency_chains.pop(id(chain), None)

    async def stop(self) -> None:
        for background in (self._loop_task, self._monitor_task):
            if background is not None:
                background.cancel()
        for t in list(self._tasks):
            t.cancel()

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.dispatch()

    def order(self, task: CompletionTask) -> tuple:
        """Latency-critical first (the deepest upstream first, as the rest wait on it), then
        task groups together, then the application that started first (app-FIFO: the
        downstream tasks of apps in progress before new apps), then arrival."""
        policy = self.policy
        return (
            (task.criteria != LATENCY, -task.depth) if policy.criteria else (False, 0),
            (task.group is None, task.group or 0) if policy.task_groups else (False, 0),
            task.app_seq if policy.app_fifo else 0,
            task.seq,
        )

    def dispatch(self) -> None:
        self.queue.sort(key=self.order)
        for task in list(self.queue):
            slot = self._pick(task)
            if slot is None:
                continue
            self.queue.remove(task)
            slot.running += 1
            task.engine_id = slot.engine_id
            if self.on_start is not None:
                self.on_start(task)
            job = asyncio.create_task(self._execute(task, slot))
            self._tasks.add(job)
            job.add_done_callback(self._tasks.discard)

    def _pick(self, task: CompletionTask) -> EngineSlot | None:
        serving = [s for s in self.engines.values() if not task.models or s.model in task.models]
        candidates = [s for s in serving if s.up]
        if not candidates:
            self.queue.remove(task)
            reason = "every engine that serves them is down" if serving else "no engine serves them"
            self.variables.fail(
                task.chain.gen.var, f"cannot run for models {list(task.models) or 'any'}: {reason}"
            )
            return None
        free = [s for s in candidates if s.running < s.capacity]
        if not free:
            return None
        pieces = task.pieces()

        # Context affinity: the engine holding the longest prefix of the prompt wins;
        # then latency tasks take the least loaded engine, throughput tasks the fullest.
        def score(s: EngineSlot) -> tuple:
            matched = s.tree.match(pieces)[1] if self.policy.context_affinity else 0
            fill_up = self.policy.criteria and task.criteria == THROUGHPUT
            return (-matched, -s.running if fill_up else s.running)

        return min(free, key=score)

    async def _execute(self, task: CompletionTask, slot: EngineSlot) -> None:
        gen: PlaceholderGen = task.chain.gen
        context = None
        finished = True
        started = time.monotonic()
        try:
            pieces = task.pieces()
            self.stats.pieces += len(pieces)
            self.stats.pieces_reused += slot.tree.match(pieces)[1]
            context = await slot.tree.acquire(pieces)
            output_id = next(slot.tree.ids)
            result = await self._generate(task, slot, output_id, context.context_id)
            await slot.client.free_context(output_id)
            task.chain.result = result
            self.variables.set_value(gen.var, result.text)
            self.stats.done += 1
            self.stats.task_seconds += time.monotonic() - started
        except asyncio.CancelledError:
            raise
        except EngineUnavailableError as error:
            if task.streamed:  # its client has seen tokens: a rerun elsewhere would repeat them
                slot.mark_down()
                context = None
                self.stats.failed += 1
                self.variables.fail(gen.var, f"engine {slot.engine_id} failed mid-stream: {error}")
                return
            # The engine died: run the task elsewhere (its contexts died with the engine).
            log.warning(
                "engine %s is down (%s); rescheduling call %s",
                slot.engine_id,
                error,
                task.chain.request.call_id,
            )
            slot.mark_down()
            context, finished = None, False
            self.queue.append(task)
        except Exception as error:  # the variable carries the reason to whoever waits for it
            log.warning("task of call %s failed: %s", task.chain.request.call_id, error)
            self.stats.failed += 1
            self.variables.fail(gen.var, str(error))
        finally:
            if context is not None:
                slot.tree.release(context)
            slot.running -= 1
            if finished:
                self.forget(task.chain)
                if self.on_done is not None:
                    self.on_done(task)
            self._wake.set()

    async def _generate(
        self, task: CompletionTask, slot: EngineSlot, output_id: int, parent_id: int
    ) -> GenerateResponse | StreamEnd:
        gen = task.chain.gen
        if gen.on_token is None:
            return await slot.client.generate(output_id, gen.sampling, parent_context_id=parent_id)
        async for event in slot.client.generate_stream(output_id, gen.sampling, parent_context_id=parent_id):
            if isinstance(event, StreamEnd):
                return event
            if event.text:
                task.streamed = True
                gen.on_token(event.text)
        raise EngineUnavailableError(f"engine {slot.engine_id} ended a stream without its end event")

    async def monitor(self, interval_s: float = 2.0, max_missed: int = 2) -> None:
        """Ping every engine: mark it down after ``max_missed`` failures, up when it answers."""
        while True:
            for slot in list(self.engines.values()):
                try:
                    info = await slot.client.ping()
                except EngineUnavailableError:
                    slot.missed_pings += 1
                    if slot.up and slot.missed_pings >= max_missed:
                        log.warning("engine %s missed %d pings: down", slot.engine_id, slot.missed_pings)
                        slot.mark_down()
                else:
                    slot.missed_pings = 0
                    if not slot.up:
                        slot.up = True
                        self._wake.set()
                        await slot.free_stale()
                    await self._relieve(slot, info)
            await asyncio.sleep(interval_s)

    async def _relieve(self, slot: EngineSlot, info: dict) -> None:
        keep = [t.pieces() for t in self.queue if not t.models or slot.model in t.models]
        with contextlib.suppress(EngineUnavailableError):  # the next ping finds out
            self.stats.evicted += await slot.tree.relieve(info, self.pressure, keep)
