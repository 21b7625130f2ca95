"""What operators see: engines, counters for ``/metrics``, the load history, the sessions
and their DAGs, the context trees, the OpenAI front's recent requests; and the two loops
that feed the history and the activity log.

Everything here is read-only and reads the scheduler through one narrow interface
(:mod:`parrot.platform.serve.scheduler.snapshot`), never its queue, slots or trees, so the
scheduler can change without touching the views.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

from parrot.engines.protocol.errors import NotFoundError
from parrot.platform.serve.engines.registry import EngineRegistry
from parrot.platform.serve.engines.tokenizers import TokenizerManager
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.ops import observe
from parrot.platform.serve.ops.activity import ActivityLog
from parrot.platform.serve.ops.history import LoadHistory, LoadSample
from parrot.platform.serve.ops.observe import ContextTreeView, DisplayState, SessionDag, SessionSummary
from parrot.platform.serve.ops.requests import RequestLog, RequestRecord
from parrot.platform.serve.scheduler import snapshot
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.snapshot import SchedulerSnapshot
from parrot.platform.serve.sessions.service import SessionService
from parrot.wire.responses import EngineInfo


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
    engines: list[EngineInfo]
    value_bytes: int = 0  # memory of the values held (--max-value-bytes bounds it)


class OperatorViews:
    def __init__(
        self,
        scheduler: GlobalScheduler,
        registry: EngineRegistry,
        sessions: SessionService,
        tokenizers: TokenizerManager,
        journal: Journal,
        history: LoadHistory,
        activity: ActivityLog,
        requests: RequestLog,
    ) -> None:
        self.scheduler = scheduler
        self.registry = registry
        self.sessions = sessions
        self.tokenizers = tokenizers
        self.journal = journal
        self.history = history
        self.activity = activity
        self.requests = requests
        self._loops: list[asyncio.Task] = []

    # -- engines and counters --------------------------------------------------------------
    def engine_views(self, now: SchedulerSnapshot | None = None) -> list[EngineInfo]:
        """The engines as operators see them: the one place :class:`EngineInfo` is made."""
        now = now or snapshot.take(self.scheduler)
        return [
            EngineInfo(
                engine_id=e.engine_id,
                kind=self.registry.specs[e.engine_id].kind,
                url=self.registry.url_of(e.engine_id),
                model=e.model,
                up=e.up,
                running=e.running,
                capacity=e.task_limit,
                contexts=e.contexts,
                missed_pings=e.missed_pings,
                jobs_running=e.info.get("num_running"),
                jobs_waiting=e.info.get("num_waiting"),
                max_running=e.info.get("max_running"),
                kv_blocks_used=e.info.get("kv_blocks_used"),
                kv_blocks_total=e.info.get("kv_blocks_total"),
                tokens_per_s=e.info.get("tokens_per_s"),
                backend=e.info.get("backend"),
            )
            for e in now.engines
        ]

    def engine_view(self, engine_id: str) -> EngineInfo:
        for view in self.engine_views():
            if view.engine_id == engine_id:
                return view
        raise NotFoundError(f"engine {engine_id!r} is not registered")

    def stats(self) -> CoreStats:
        now = snapshot.take(self.scheduler)
        return CoreStats(
            sessions=len(self.sessions),
            queued=now.queued,
            **asdict(now.counters),
            tokenizer_hits=self.tokenizers.hits,
            tokenizer_misses=self.tokenizers.misses,
            store_failures=self.journal.failures,
            engines=self.engine_views(now),
            value_bytes=self.sessions.admission.budget.held,
        )

    # -- load history ------------------------------------------------------------------------
    def sample_load(self) -> LoadSample:
        """Record the load now in the history (the sampling loop does so every interval)."""
        now = snapshot.take(self.scheduler)
        sample = LoadSample(
            at=time.time(),
            tokens_per_s=float(sum(e.info.get("tokens_per_s") or 0.0 for e in now.engines if e.up)),
            queued=now.queued,
            running=now.running,
        )
        self.history.add(sample)
        return sample

    def load_history(self) -> list[LoadSample]:
        """Load samples of the last minutes, oldest first."""
        return self.history.samples()

    # -- sessions and contexts ---------------------------------------------------------------
    def session_summaries(self, query: str | None = None) -> list[SessionSummary]:
        """Live sessions (newest first), then recently closed ones (newest first); with
        ``query``, those whose label, a tag or id has it (:meth:`SessionSummary.matches`).
        One-shot sessions of the OpenAI front are not listed (:meth:`recent_requests`)."""
        live = [observe.summarize(s, live=True) for s in self.sessions.live() if s.stored]
        live.sort(key=lambda s: s.started_at or 0.0, reverse=True)
        closed = [summary for summary, _ in reversed(self.sessions.recent)]
        return [summary for summary in live + closed if summary.matches(query)]

    def session_dag(self, session_id: str, latest: int | None = None, keep: str | None = None) -> SessionDag:
        """The DAG of a live session, or of a recently closed one as it was when it closed
        (``latest``: only the latest calls of a live one, and the node ``keep``; see
        :func:`observe.session_dag`). No auth check: the caller checks who may see it."""
        session = self.sessions.get(session_id)
        if session is not None:
            calls, variables = session.calls.values(), session.vars.values()
            named = (session.label, session.tags)
            return observe.session_dag(session_id, calls, variables, True, latest, keep, named)
        for summary, dag in self.sessions.recent:
            if summary.session_id == session_id:
                return dag
        raise NotFoundError(f"session {session_id!r} does not exist")

    def state_counts(self, session_id: str) -> Callable[[], dict[DisplayState, int]]:
        """A function that counts a session's calls per display state, over the calls it has
        now: cheap to take on the event loop, to be called off it (a page of a session with
        10,000 calls counts them in a worker thread; a count may be one state change
        behind, which a page refreshed every second can show). Empty for a closed session."""
        session = self.sessions.get(session_id)
        calls = list(session.calls.values()) if session is not None else []
        return partial(observe.count_states, calls)

    def context_tree(self, engine_id: str) -> ContextTreeView:
        """The contexts this ServeCore holds on an engine, as their prefix tree."""
        return snapshot.engine_contexts(self.scheduler, engine_id)

    # -- the OpenAI front's requests -------------------------------------------------------
    def recent_requests(self, query: str | None = None) -> list[RequestRecord]:
        """The front's requests that ended lately (the last ``RequestLog.keep``), newest
        first; with ``query``, those whose label, id, model or a tag has it."""
        return self.requests.recent(query)

    def request_record(self, request_id: str) -> RequestRecord:
        """One of them (404 when it is not, or no longer, kept)."""
        return self.requests.get(request_id)

    # -- loops -------------------------------------------------------------------------------
    def start(self) -> None:
        self._loops = [asyncio.create_task(self._sample_loop()), asyncio.create_task(self._activity_loop())]

    def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()

    async def _sample_loop(self) -> None:
        while True:
            self.sample_load()
            await asyncio.sleep(self.history.interval_s)

    async def _activity_loop(self) -> None:
        while True:
            await asyncio.sleep(self.activity.interval_s)
            self.activity.summarize(len(self.sessions), snapshot.queued(self.scheduler))
