"""The ServeCore: sessions, semantic variables and calls over the executor and engines.

Everything the REST API does goes through this object; nothing in a controller knows
about scheduling.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import secrets
import time
from dataclasses import dataclass, field

import msgspec

from parrot.engines.protocol.errors import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ParrotError,
    UnauthorizedError,
    WaitTimeoutError,
)
from parrot.engines.protocol.sampling import SamplingParams
from parrot.platform.serve.context_manager import ContextTree, context_ids
from parrot.platform.serve.engine_client import HttpEngine
from parrot.platform.serve.executor import (
    LATENCY,
    THROUGHPUT,
    EngineSlot,
    GlobalScheduler,
    GraphExecutor,
    Variables,
)
from parrot.platform.serve.graph import Graph, RequestChain, SemanticVariable
from parrot.platform.serve.template import ParameterSpec, check_binding, parse_template

CRITERIA = (LATENCY, THROUGHPUT)


class CallParameter(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    is_output: bool = False
    var_id: str | None = None
    value: str | None = None
    sampling: SamplingParams | None = None


@dataclass(eq=False)
class Session:
    session_id: str
    auth_hash: str
    graph: Graph
    executor: GraphExecutor
    vars: dict[str, SemanticVariable] = field(default_factory=dict)
    calls: dict[str, RequestChain] = field(default_factory=dict)
    last_active: float = field(default_factory=time.monotonic)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ServeCore:
    def __init__(self, session_timeout_s: float = 3600.0) -> None:
        if session_timeout_s <= 0:
            raise ValueError("session_timeout_s must be positive")
        self.session_timeout_s = session_timeout_s
        self._expiry_task: asyncio.Task | None = None
        self.variables = Variables()
        self.scheduler = GlobalScheduler(self.variables)
        self.sessions: dict[str, Session] = {}
        self._seq = itertools.count()
        self._context_ids = context_ids()
        self._var_ids = itertools.count(1)
        self._call_ids = itertools.count(1)
        self._engine_ids = itertools.count(1)

    async def start(self) -> None:
        self.scheduler.start()
        self._expiry_task = asyncio.create_task(self._expire_loop())

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        await self.scheduler.stop()
        for slot in self.scheduler.engines.values():
            await slot.client.aclose()

    # -- engines -------------------------------------------------------------------------
    async def register_engine(self, url: str, capacity: int = 16) -> EngineSlot:
        if not url.startswith(("http://", "https://")):
            raise BadRequestError(f"engine url must start with http:// or https://, got {url!r}")
        if any(s.client.base_url == url.rstrip("/") for s in self.scheduler.engines.values()):
            raise ConflictError(f"engine {url} is already registered")
        client = HttpEngine(url)
        try:
            info = await client.ping()
        except ParrotError as error:
            await client.aclose()
            raise BadRequestError(f"could not reach an engine at {url}: {error}") from None
        engine_id = f"engine-{next(self._engine_ids)}"
        slot = EngineSlot(engine_id, info["model"], client, ContextTree(client, self._context_ids), capacity)
        self.scheduler.add_engine(slot)
        return slot

    async def remove_engine(self, engine_id: str) -> None:
        slot = self.scheduler.engines.pop(engine_id, None)
        if slot is None:
            raise NotFoundError(f"engine {engine_id!r} is not registered")
        await slot.client.aclose()

    # -- sessions ------------------------------------------------------------------------
    def create_session(self) -> tuple[Session, str]:
        session_id = secrets.token_hex(8)
        auth = secrets.token_urlsafe(24)
        session = Session(
            session_id, _hash(auth), Graph(), GraphExecutor(session_id, self.scheduler, self._seq)
        )
        self.sessions[session_id] = session
        return session, auth

    def session(self, session_id: str, auth: str | None) -> Session:
        if not auth:
            raise UnauthorizedError("missing 'Authorization: Bearer <session_auth>' header")
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFoundError(f"session {session_id!r} does not exist")
        if not hmac.compare_digest(session.auth_hash, _hash(auth)):
            raise ForbiddenError(f"the session_auth does not belong to session {session_id!r}")
        session.last_active = time.monotonic()
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
            await self.expire_idle_sessions()

    async def delete_session(self, session: Session) -> None:
        session.executor.cancel()
        self.sessions.pop(session.session_id, None)
        for slot in self.scheduler.engines.values():
            await slot.tree.free_session(session.session_id)

    # -- variables -----------------------------------------------------------------------
    def create_var(self, session: Session, name: str, value: str | None = None) -> SemanticVariable:
        var = SemanticVariable(f"var-{next(self._var_ids)}", name, value)
        session.vars[var.var_id] = var
        return var

    def var(self, session: Session, var_id: str) -> SemanticVariable:
        var = session.vars.get(var_id)
        if var is None:
            raise NotFoundError(f"variable {var_id!r} does not exist in session {session.session_id!r}")
        return var

    def set_var(self, session: Session, var_id: str, value: str) -> SemanticVariable:
        var = self.var(session, var_id)
        if var.producer is not None:
            raise BadRequestError(f"variable {var_id!r} is the output of call {var.producer.request.call_id}")
        if var.ready:
            raise BadRequestError(f"variable {var_id!r} already has a value")
        self.variables.set_value(var, value)
        return var

    async def get_var(self, session: Session, var_id: str, criteria: str, timeout: float) -> SemanticVariable:
        var = self.var(session, var_id)
        if criteria not in CRITERIA:
            raise BadRequestError(f"criteria must be one of {CRITERIA}, got {criteria!r}")
        if criteria == LATENCY:
            self.scheduler.prioritize({id(c) for c, _ in session.graph.producers_of(var)})
        try:
            await self.variables.wait(var, timeout)
        except TimeoutError:
            raise WaitTimeoutError(f"variable {var_id!r} has no value after {timeout}s") from None
        return var

    # -- calls ---------------------------------------------------------------------------
    def submit_call(
        self,
        session: Session,
        template: str,
        parameters: list[CallParameter],
        models: list[str],
        output_criteria: str | None,
    ) -> tuple[RequestChain, dict[str, str]]:
        if output_criteria is not None and output_criteria not in CRITERIA:
            raise BadRequestError(f"output_criteria must be one of {CRITERIA}, got {output_criteria!r}")
        chunks = parse_template(template)
        check_binding(chunks, [ParameterSpec(p.name, p.is_output) for p in parameters])
        bound: dict[str, SemanticVariable] = {}
        outputs: dict[str, SamplingParams] = {}
        created: list[str] = []
        for p in parameters:
            if p.var_id is not None and p.value is not None:
                raise BadRequestError(f"parameter {p.name!r}: give var_id or value, not both")
            if p.is_output:
                if p.value is not None:
                    raise BadRequestError(f"output {p.name!r} cannot have a value")
                outputs[p.name] = p.sampling or SamplingParams()
            elif p.sampling is not None:
                raise BadRequestError(f"input {p.name!r} cannot have sampling settings")
            if p.var_id is not None:
                bound[p.name] = self.var(session, p.var_id)
            else:
                if not p.is_output and p.value is None:
                    raise BadRequestError(f"input {p.name!r} needs a var_id or a value")
                var = self.create_var(session, p.name, p.value)
                bound[p.name] = var
                created.append(var.var_id)
        call_id = f"call-{next(self._call_ids)}"
        request = RequestChain.build(call_id, chunks, bound, outputs)
        try:
            session.graph.add(request)
        except Exception:
            for var_id in created:
                session.vars.pop(var_id, None)
            raise
        session.calls[call_id] = request
        session.executor.submit(request.chains, tuple(models), output_criteria or THROUGHPUT)
        return request, {c.gen.var.name: c.gen.var.var_id for c in request.chains}

    def call(self, session: Session, call_id: str) -> RequestChain:
        request = session.calls.get(call_id)
        if request is None:
            raise NotFoundError(f"call {call_id!r} does not exist in session {session.session_id!r}")
        return request


def call_state(request: RequestChain) -> str:
    outs = request.output_vars()
    if any(v.error for v in outs):
        return "failed"
    if all(v.ready for v in outs):
        return "done"
    return "pending"
