"""A session's DAG in motion: completion chains become tasks once their inputs exist.

Each chain of a submitted call waits for its inputs (and the chain before it in its call);
while it waits, the part of its prompt that is known is filled ahead on an engine. Once all
inputs have values, its prompt is tokenized for the models that may run it and it goes to
the global scheduler as a :class:`CompletionTask`. A call whose inputs come from several
calls still running makes those producers a task group: they are ordered and placed
together, whenever the consumer arrives. Transform calls run on the ServeCore, in a worker
thread (:mod:`parrot.platform.serve.calls.transform_runner`).

Whatever stops a chain here (an error nobody expected included) fails its output variable
with the reason, so its call ends ``failed`` and its consumers ``producer_failed``: a
watcher task never dies with its exception unseen and the call left ``running``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.calls.graph import CompletionChain, PlaceholderFill, RequestChain, TransformGen
from parrot.platform.serve.calls.ledger import CallLedger
from parrot.platform.serve.calls.transform_runner import TransformRunner
from parrot.platform.serve.errors import TransformError
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.task import LATENCY, THROUGHPUT, CompletionTask
from parrot.platform.serve.variables.formats import FieldError
from parrot.wire.template import format_path

log = logging.getLogger(__name__)
TRANSFORM_ENGINE = "servecore"  # where a transform call runs, as its engine_id says


class GraphExecutor:
    """Turns a session's chains into tasks as their inputs become ready."""

    def __init__(
        self,
        session_id: str,
        scheduler: GlobalScheduler,
        seq: itertools.count,
        transforms: TransformRunner,
        calls: CallLedger,
    ) -> None:
        self.session_id = session_id
        self.scheduler = scheduler
        self.transforms = transforms  # the ServeCore's, shared by all sessions
        self.variables = scheduler.variables
        self.calls = calls  # where a transform's start is recorded
        self.seq = seq  # task arrival order, shared by all sessions
        self.app_seq: int | None = None  # submission order of this session's first call
        self._watchers: dict[str, asyncio.Task] = {}  # by chain key

    def submit(self, request: RequestChain, models: tuple[str, ...] = (), criteria: str = THROUGHPUT) -> None:
        if self.app_seq is None:
            self.app_seq = request.seq
        self._group_producers(request)
        for chain in request.chains:
            watcher = asyncio.create_task(self._when_ready(chain, models, criteria))
            self._watchers[chain.key] = watcher
            watcher.add_done_callback(lambda _, key=chain.key: self._watchers.pop(key, None))

    def _group_producers(self, request: RequestChain) -> None:
        """Unfinished producers of this call's inputs wait as one task group (the first
        consumer that waits on them together names the group)."""
        producers = {}
        for var in request.input_vars():
            chain = var.producer
            if chain is not None and not chain.settled and chain.request is not request:
                producers[chain.key] = chain
        if len(producers) < 2:
            return
        for chain in producers.values():
            if chain.group is None:
                chain.group = (self.app_seq or 0, request.seq)
        self.scheduler.wake()

    async def _when_ready(self, chain: CompletionChain, models: tuple[str, ...], criteria: str) -> None:
        try:
            await self._run_when_ready(chain, models, criteria)
        except asyncio.CancelledError:
            raise  # its session is gone (or the ServeCore stops): nothing to report
        except Exception as error:  # a bug: the call still ends, with the reason
            log.exception("chain %s of call %s failed", chain.key, chain.request.call_id)
            self.variables.fail(chain.gen.var, f"internal error: {error!r}")

    async def _run_when_ready(self, chain: CompletionChain, models: tuple[str, ...], criteria: str) -> None:
        if chain.settled:
            return  # settled before a restart: nothing to run
        waits = list(chain.input_vars())
        if chain.previous is not None:
            waits.append(chain.previous.gen.var)
        for var in waits:
            if not var.settled.is_set():
                self._fill_ahead(chain, models, criteria)
                await var.settled.wait()
            if var.error:
                self.variables.fail(chain.gen.var, f"input {var.name!r} failed: {var.error}")
                return
        why = missing_field(chain)
        if why is not None:
            self.variables.fail(chain.gen.var, why)
            return
        if isinstance(chain.gen, TransformGen):
            await self._transform(chain, chain.gen)
            return
        task = CompletionTask(
            chain,
            self.session_id,
            next(self.seq),
            app_seq=self.app_seq or 0,
            criteria=criteria,
            models=models,
        )
        try:
            await self._prompts(task)
        except (ParrotError, LookupError) as error:
            self.variables.fail(chain.gen.var, f"could not tokenize the prompt: {error}")
            return
        self.scheduler.submit(task)

    async def _prompts(self, task: CompletionTask) -> None:
        """The task's prompt for every kind of engine that may run it (usually one: a model,
        on builtin engines)."""
        slots = {s.prompt_key: s for s in self.scheduler.serving(task.models) if s.up}
        for slot in slots.values():
            await self.scheduler.runner.prompt(task, slot)

    def _fill_ahead(self, chain: CompletionChain, models: tuple[str, ...], criteria: str) -> None:
        latency = criteria == LATENCY or chain.latency_depth > 0
        self.scheduler.background(self.scheduler.fill_ahead(chain, self.session_id, models, latency))

    async def _transform(self, chain: CompletionChain, gen: TransformGen) -> None:
        """Transforms run on the ServeCore (string work needs no engine), in a worker thread
        within their time budget."""
        self.calls.started(chain.request, TRANSFORM_ENGINE)
        try:
            value = await self.transforms.apply(gen.steps, [v.value or "" for v in chain.input_vars()])
        except TransformError as error:
            self.variables.fail(gen.var, str(error))
        else:
            self.variables.set_value(gen.var, value)

    def cancel(self) -> None:
        for watcher in list(self._watchers.values()):
            watcher.cancel()


def missing_field(chain: CompletionChain) -> str | None:
    """Why a field the chain's template reads (``{{plan.steps[0]}}``) is not in its input's
    value, once the inputs are there (None: every field is)."""
    for node in chain.fills:
        if isinstance(node, PlaceholderFill) and node.path:
            try:
                node.text  # noqa: B018  (reads the field)
            except FieldError as error:
                return f"input {node.var.name!r} has no field {format_path(node.path)}: {error}"
    return None
