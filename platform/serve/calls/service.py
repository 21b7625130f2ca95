"""Semantic calls: checked, built into the session's DAG, stored, then started.

Three kinds of call arrive here: a templated call (``POST /v1/semantic_call``), a
transform (native string work on the ServeCore) and a prompt (the OpenAI front: constant
text pieces, one generation). Each is built into a :class:`RequestChain`, linked into its
session's graph (or refused, changing nothing), stored with its new variables, and only
then handed to the :class:`~parrot.platform.serve.calls.drive.CallDriver`, the one place
its state advances from there on. After a restart, unfinished calls are rebuilt from their
records and run again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from parrot.engines.protocol.errors import (
    BadRequestError,
    EngineLoadingError,
    EngineUnavailableError,
    NotFoundError,
    ParrotError,
)
from parrot.platform.serve.calls import graph, transforms
from parrot.platform.serve.calls.accept import CallAcceptor, PreparedCall, in_batch
from parrot.platform.serve.calls.drive import CallDriver
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.calls.recovery import rebuild_call
from parrot.platform.serve.calls.typed_outputs import check_formats, check_paths, type_outputs
from parrot.platform.serve.engines.loading import EngineLoading
from parrot.platform.serve.errors import NoEngineError, UnknownModelError
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.task import LATENCY, THROUGHPUT
from parrot.platform.serve.sessions.service import SessionService
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.service import VariableService, check_criteria, new_id
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.platform.store.models import CallRecord
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams
from parrot.wire.template import ParameterSpec, check_binding, parse_template

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Binding:
    """What a placeholder of a call is bound to: an existing variable (``var_id``), a value
    (a new input variable), or, for an output, a new variable generated with ``sampling``
    (its value constrained to ``format``, when given: a typed variable)."""

    name: str
    is_output: bool = False
    var_id: str | None = None
    value: str | None = None
    sampling: SamplingParams | None = None
    format: OutputFormat | None = None
    output_of: tuple[int, str] | None = None  # in a batch: (earlier call, its output)


@dataclass(frozen=True)
class CallRequest:
    """A templated call of a batch, as the route decoded it."""

    template: str
    bindings: list[Binding]
    models: list[str]
    output_criteria: str | None


def _output_of(prepared: list[PreparedCall], ref: tuple[int, str]) -> SemanticVariable:
    """The variable of output ``ref`` (call, name) of an earlier call of the batch."""
    n, name = ref
    if n >= len(prepared):
        raise BadRequestError(f"output_of call {n}: a call's inputs can be outputs of earlier calls only")
    var = prepared[n].bound.get(name)
    if var is None or name not in prepared[n].call.outputs():
        raise BadRequestError(f"output_of call {n}: it has no output {name!r}")
    return var


class CallService:
    def __init__(
        self,
        journal: Journal,
        admission: Admission,
        variables: VariableService,
        scheduler: GlobalScheduler,
        driver: CallDriver,
        loading: EngineLoading | None = None,
    ) -> None:
        self.journal = journal
        self.loading = loading or EngineLoading()  # read: a call while the engine loads is told so
        self.admission = admission
        self.vars = variables
        self.scheduler = scheduler  # asked which engines serve a model
        self.driver = driver
        self.acceptor = CallAcceptor(journal, admission, variables, driver)

    async def submit(
        self,
        session: Session,
        template: str,
        bindings: list[Binding],
        models: list[str],
        output_criteria: str | None,
    ) -> tuple[RequestChain, dict[str, str]]:
        """A templated call; its outputs' variable ids by name."""
        await self.vars.check_formats([p.format for p in bindings if p.is_output])
        prepared = self._prepare(session, template, bindings, models, output_criteria)
        (accepted,) = await self.acceptor.accept([prepared])
        return accepted

    async def submit_batch(
        self, session: Session, calls: Sequence[CallRequest]
    ) -> list[tuple[RequestChain, dict[str, str]]]:
        """Templated calls submitted together, in order; an input may be ``output_of`` an
        earlier call of the batch. Every call is checked (and the session's room for all of
        them) before any is accepted, so a refused batch leaves nothing behind; they are
        stored in one transaction."""
        prepared: list[PreparedCall] = []
        for n, request in enumerate(calls):
            try:
                await self.vars.check_formats([p.format for p in request.bindings if p.is_output])
                earlier = {p.name: _output_of(prepared, p.output_of) for p in request.bindings if p.output_of}
                prepared.append(
                    self._prepare(
                        session,
                        request.template,
                        request.bindings,
                        request.models,
                        request.output_criteria,
                        earlier,
                    )
                )
            except ParrotError as error:
                raise in_batch(error, f"call {n} of the batch: {error}") from None
        self.admission.check_session_growth(
            session.session_id,
            len(session.vars),
            sum(len(p.fresh) for p in prepared),
            len(session.calls),
            len(prepared),
        )
        return await self.acceptor.accept(prepared)

    def _prepare(
        self,
        session: Session,
        template: str,
        bindings: list[Binding],
        models: list[str],
        output_criteria: str | None,
        earlier: dict[str, SemanticVariable] | None = None,
    ) -> PreparedCall:
        """A templated call checked and built, not yet in the session. ``earlier``: the
        inputs bound to outputs of earlier calls of the same batch, by name."""
        earlier = earlier or {}
        check_criteria(output_criteria, "output_criteria")
        self.admission.check_prompt(len(template), "the template")
        self.admission.check_placeholders(template, "the template")
        self.admission.check_text(template, "the template")
        for p in bindings:
            self.admission.check_value(p.value, f"input {p.name!r}")
        chunks = parse_template(template)
        check_binding(chunks, [ParameterSpec(p.name, p.is_output) for p in bindings])
        outputs: dict[str, SamplingParams] = {}
        output_vars: dict[str, str] = {}  # var_id -> the output bound to it
        for p in bindings:
            if p.is_output and p.var_id is not None:
                if p.var_id in output_vars:  # else the second output would be dropped silently
                    raise BadRequestError(
                        f"outputs {output_vars[p.var_id]!r} and {p.name!r} are bound to the same "
                        f"variable {p.var_id!r}: a variable has one producer"
                    )
                output_vars[p.var_id] = p.name
            if sum(x is not None for x in (p.var_id, p.value, p.output_of)) > 1:
                raise BadRequestError(f"parameter {p.name!r}: give one of var_id, value and output_of")
            if p.is_output:
                if p.value is not None or p.output_of is not None:
                    raise BadRequestError(f"output {p.name!r} cannot have a value or be output_of a call")
                outputs[p.name] = p.sampling or SamplingParams()
            elif p.sampling is not None:
                raise BadRequestError(f"input {p.name!r} cannot have sampling settings")
            elif p.var_id is None and p.value is None and p.name not in earlier:
                raise BadRequestError(f"input {p.name!r} needs a var_id or a value")
        check_formats(bindings)
        self._require_engine(models)
        named = {p.name: self.vars.find(session, p.var_id) for p in bindings if p.var_id is not None}
        named |= earlier
        retyped = type_outputs(bindings, named, outputs)
        # New variables (inputs given by value, fresh outputs) join the session only if the
        # call is accepted: a rejected call leaves nothing behind.
        fresh = {
            p.name: SemanticVariable(
                new_id("var"), p.name, p.value, format=outputs[p.name].format if p.is_output else None
            )
            for p in bindings
            if p.var_id is None and p.name not in earlier
        }
        check_paths(chunks, named | fresh)
        call = RequestChain.build(new_id("call"), chunks, named | fresh, outputs)
        stored = [
            {
                "name": p.name,
                "is_output": p.is_output,
                "sampling": msgspec.to_builtins(outputs[p.name]) if p.is_output else None,
            }
            for p in bindings
        ]
        return PreparedCall(
            session,
            call,
            named | fresh,
            list(fresh.values()),
            stored,
            template,
            models,
            output_criteria,
            retyped,
        )

    async def submit_transform(
        self, session: Session, inputs: list[Binding], steps: list, output: str
    ) -> tuple[RequestChain, dict[str, str]]:
        """A call that derives ``output`` from ``inputs`` (each a ``var_id`` or a ``value``,
        bound under its ``name``) by native string transforms."""
        transforms.validate(steps)
        self.admission.check_text(output, "the output name")
        if not inputs:
            raise BadRequestError("a transform needs at least one input")
        bound: dict[str, SemanticVariable] = {}
        fresh = []
        for n, item in enumerate(inputs):
            if (item.var_id is None) == (item.value is None):
                raise BadRequestError(f"transform input {n}: give a var_id or a value")
            self.admission.check_value(item.value, f"transform input {n}")
            if item.var_id is not None:
                bound[item.name] = self.vars.find(session, item.var_id)
            else:
                bound[item.name] = SemanticVariable(new_id("var"), item.name, item.value)
                fresh.append(bound[item.name])
        out = SemanticVariable(new_id("var"), output)
        fresh.append(out)
        call = RequestChain.transform(new_id("call"), list(bound.values()), out, steps)
        bound[output] = out
        stored = [{"name": name, "is_output": False} for name in bound if name != output]
        stored.append({"name": output, "is_output": True, "transform": msgspec.to_builtins(steps)})
        prepared = PreparedCall(session, call, bound, fresh, stored, "", [], None)
        (accepted,) = await self.acceptor.accept([prepared])
        return accepted

    async def submit_prompt(
        self,
        session: Session,
        pieces: list[str],
        sampling: SamplingParams,
        models: list[str],
    ) -> RequestChain:
        """One latency-critical generation after text ``pieces``, taken as they are (no
        template, so braces are just text): how the OpenAI front runs a request. The pieces
        are constant text: each piece's end is a prefix every session may share (a system
        prompt, the turns of a chat), kept as a context of its own on the engine."""
        self.admission.check_prompt(sum(len(piece) for piece in pieces), "the prompt")
        for piece in pieces:
            self.admission.check_text(piece, "the prompt")
        # a 400 / 413 now, not a failed generation later
        await self.vars.check_formats([sampling.format])
        self._require_engine(models)
        out = SemanticVariable(new_id("var"), "completion")
        call = RequestChain.prompt(new_id("call"), pieces, out, sampling)
        prepared = PreparedCall(session, call, {"completion": out}, [out], [], "", models, LATENCY)
        await self.acceptor.accept([prepared])
        return call

    def _require_engine(self, models: list[str]) -> None:
        """Refuse a call no engine can run now (503), rather than fail it later."""
        serving = self.scheduler.serving(tuple(models))
        if self.loading.stage is not None and not any(s.up for s in serving):
            raise EngineLoadingError(self.loading.describe())
        if not serving:
            served = sorted({s.model for s in self.scheduler.serving(()) if s.model})
            if not served:
                raise NoEngineError("no engine is registered")
            raise UnknownModelError(
                f"no registered engine serves the {len(models)} model(s) asked for; "
                f"the engines serve {served[:16]}"
            )
        if not any(s.up for s in serving):
            raise EngineUnavailableError("every engine that serves the model(s) asked for is down")

    def find(self, session: Session, call_id: str) -> RequestChain:
        call = session.calls.get(call_id)
        if call is None:
            raise NotFoundError(f"call {call_id!r} does not exist in session {session.session_id!r}")
        return call

    def restore(self, records: Sequence[CallRecord], sessions: SessionService) -> None:
        """Calls from the store, linked into their sessions' DAGs; unfinished ones run again."""
        for record in records:
            session = sessions.get(record.session_id)
            if session is None:
                continue
            try:
                self._restore_call(session, record)
            except (ParrotError, KeyError) as error:  # a record this version cannot rebuild
                log.error("call %s could not be restored: %s", record.call_id, error)

    def _restore_call(self, session: Session, record: CallRecord) -> None:
        call = rebuild_call(record, session.vars)
        self.driver.restore(call, record)
        graph.link(call)
        session.calls[record.call_id] = call
        if call.state.settled:
            return
        self.admission.track_call(call)
        log.info("re-queueing call %s of session %s", record.call_id, session.session_id)
        self.driver.start(session, call, tuple(record.models), record.output_criteria or THROUGHPUT)
