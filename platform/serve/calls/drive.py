"""Driving semantic calls: the one place a call's state advances, and is journaled.

Each chain of a started call waits for its inputs (and the chain before it in its call);
while it waits, the part of its prompt that is known is filled ahead on an engine. Once its
inputs have values its prompt is tokenized and it goes to the global scheduler as a
:class:`CompletionTask`; the scheduler reports what happens to it (started on an engine,
finished, failed) and the driver applies each report. Transform calls run on the ServeCore,
in a worker thread. A call whose inputs come from several calls still running makes those
producers a task group: they are ordered and placed together. A latency-critical get marks
the producers of what it waits for, back through the DAG.

Everything a call is — its submission order, engine and timings, each chain's result,
group and latency depth, its outputs' values or errors and so its state — is written here
and nowhere else (``tests/test_state_owners.py``), as nano-vllm's ``postprocess`` alone
advances a sequence. Whatever stops a chain (an error nobody expected included) fails its
output with the reason, so the call ends ``failed`` and its consumers ``producer_failed``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from contextlib import aclosing

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.calls import graph
from parrot.platform.serve.calls.graph import CompletionChain, PlaceholderFill, RequestChain, TransformGen
from parrot.platform.serve.calls.state import CallState
from parrot.platform.serve.calls.transform_runner import TransformRunner
from parrot.platform.serve.errors import TransformError
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.ops.activity import ActivityLog
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.task import LATENCY, CompletionTask, Finished, Started
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.formats import FieldError
from parrot.platform.serve.variables.values import VariableValues
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.platform.store.models import CallRecord
from parrot.wire.template import format_path

log = logging.getLogger(__name__)
TRANSFORM_ENGINE = "servecore"  # where a transform call runs, as its engine_id says


class CallDriver:
    def __init__(
        self,
        journal: Journal,
        admission: Admission,
        activity: ActivityLog,
        values: VariableValues,
        scheduler: GlobalScheduler,
        transforms: TransformRunner,
    ) -> None:
        self.journal = journal
        self.admission = admission
        self.activity = activity
        self.values = values
        self.scheduler = scheduler
        self.transforms = transforms  # shared by all sessions
        self._seq = itertools.count(1)  # call submission order, kept across restarts
        self._task_seq = itertools.count()  # task arrival order, over all sessions
        self._watchers: dict[str, asyncio.Task] = {}  # a chain's coroutine, by chain key

    # -- a call's life ------------------------------------------------------------------------
    def number(self, call: RequestChain) -> None:
        """A call accepted: its submission order and time (stored with it)."""
        call.seq = next(self._seq)
        call.timings["submitted_at"] = time.time()

    def restore(self, call: RequestChain, record: CallRecord) -> None:
        """A call rebuilt from its record: as it was, except that an unfinished one runs
        again from its start (its earlier start and first token are forgotten)."""
        call.seq = record.seq
        self._seq = itertools.count(max(record.seq + 1, next(self._seq)))
        call.engine_id = record.engine_id
        call.timings = dict(record.timings)
        if not call.state.settled:
            for mark in ("started_at", "first_token_at"):
                call.timings.pop(mark, None)

    def start(self, session: Session, call: RequestChain, models: tuple[str, ...], criteria: str) -> None:
        """Run a stored call: each chain as soon as its inputs are there."""
        if criteria == LATENCY:
            self.prioritize(session, call.output_vars())
        self._group_producers(session, call)
        for chain in call.chains:
            watcher = asyncio.create_task(self._drive(session, chain, models, criteria))
            self._watchers[chain.key] = watcher
            watcher.add_done_callback(lambda _, key=chain.key: self._watchers.pop(key, None))

    def prioritize(self, session: Session, targets: Sequence[SemanticVariable]) -> None:
        """A latency-critical get: the unfinished producers of ``targets``, back through the
        DAG, go first (the deepest first, as the rest waits on it), queued now or later. The
        scheduler reads the marks at its next dispatch, which comes as soon as an engine has
        room: a task is only ever queued for want of it, so waking it now would change nothing."""
        for var in targets:
            for chain, depth in graph.producers_of(var):
                if not chain.settled:
                    chain.latency_depth = max(depth, chain.latency_depth)

    def stop(self, session: Session) -> None:
        """The session is gone: its chains stop waiting and running here."""
        for call in session.calls.values():
            for chain in call.chains:
                watcher = self._watchers.get(chain.key)
                if watcher is not None:
                    watcher.cancel()

    def _group_producers(self, session: Session, call: RequestChain) -> None:
        """Unfinished producers of this call's inputs wait as one task group (the first
        consumer that waits on them together names the group)."""
        producers = {}
        for var in call.input_vars():
            chain = var.producer
            if chain is not None and not chain.settled and chain.call is not call:
                producers[chain.key] = chain
        if len(producers) < 2:
            return
        app_seq = self._app_seq(session)
        for chain in producers.values():
            if chain.group is None:
                chain.group = (app_seq, call.seq)  # (read at the next dispatch, as above)
        for chain in call.chains:
            chain.gathers = True

    @staticmethod
    def _app_seq(session: Session) -> int:
        """Submission order of the session's first call (its application's start)."""
        return next((call.seq for call in session.calls.values()), 0)

    # -- one chain --------------------------------------------------------------------------
    async def _drive(
        self, session: Session, chain: CompletionChain, models: tuple[str, ...], criteria: str
    ) -> None:
        """One chain, from waiting for its inputs to its output's value or error."""
        try:
            if chain.settled:
                return  # settled before a restart: nothing to run
            why = await self._inputs(session, chain, models, criteria)
            if why is not None:
                self._settle(chain, error=why)
                return
            if isinstance(chain.gen, TransformGen):
                await self._transform(chain, chain.gen)
                return
            task = CompletionTask(
                chain, session.session_id, next(self._task_seq), self._app_seq(session), criteria, models
            )
            try:
                await self.scheduler.prepare(task)
            except (ParrotError, LookupError) as error:
                self._settle(chain, error=f"could not tokenize the prompt: {error}")
                return
            async with aclosing(self.scheduler.run(task)) as reports:
                async for report in reports:
                    if isinstance(report, Started):
                        self._started(chain.call, report.engine_id)
                    elif isinstance(report, Finished):
                        chain.result = report.result
                        if report.prompt_ids is not None:
                            chain.prompt_ids_by_model[report.model] = list(report.prompt_ids)
                        if report.first_token_at is not None:
                            chain.call.timings.setdefault("first_token_at", report.first_token_at)
                        self._settle(chain, report.result.text, report.result.finish_reason)
                    else:  # Failed
                        self._settle(chain, error=report.reason)
        except asyncio.CancelledError:
            raise  # its session is gone (or the ServeCore stops): nothing to report
        except Exception as error:  # a bug: the call still ends, with the reason
            log.exception("chain %s of call %s failed", chain.key, chain.call.call_id)
            self._settle(chain, error=f"internal error: {error!r}")

    async def _transform(self, chain: CompletionChain, gen: TransformGen) -> None:
        """Transforms run on the ServeCore (string work needs no engine), in a worker thread
        within their time budget."""
        self._started(chain.call, TRANSFORM_ENGINE)
        try:
            value = await self.transforms.apply(gen.steps, [v.value or "" for v in chain.input_vars()])
        except TransformError as error:
            self._settle(chain, error=str(error))
        else:
            self._settle(chain, value)

    async def _inputs(
        self, session: Session, chain: CompletionChain, models: tuple[str, ...], criteria: str
    ) -> str | None:
        """Wait for the chain's inputs (filling its known prefix ahead meanwhile); why it
        cannot run when one failed or lacks a field its template reads (None: it can)."""
        waits = list(chain.input_vars())
        if chain.previous is not None:
            waits.append(chain.previous.gen.var)
        for var in waits:
            if not var.settled.is_set():
                # Ahead of an input whose producer runs already, a fill would land in the
                # engine steps right before the chain's own: a step on its critical path.
                # The prompt is then computed with the generation, in one step. Beside a
                # producer about to run (its inputs are there: a DAG submitted in one
                # request), only a long prefix is worth the mixed steps it rides in.
                producer = var.producer
                if producer is None or producer.call.state != CallState.RUNNING:
                    latency = criteria == LATENCY or chain.latency_depth > 0
                    beside = producer is not None and producer.ready()
                    self.scheduler.fill_ahead(chain, session.session_id, models, latency, beside)
                await var.settled.wait()
            if var.error:
                return f"input {var.name!r} failed: {var.error}"
        for node in chain.fills:
            if isinstance(node, PlaceholderFill) and node.path:
                try:
                    node.text  # noqa: B018  (reads the field)
                except FieldError as error:
                    return f"input {node.var.name!r} has no field {format_path(node.path)}: {error}"
        return None

    # -- state changes, journaled -------------------------------------------------------------
    def _started(self, call: RequestChain, engine_id: str) -> None:
        """A chain of ``call`` was placed on ``engine_id`` (the call's first start is
        journaled: ``running``)."""
        call.engine_id = engine_id
        first = "started_at" not in call.timings
        call.timings.setdefault("started_at", time.time())
        if first and call.stored:
            self.journal.record(
                lambda store, t=dict(call.timings): store.update_call(
                    call.call_id, state=CallState.RUNNING, engine_id=engine_id, timings=t
                )
            )

    def _settle(
        self,
        chain: CompletionChain,
        value: str | None = None,
        finish_reason: str | None = None,
        *,
        error: str | None = None,
    ) -> None:
        """The chain's output gets its value (checked against its format and the memory of
        values: a value that does not pass fails it instead) or its error; journaled, and
        the call finishes once all its outputs have settled."""
        var = chain.gen.var
        if var.ready or var.error is not None:
            return  # settled once: a late result (a task that ran twice) changes nothing
        if error is None:
            self.values.set_value(var, value or "", finish_reason)
        else:
            self.values.fail(var, error)
        if var.stored and var.error is not None:
            self.journal.record(lambda store: store.set_var_error(var.var_id, var.error))
        elif var.stored:
            self.journal.record(lambda store: store.set_var_value(var.var_id, var.value))
        call = chain.call
        state = call.state
        if not state.settled or "finished_at" in call.timings:
            return
        self.admission.call_settled(call.call_id)
        call.timings["finished_at"] = time.time()
        took = call.timings["finished_at"] - call.timings.get("submitted_at", 0.0)
        self.activity.call_finished(call.call_id, state, took, call.engine_id, call.error)
        if call.stored:
            self.journal.record(
                lambda store, t=dict(call.timings): store.update_call(
                    call.call_id, state=state, engine_id=call.engine_id, error=call.error, timings=t
                )
            )
