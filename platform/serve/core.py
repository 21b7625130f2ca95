"""The ServeCore: the composition root of the serve layer.

It builds the services and the parts below them, wires each to what it depends on, and
starts and stops them; it has no logic of its own. Callers (the REST routes, the
dashboard, the OpenAI front, the CLI, the tests) use the services it names:

- ``sessions`` (:class:`SessionService`): create, open with the session's auth, delete,
  expire;
- ``vars`` (:class:`VariableService`): create, set, get (waiting for a value);
- ``streams`` (:class:`StreamService`): follow a variable's value as it is written;
- ``calls`` (:class:`CallService`): submit a call, a transform or a prompt; look one up;
- ``engines`` (:class:`EngineService`): register, remove, the models served;
- ``views`` (:class:`OperatorViews`): what the dashboard, ``/metrics`` and ``/healthz``
  show;
- ``requests`` (:class:`RequestLog`): the OpenAI front's recent requests, a record written
  by each when it ends (read through ``views``).

Below them: the :class:`CallDriver` (``driver``: the one place a call's state advances,
and is journaled), the :class:`GlobalScheduler` (orders tasks, picks engines, reports what
happened to each task), the :class:`ContextManager` (``contexts``: the contexts on the
engines), the :class:`VariableValues` (values arrive, waiters wake) and the
:class:`Journal` over the SQL store. Lower parts are given what they call at construction;
none calls back into a higher one.

What a client is told exists is stored first: a route returns only after its own writes
are in the database, and a write the database does not take fails the request (503) and
undoes the change.
"""

from __future__ import annotations

import asyncio

from parrot.platform.serve.calls.drive import CallDriver
from parrot.platform.serve.calls.service import CallService
from parrot.platform.serve.calls.transform_runner import TransformLimits, TransformRunner
from parrot.platform.serve.contexts.manager import ContextManager
from parrot.platform.serve.contexts.tree import MemoryPressure
from parrot.platform.serve.engines.loading import EngineLoading
from parrot.platform.serve.engines.registry import EngineRegistry
from parrot.platform.serve.engines.service import EngineService
from parrot.platform.serve.engines.settings import EngineSettings
from parrot.platform.serve.engines.tokenizers import TokenizerManager
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.limits.settings import Limits
from parrot.platform.serve.ops.activity import ActivityLog
from parrot.platform.serve.ops.history import LoadHistory
from parrot.platform.serve.ops.memory import MemoryTrimmer
from parrot.platform.serve.ops.metrics import ServeMetrics
from parrot.platform.serve.ops.requests import RequestLog
from parrot.platform.serve.ops.views import OperatorViews
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.health import HealthSettings
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.prompt import PromptBuilder
from parrot.platform.serve.sessions.service import SessionService
from parrot.platform.serve.variables.follow import StreamService
from parrot.platform.serve.variables.service import VariableService
from parrot.platform.serve.variables.values import VariableValues
from parrot.platform.store.store import Store


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
        engine_settings: EngineSettings | None = None,
    ) -> None:
        health = health or HealthSettings()
        engine_settings = engine_settings or EngineSettings()
        # The parts below the services.
        self.admission = Admission(limits)
        self.journal = Journal(store)
        self.metrics = ServeMetrics()
        self.tokenizers = TokenizerManager()
        self.transforms = TransformRunner(transform_limits, self.admission.limits.max_value_chars)
        self.memory = MemoryTrimmer()  # gives the memory of big prompts and values back once freed
        self.history = history or LoadHistory()
        self.activity = activity or ActivityLog()
        self.requests = RequestLog()
        values = VariableValues(self.admission.budget)
        self.contexts = ContextManager(pressure or MemoryPressure())
        loading = EngineLoading()  # the engine `parrot serve` started, while it loads
        self.scheduler = GlobalScheduler(
            PromptBuilder(self.tokenizers),
            self.contexts,
            policy,
            health,
            self.metrics,
            engine_settings.parent_wait_s,
            lambda: loading.stage is not None,
        )
        self.driver = CallDriver(
            self.journal, self.admission, self.activity, values, self.scheduler, self.transforms
        )
        registry = EngineRegistry(
            self.scheduler, self.contexts, self.journal, self.tokenizers, engine_settings, health.timeout_s
        )
        # The services the routes use.
        self.sessions = SessionService(
            self.journal, self.admission, self.scheduler, values, self.driver, session_timeout_s
        )
        self.vars = VariableService(self.journal, self.admission, values, self.driver, self.metrics)
        self.streams = StreamService(self.vars, self.driver, self.admission.limits)
        self.calls = CallService(
            self.journal, self.admission, self.vars, self.scheduler, self.driver, loading
        )
        self.engines = EngineService(registry, self.journal, self.scheduler, loading)
        self.views = OperatorViews(
            self.scheduler,
            registry,
            self.sessions,
            self.tokenizers,
            self.journal,
            self.history,
            self.activity,
            self.requests,
        )
        self._trimmer: asyncio.Task | None = None

    @property
    def limits(self) -> Limits:
        return self.admission.limits

    async def start(self, engine_urls: tuple[str, ...] = (), own_engine: str | None = None) -> None:
        """Bring the store to the newest schema, restore what it holds, register engines
        (``own_engine``: the one of ``engine_urls`` that ``parrot serve`` started itself,
        registered once it has loaded its model; the start does not wait for it)."""
        store = self.journal.store
        snapshot = None
        if store is not None:
            await store.migrate()
            snapshot = await store.snapshot()
            # This run's context ids; contexts of earlier runs are freed on their engines.
            await self.contexts.claim_region(store)
        self.journal.start()
        self.scheduler.start()
        loading = own_engine is not None and not await self.engines.loading.serves(own_engine)
        await self.engines.restore(snapshot.engines if snapshot else [], engine_urls, own_engine, loading)
        if snapshot is not None:  # sessions, variables and calls; unfinished calls run again
            self.sessions.restore(snapshot.sessions)
            self.vars.restore(snapshot.vars, self.sessions)
            self.calls.restore(snapshot.calls, self.sessions)
        self.sessions.start()
        self.views.start()
        self._trimmer = asyncio.create_task(
            self.memory.watch([self.tokenizers, self.admission.budget], self.history.interval_s)
        )

    async def stop(self) -> None:
        self.sessions.stop()
        self.views.stop()
        if self._trimmer is not None:
            self._trimmer.cancel()
        await self.scheduler.stop()
        await self.engines.close()
        self.transforms.close()
        await self.journal.stop()
        if self.journal.store is not None:
            await self.journal.store.close()
