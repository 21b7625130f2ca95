"""The ServeCore: sessions, semantic variables and calls over the scheduler and engines.

Everything the REST API and the OpenAI front do goes through this object's methods; nothing
in a controller knows about scheduling. What a client is told exists is stored first: a
route returns only after its own writes are in the database, and a write the database does
not take fails the request (503) and undoes the change.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from parrot.engines.protocol.errors import BadRequestError, EngineUnavailableError, NotFoundError, ParrotError
from parrot.platform.serve import observe, transforms
from parrot.platform.serve.activity import ActivityLog
from parrot.platform.serve.admission import Admission
from parrot.platform.serve.contexts import MemoryPressure, context_ids
from parrot.platform.serve.engine_registry import BUILTIN, EngineRegistry, EngineSpec
from parrot.platform.serve.errors import (
    ForbiddenError,
    NoEngineError,
    SessionClosedError,
    UnauthorizedError,
    UnknownModelError,
    WaitTimeoutError,
)
from parrot.platform.serve.graph import Graph, RequestChain, SemanticVariable
from parrot.platform.serve.graph_executor import GraphExecutor
from parrot.platform.serve.history import LoadHistory, LoadSample
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits import Limits
from parrot.platform.serve.memory import MemoryTrimmer
from parrot.platform.serve.metrics import ServeMetrics
from parrot.platform.serve.observe import ContextTreeView, SessionDag, SessionSummary
from parrot.platform.serve.orphans import claim_region, region_range
from parrot.platform.serve.prompt import PromptBuilder
from parrot.platform.serve.recovery import rebuild_call
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.health import HealthSettings
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import LATENCY, THROUGHPUT, CompletionTask
from parrot.platform.serve.tokenizer_manager import TokenizerManager
from parrot.platform.serve.transform_runner import TransformLimits, TransformRunner
from parrot.platform.serve.variables import Variables
from parrot.platform.store.models import CallRecord
from parrot.platform.store.store import Snapshot, Store
from parrot.wire.sampling import SamplingParams
from parrot.wire.template import ParameterSpec, check_binding, parse_template

log = logging.getLogger(__name__)
TOUCH_EVERY_S = 30.0  # how stale a session's stored last-activity time may get
RECENT_SESSIONS = 20  # closed sessions whose DAG the dashboard still shows

CRITERIA = (LATENCY, THROUGHPUT)


class CallParameter(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    is_output: bool = False
    var_id: str | None = None
    value: str | None = None
    sampling: SamplingParams | None = None


class TransformInput(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    var_id: str | None = None
    value: str | None = None


@dataclass(eq=False)
class Session:
    session_id: str
    auth_hash: str
    graph: Graph
    executor: GraphExecutor
    vars: dict[str, SemanticVariable] = field(default_factory=dict)
    calls: dict[str, RequestChain] = field(default_factory=dict)
    last_active: float = field(default_factory=time.monotonic)
    stored: bool = True  # persisted; one-shot sessions of the OpenAI front are not
    stored_active: float = field(default_factory=time.monotonic)  # last_active as stored
    closed: bool = False  # deleted or expired: its work is stopped


@dataclass(frozen=True)
class EngineView:
    """An engine as operators see it (never with its API key)."""

    engine_id: str
    kind: str
    url: str
    model: str
    up: bool
    running: int  # tasks placed on it now
    capacity: int  # tasks at once
    contexts: int  # contexts the ServeCore holds on it
    info: dict  # its last ping
    missed_pings: int = 0  # in a row (down after a few)
    # From its last ping (None: the engine does not say, e.g. an OpenAI endpoint).
    jobs_running: int | None = None
    jobs_waiting: int | None = None
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class CoreStats:
    """Counters for /metrics."""

    sessions: int
    queued: int
    done: int
    failed: int
    requeued: int
    prompt_tokens: int
    reused_tokens: int
    filled_ahead: int
    evicted: int
    tokenizer_hits: int
    tokenizer_misses: int
    store_failures: int
    engines: list[EngineView]


def _new_id(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(8)}"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ServeCore:
    def __init__(
        self,
        session_timeout_s: float = 3600.0,
        store: Store | None = None,
        policy: SchedulingPolicy | None = None,
        pressure: MemoryPressure | None = None,
        health: HealthSettings | None = None,
        history: LoadHistory | None = None,
        activity: ActivityLog | None = None,
        limits: Limits | None = None,
        transform_limits: TransformLimits | None = None,
    ) -> None:
        if session_timeout_s <= 0:
            raise ValueError("session_timeout_s must be positive")
        self.session_timeout_s = session_timeout_s
        self.admission = Admission(limits)
        self._expiry_task: asyncio.Task | None = None
        self.journal = Journal(store)
        self.metrics = ServeMetrics()
        self.metrics.watch(self.stats)
        self.variables = Variables(on_change=self._var_changed, on_wait=self.metrics.observe_wait)
        self.tokenizers = TokenizerManager()
        self.transforms = TransformRunner(transform_limits, self.admission.limits.max_value_chars)
        self.memory = MemoryTrimmer()  # gives the memory of big prompts back once freed
        self.scheduler = GlobalScheduler(
            self.variables, PromptBuilder(self.tokenizers), policy, pressure, health, self.metrics
        )
        self.scheduler.on_start = self._task_started
        self.engines = EngineRegistry(self.scheduler, self.journal, context_ids(), self.tokenizers)
        self.sessions: dict[str, Session] = {}
        self._task_seq = itertools.count()  # task arrival order
        self._call_seq = itertools.count(1)  # call submission order, kept across restarts
        self.history = history or LoadHistory()
        self._sample_task: asyncio.Task | None = None
        self.activity = activity or ActivityLog()
        self._activity_task: asyncio.Task | None = None
        # Closed sessions, newest last, as they were when they closed (for the dashboard).
        self._recent: deque[tuple[SessionSummary, SessionDag]] = deque(maxlen=RECENT_SESSIONS)

    async def start(self, engine_urls: tuple[str, ...] = ()) -> None:
        """Bring the store to the newest schema, restore what it holds, register engines."""
        store = self.journal.store
        snapshot = None
        if store is not None:
            await store.migrate()
            snapshot = await store.snapshot()
            # This run's context ids; contexts of earlier runs are freed on their engines.
            region, earlier = await claim_region(store)
            self.engines.context_ids = context_ids(region_range(region)[0])
            self.engines.orphan_regions = earlier
        self.journal.start()
        self.scheduler.start()
        await self.engines.restore(list(snapshot.engines) if snapshot else [], engine_urls)
        if snapshot is not None:
            self._restore(snapshot)
        self._expiry_task = asyncio.create_task(self._expire_loop())
        self._sample_task = asyncio.create_task(self._sample_loop())
        self._activity_task = asyncio.create_task(self._activity_loop())

    async def stop(self) -> None:
        for task in (self._expiry_task, self._sample_task, self._activity_task):
            if task is not None:
                task.cancel()
        await self.scheduler.stop()
        await self.engines.close()
        self.transforms.close()
        await self.journal.stop()
        if self.journal.store is not None:
            await self.journal.store.close()

    # -- engines -------------------------------------------------------------------------
    async def register_engine(self, url: str, capacity: int | None = None) -> EngineSlot:
        return await self.register(EngineSpec(BUILTIN, url, capacity))

    async def register(self, spec: EngineSpec) -> EngineSlot:
        slot, stored = await self.engines.register(spec)
        try:
            await self.journal.commit(stored)
        except ParrotError:
            await self.engines.remove(slot.engine_id)
            raise
        return slot

    async def remove_engine(self, engine_id: str) -> None:
        await self.journal.commit(await self.engines.remove(engine_id))

    def engine_slots(self) -> list[EngineSlot]:
        return list(self.scheduler.engines.values())

    def engine_views(self) -> list[EngineView]:
        views = []
        for slot in self.scheduler.engines.values():
            spec = self.engines.specs[slot.engine_id]
            views.append(
                EngineView(
                    engine_id=slot.engine_id,
                    kind=spec.kind,
                    url=self.engines.url_of(slot.engine_id),
                    model=slot.model,
                    up=slot.up,
                    running=len(slot.running),
                    capacity=slot.task_limit,
                    contexts=len(slot.contexts),
                    info=dict(slot.info),
                    missed_pings=slot.missed_pings,
                    jobs_running=slot.info.get("num_running"),
                    jobs_waiting=slot.info.get("num_waiting"),
                    kv_blocks_used=slot.info.get("kv_blocks_used"),
                    kv_blocks_total=slot.info.get("kv_blocks_total"),
                    tokens_per_s=slot.info.get("tokens_per_s"),
                )
            )
        return views

    def engine_view(self, engine_id: str) -> EngineView:
        for view in self.engine_views():
            if view.engine_id == engine_id:
                return view
        raise NotFoundError(f"engine {engine_id!r} is not registered")

    def stats(self) -> CoreStats:
        st = self.scheduler.stats
        return CoreStats(
            sessions=len(self.sessions),
            queued=len(self.scheduler.queue),
            done=st.done,
            failed=st.failed,
            requeued=st.requeued,
            prompt_tokens=st.prompt_tokens,
            reused_tokens=st.reused_tokens,
            filled_ahead=st.filled_ahead,
            evicted=self.scheduler.monitor.evicted,
            tokenizer_hits=self.tokenizers.hits,
            tokenizer_misses=self.tokenizers.misses,
            store_failures=self.journal.failures,
            engines=self.engine_views(),
        )

    # -- what operators see (the dashboard, the DAG and context-tree routes) ---------------
    def sample_load(self) -> LoadSample:
        """Record the load now in the history (the ServeCore does so every interval)."""
        engines = [s for s in self.scheduler.engines.values() if s.up]
        sample = LoadSample(
            at=time.time(),
            tokens_per_s=float(sum(s.info.get("tokens_per_s") or 0.0 for s in engines)),
            queued=len(self.scheduler.queue),
            running=sum(len(s.running) for s in self.scheduler.engines.values()),
        )
        self.history.add(sample)
        return sample

    async def _sample_loop(self) -> None:
        while True:
            self.sample_load()
            await self.memory.after(self.tokenizers.big_at)
            await asyncio.sleep(self.history.interval_s)

    async def _activity_loop(self) -> None:
        while True:
            await asyncio.sleep(self.activity.interval_s)
            self.activity.summarize(len(self.sessions), len(self.scheduler.queue))

    def load_history(self) -> list[LoadSample]:
        """Load samples of the last minutes, oldest first."""
        return self.history.samples()

    def session_summaries(self) -> list[SessionSummary]:
        """Live sessions (newest first), then recently closed ones (newest first). One-shot
        sessions of the OpenAI front are not listed."""
        live = [
            observe.summarize(s.session_id, s.calls.values(), live=True)
            for s in self.sessions.values()
            if s.stored
        ]
        live.sort(key=lambda s: s.started_at or 0.0, reverse=True)
        return live + [summary for summary, _ in reversed(self._recent)]

    def session_dag(self, session_id: str) -> SessionDag:
        """The DAG of a live session, or of a recently closed one as it was when it closed.
        No auth check: the caller checks who may see it."""
        session = self.sessions.get(session_id)
        if session is not None:
            return observe.session_dag(session_id, session.calls.values(), session.vars.values(), True)
        for summary, dag in self._recent:
            if summary.session_id == session_id:
                return dag
        raise NotFoundError(f"session {session_id!r} does not exist")

    def context_tree(self, engine_id: str) -> ContextTreeView:
        """The contexts this ServeCore holds on an engine, as their prefix tree."""
        slot = self.scheduler.engines.get(engine_id)
        if slot is None:
            raise NotFoundError(f"engine {engine_id!r} is not registered")
        return observe.context_tree(engine_id, slot.model, slot.contexts, dict(slot.info))

    def models(self) -> list[str]:
        return sorted({s.model for s in self.scheduler.engines.values() if s.model})

    async def render_chat(self, model: str, messages: list) -> list[str] | None:
        """A chat's prompt pieces in ``model``'s own chat template, by an engine of that
        model that offers it (None: none does)."""
        for slot in self.scheduler.engines.values():
            render = getattr(slot.client, "render_chat", None)
            if slot.up and slot.model == model and render is not None:
                return await render(messages)
        return None

    # -- sessions ------------------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        return self.admission.limits

    async def create_session(self, stored: bool = True, client: str | None = None) -> tuple[Session, str]:
        """A new session; ``client`` (its address) counts it towards that client's limit."""
        session_id = secrets.token_hex(8)
        auth = secrets.token_urlsafe(24)
        self.admission.open_session(session_id, client)
        session = self._new_session(session_id, _hash(auth))
        session.stored = stored
        if stored:
            try:
                await self.journal.commit(
                    self.journal.record(lambda store: store.add_session(session_id, session.auth_hash))
                )
            except ParrotError:
                self.sessions.pop(session_id, None)
                self.admission.close_session(session_id)
                raise
        return session, auth

    def _new_session(self, session_id: str, auth_hash: str) -> Session:
        executor = GraphExecutor(session_id, self.scheduler, self._task_seq, self.transforms)
        session = Session(session_id, auth_hash, Graph(), executor)
        self.sessions[session_id] = session
        return session

    def session(self, session_id: str, auth: str | None) -> Session:
        if not auth:
            raise UnauthorizedError("missing 'Authorization: Bearer <session_auth>' header")
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"session {session_id!r} does not exist")
        if not hmac.compare_digest(session.auth_hash.encode(), _hash(auth).encode()):
            raise ForbiddenError(f"the session_auth does not belong to session {session_id!r}")
        session.last_active = time.monotonic()
        if session.stored and session.last_active - session.stored_active > TOUCH_EVERY_S:
            session.stored_active = session.last_active
            self.journal.record(lambda store: store.touch_session(session_id))
        return session

    async def expire_idle_sessions(self) -> list[str]:
        """Delete sessions idle for longer than the timeout, freeing everything they hold."""
        deadline = time.monotonic() - self.session_timeout_s
        idle = [s for s in self.sessions.values() if s.last_active < deadline]
        for session in idle:
            await self.delete_session(session)
        return [s.session_id for s in idle]

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, self.session_timeout_s / 2))
            try:
                await self.expire_idle_sessions()
            except ParrotError as error:  # the store: the next round tries again
                log.warning("expiring idle sessions failed: %s", error)
            except Exception:  # a bug: logged, and expiry goes on
                log.exception("expiring idle sessions failed")

    async def delete_session(self, session: Session) -> None:
        """Stop the session's work (queued tasks dropped, running generations aborted on
        their engines), free its contexts, wake whoever waits on its variables, and delete
        its records."""
        if session.closed:
            return
        session.closed = True
        self.sessions.pop(session.session_id, None)
        self.admission.close_session(session.session_id, list(session.calls))
        if session.stored:
            sid, calls = session.session_id, session.calls.values()
            self._recent.append(
                (
                    observe.summarize(sid, calls, live=False, closed_at=time.time()),
                    observe.session_dag(sid, calls, session.vars.values(), live=False),
                )
            )
        session.executor.cancel()
        await self.scheduler.drop_session(session.session_id)
        self.variables.close(session.vars.values(), f"session {session.session_id} was deleted")
        if session.stored:
            await self.journal.commit(
                self.journal.record(lambda store: store.delete_session(session.session_id))
            )

    # -- variables -----------------------------------------------------------------------
    def _add_var(self, session: Session, var: SemanticVariable) -> asyncio.Future | None:
        var.stored = session.stored
        session.vars[var.var_id] = var
        if not var.stored:
            return None
        return self.journal.record(
            lambda store: store.add_var(var.var_id, session.session_id, var.name, var.value)
        )

    async def create_var(self, session: Session, name: str, value: str | None = None) -> SemanticVariable:
        self.admission.check_text(name, "the variable name")
        self.admission.check_value(value, f"the value of variable {name!r}")
        self.admission.check_session_growth(session.session_id, len(session.vars), 1, len(session.calls), 0)
        var = SemanticVariable(_new_id("var"), name, value)
        stored = self._add_var(session, var)
        try:
            await self.journal.commit(*filter(None, [stored]))
        except ParrotError:
            session.vars.pop(var.var_id, None)
            raise
        return var

    def var(self, session: Session, var_id: str) -> SemanticVariable:
        var = session.vars.get(var_id)
        if var is None:
            raise NotFoundError(f"variable {var_id!r} does not exist in session {session.session_id!r}")
        return var

    async def set_var(self, session: Session, var_id: str, value: str) -> SemanticVariable:
        var = self.var(session, var_id)
        self.admission.check_value(value, f"the value of variable {var_id!r}")
        if var.producer is not None:
            raise BadRequestError(f"variable {var_id!r} is the output of call {var.producer.request.call_id}")
        if var.ready:
            raise BadRequestError(f"variable {var_id!r} already has a value")
        if var.stored:  # stored first: consumers start the moment the value is set
            await self.journal.commit(self.journal.record(lambda store: store.set_var_value(var_id, value)))
        if var.ready:  # set by a concurrent request meanwhile
            raise BadRequestError(f"variable {var_id!r} already has a value")
        self.variables.set_value(var, value)
        return var

    def _var_changed(self, var: SemanticVariable) -> None:
        if var.stored and var.error is not None:
            self.journal.record(lambda store: store.set_var_error(var.var_id, var.error))
        elif var.stored and var.producer is not None:  # set_var stores its value itself
            self.journal.record(lambda store: store.set_var_value(var.var_id, var.value))
        if var.producer is not None:
            self._call_progressed(var.producer.request)

    async def get_var(self, session: Session, var_id: str, criteria: str, timeout: float) -> SemanticVariable:
        var = self.var(session, var_id)
        if criteria not in CRITERIA:
            raise BadRequestError(f"criteria must be one of {CRITERIA}, got {criteria!r}")
        if criteria == LATENCY:
            self._activate(session, [var])
        try:
            await self.variables.wait(var, timeout)
        except TimeoutError:
            raise WaitTimeoutError(f"variable {var_id!r} has no value after {timeout}s") from None
        except ParrotError:
            if session.closed:
                raise SessionClosedError(
                    f"session {session.session_id!r} was deleted while waiting"
                ) from None
            raise
        return var

    async def wait_value(self, var: SemanticVariable) -> str:
        """The value of a variable of a session of this core (raises the producer's failure)."""
        return await self.variables.wait(var)

    def _activate(self, session: Session, targets: list[SemanticVariable]) -> None:
        """Mark the producers of ``targets``, backwards through the DAG, latency-critical."""
        found = []
        for var in targets:
            found += [(chain, depth) for chain, depth in session.graph.producers_of(var) if not chain.settled]
        self.scheduler.prioritize(found)

    # -- calls ---------------------------------------------------------------------------
    async def submit_call(
        self,
        session: Session,
        template: str,
        parameters: list[CallParameter],
        models: list[str],
        output_criteria: str | None,
    ) -> tuple[RequestChain, dict[str, str]]:
        if output_criteria is not None and output_criteria not in CRITERIA:
            raise BadRequestError(f"output_criteria must be one of {CRITERIA}, got {output_criteria!r}")
        self.admission.check_prompt(len(template), "the template")
        self.admission.check_text(template, "the template")
        for p in parameters:
            self.admission.check_value(p.value, f"input {p.name!r}")
        chunks = parse_template(template)
        check_binding(chunks, [ParameterSpec(p.name, p.is_output) for p in parameters])
        outputs: dict[str, SamplingParams] = {}
        for p in parameters:
            if p.var_id is not None and p.value is not None:
                raise BadRequestError(f"parameter {p.name!r}: give var_id or value, not both")
            if p.is_output:
                if p.value is not None:
                    raise BadRequestError(f"output {p.name!r} cannot have a value")
                outputs[p.name] = p.sampling or SamplingParams()
            elif p.sampling is not None:
                raise BadRequestError(f"input {p.name!r} cannot have sampling settings")
            elif p.var_id is None and p.value is None:
                raise BadRequestError(f"input {p.name!r} needs a var_id or a value")
        self._require_engine(models)
        named = {p.name: self.var(session, p.var_id) for p in parameters if p.var_id is not None}
        # New variables (inputs given by value, fresh outputs) join the session only if the
        # call is accepted: a rejected call leaves nothing behind.
        fresh = {
            p.name: SemanticVariable(_new_id("var"), p.name, p.value) for p in parameters if p.var_id is None
        }
        request = RequestChain.build(_new_id("call"), chunks, named | fresh, outputs)
        stored = [
            {
                "name": p.name,
                "is_output": p.is_output,
                "sampling": msgspec.to_builtins(outputs[p.name]) if p.is_output else None,
            }
            for p in parameters
        ]
        return await self._accept(
            session, request, named | fresh, list(fresh.values()), stored, template, models, output_criteria
        )

    async def submit_transform(
        self, session: Session, inputs: list[TransformInput], steps: list, output: str
    ) -> tuple[RequestChain, dict[str, str]]:
        """A call that derives ``output`` from ``inputs`` by native string transforms."""
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
                bound[f"input{n}"] = self.var(session, item.var_id)
            else:
                bound[f"input{n}"] = SemanticVariable(_new_id("var"), f"input{n}", item.value)
                fresh.append(bound[f"input{n}"])
        out = SemanticVariable(_new_id("var"), output)
        fresh.append(out)
        request = RequestChain.transform(_new_id("call"), list(bound.values()), out, steps)
        bound[output] = out
        stored = [{"name": name, "is_output": False} for name in bound if name != output]
        stored.append({"name": output, "is_output": True, "transform": msgspec.to_builtins(steps)})
        return await self._accept(session, request, bound, fresh, stored, "", [], None)

    async def _accept(
        self,
        session: Session,
        request: RequestChain,
        bound: dict[str, SemanticVariable],
        fresh: list[SemanticVariable],
        stored: list[dict],
        template: str,
        models: list[str],
        output_criteria: str | None,
    ) -> tuple[RequestChain, dict[str, str]]:
        """Link a built call into the session's DAG (or raise, changing nothing), store it
        with its new variables, and only then start it."""
        self.admission.check_session_growth(
            session.session_id, len(session.vars), len(fresh), len(session.calls), 1
        )
        self.admission.admit_call(request)
        try:
            session.graph.add(request)
        except BaseException:
            self.admission.call_settled(request.call_id)
            raise
        request.seq = next(self._call_seq)
        for param in stored:
            param["var_id"] = bound[param["name"]].var_id
        request.timings["submitted_at"] = time.time()
        session.calls[request.call_id] = request
        writes = [w for var in fresh if (w := self._add_var(session, var)) is not None]
        if session.stored:
            writes.append(
                self.journal.record(
                    lambda store, t=dict(request.timings), seq=request.seq: store.add_call(
                        request.call_id,
                        session.session_id,
                        seq,
                        template,
                        stored,
                        models,
                        output_criteria,
                        timings=t,
                    )
                )
            )
        try:
            await self.journal.commit(*writes)
        except ParrotError:
            self.admission.call_settled(request.call_id)
            session.graph.unlink(request)
            session.calls.pop(request.call_id, None)
            for var in fresh:
                session.vars.pop(var.var_id, None)
            raise
        if session.closed:
            raise SessionClosedError(f"session {session.session_id!r} was deleted")
        self._run(session, request, tuple(models), output_criteria or THROUGHPUT)
        return request, request.outputs()

    async def submit_prompt(
        self,
        session: Session,
        pieces: list[str],
        sampling: SamplingParams,
        models: list[str],
        on_token: Callable[[str], None] | None = None,
    ) -> RequestChain:
        """One latency-critical generation after text ``pieces``, taken as they are (no
        template, so braces are just text): how the OpenAI front runs a request. The pieces
        are constant text: each piece's end is a prefix every session may share (a system
        prompt, the turns of a chat), kept as a context of its own on the engine."""
        self.admission.check_prompt(sum(len(piece) for piece in pieces), "the prompt")
        for piece in pieces:
            self.admission.check_text(piece, "the prompt")
        self._require_engine(models)
        out = SemanticVariable(_new_id("var"), "completion")
        request = RequestChain.prompt(_new_id("call"), pieces, out, sampling, on_token)
        await self._accept(session, request, {"completion": out}, [out], [], "", models, LATENCY)
        return request

    def _require_engine(self, models: list[str]) -> None:
        """Refuse a call no engine can run now (503), rather than fail it later."""
        serving = self.scheduler.serving(tuple(models))
        if not serving:
            served = self.models()
            if not served:
                raise NoEngineError("no engine is registered")
            raise UnknownModelError(
                f"no registered engine serves the {len(models)} model(s) asked for; "
                f"the engines serve {served[:16]}"
            )
        if not any(s.up for s in serving):
            raise EngineUnavailableError("every engine that serves the model(s) asked for is down")

    def _run(self, session: Session, request: RequestChain, models: tuple[str, ...], criteria: str) -> None:
        if criteria == LATENCY:
            self._activate(session, request.output_vars())
        session.executor.submit(request, models, criteria)

    def call(self, session: Session, call_id: str) -> RequestChain:
        request = session.calls.get(call_id)
        if request is None:
            raise NotFoundError(f"call {call_id!r} does not exist in session {session.session_id!r}")
        return request

    def _task_started(self, task: CompletionTask) -> None:
        request = task.chain.request
        request.engine_id = task.engine_id
        first = "started_at" not in request.timings
        request.timings.setdefault("started_at", time.time())
        if first and request.stored:
            self.journal.record(
                lambda store, t=dict(request.timings): store.update_call(
                    request.call_id, state="running", engine_id=request.engine_id, timings=t
                )
            )

    def _call_progressed(self, request: RequestChain) -> None:
        state = request.state
        if state not in ("done", "failed") or "finished_at" in request.timings:
            return
        self.admission.call_settled(request.call_id)
        request.timings["finished_at"] = time.time()
        took = request.timings["finished_at"] - request.timings.get("submitted_at", 0.0)
        self.activity.call_finished(request.call_id, state, took, request.engine_id, request.error)
        if not request.stored:
            return
        self.journal.record(
            lambda store, t=dict(request.timings): store.update_call(
                request.call_id, state=state, engine_id=request.engine_id, error=request.error, timings=t
            )
        )

    # -- restart -------------------------------------------------------------------------
    def _restore(self, snapshot: Snapshot) -> None:
        """Sessions, variables and calls from the store; unfinished calls run again."""
        now_wall, now = time.time(), time.monotonic()
        for record in snapshot.sessions:
            session = self._new_session(record.session_id, record.auth_hash)
            idle = now_wall - record.last_active_at.timestamp()
            session.last_active = now - max(0.0, idle)
        for record in snapshot.vars:
            session = self.sessions.get(record.session_id or "")
            if session is not None:
                var = SemanticVariable(record.var_id, record.name, record.value, record.error)
                session.vars[var.var_id] = var
        for record in snapshot.calls:
            session = self.sessions.get(record.session_id)
            if session is None:
                continue
            self._call_seq = itertools.count(record.seq + 1)
            try:
                self._restore_call(session, record)
            except (ParrotError, KeyError) as error:  # a record this version cannot rebuild
                log.error("call %s could not be restored: %s", record.call_id, error)

    def _restore_call(self, session: Session, record: CallRecord) -> None:
        request = rebuild_call(record, session.vars)
        request.seq = record.seq
        session.graph.link(request)
        session.calls[record.call_id] = request
        if request.state in ("done", "failed"):
            return
        request.timings.pop("started_at", None)  # it runs again from the start
        self.admission.track_call(request)
        log.info("re-queueing call %s of session %s", record.call_id, session.session_id)
        self._run(session, request, tuple(record.models), record.output_criteria or THROUGHPUT)
