"""What each page shows, built from the ServeCore's operator views only (never the scheduler's
parts), the text of a variable being generated included (``DagVar.partial``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from markupsafe import Markup

from parrot.platform.serve.ops.observe import (
    ContextTreeView,
    DagCall,
    DagVar,
    DisplayState,
    SessionDag,
    SessionSummary,
)
from parrot.platform.serve.ops.requests import RequestRecord
from parrot.platform.serve.ops.views import OperatorViews
from parrot.web.svg import charts, dag, tree
from parrot.wire.responses import EngineInfo

CALL_STATES = tuple(DisplayState)  # in the order the pages list them


@dataclass(frozen=True)
class EngineRow:
    view: EngineInfo
    health: str  # "up", "missing pings", "down"
    tasks_bar: Markup  # tasks placed on it / capacity
    kv_bar: Markup  # KV blocks used / total
    jobs_bar: Markup  # the engine's own running + waiting jobs / its running-job limit


def engine_rows(ops: OperatorViews) -> list[EngineRow]:
    rows = []
    for v in ops.engine_views():
        health = "down" if not v.up else "missing pings" if v.missed_pings else "up"
        jobs = (v.jobs_running or 0) + (v.jobs_waiting or 0)
        rows.append(
            EngineRow(
                v,
                health,
                charts.load_bar(v.running, v.capacity),
                charts.load_bar(v.kv_blocks_used, v.kv_blocks_total),
                charts.load_bar(jobs if v.jobs_running is not None else None, v.max_running),
            )
        )
    return rows


@dataclass(frozen=True)
class Overview:
    engines: list[EngineRow]
    live_sessions: int
    queued: int
    running: int
    done: int
    failed: int
    hit_rate: float | None  # prompt tokens forked from cached contexts / all prompt tokens
    tokens_per_s: float
    throughput: Markup
    queue: Markup
    minutes: float  # what the sparklines cover
    sessions: list[SessionSummary]


def overview(ops: OperatorViews) -> Overview:
    st = ops.stats()
    history = ops.load_history()
    engines = engine_rows(ops)
    span = (history[-1].at - history[0].at) / 60 if len(history) > 1 else 0.0
    return Overview(
        engines=engines,
        live_sessions=st.sessions,
        queued=st.queued,
        running=sum(e.view.running for e in engines),
        done=st.done,
        failed=st.failed,
        hit_rate=st.reused_tokens / st.prompt_tokens if st.prompt_tokens else None,
        tokens_per_s=history[-1].tokens_per_s if history else 0.0,
        throughput=charts.sparkline([s.tokens_per_s for s in history], "tokens per second"),
        queue=charts.sparkline([float(s.queued) for s in history], "queued tasks"),
        minutes=span,
        sessions=ops.session_summaries()[:8],
    )


@dataclass(frozen=True)
class SessionList:
    sessions: list[SessionSummary]
    totals: dict[str, int]  # call state -> calls, over the listed sessions
    live: int
    recent: int
    query: str = ""  # the search: sessions whose label, a tag or id has it


def session_list(ops: OperatorViews, query: str | None = None) -> SessionList:
    sessions = ops.session_summaries(query)
    totals = {state: 0 for state in CALL_STATES}
    for s in sessions:
        for state, n in s.states.items():
            totals[state] = totals.get(state, 0) + n
    live = sum(s.live for s in sessions)
    return SessionList(sessions, totals, live, len(sessions) - live, (query or "").strip())


@dataclass(frozen=True)
class RequestList:
    """The OpenAI front's recent requests, newest first (those the search finds)."""

    requests: list[RequestRecord]
    query: str  # the search: requests whose label, id, model or a tag has it
    kept: int  # requests the ServeCore keeps (the last ones)


def request_list(ops: OperatorViews, query: str | None = None) -> RequestList:
    return RequestList(ops.recent_requests(query), (query or "").strip(), ops.requests.keep)


@dataclass(frozen=True)
class NodeDetail:
    call: DagCall | None = None
    var: DagVar | None = None
    names: dict[str, str] = field(default_factory=dict)  # var id -> name
    partials: dict[str, str] = field(default_factory=dict)  # var id -> its text so far (generating)


@dataclass(frozen=True)
class SessionPage:
    dag: SessionDag
    svg: Markup
    gantt: Markup
    states: dict[str, int]
    detail: NodeDetail | None
    selected: str | None
    drawn_calls: int  # the DAG and the timeline draw the latest calls only (MAX_DRAWN_CALLS)
    total_calls: int


# A session's DAG and timeline draw at most this many calls (the latest): drawing is linear,
# but 10,000 calls make 10 MB of SVG per update that no one can read. Counts cover them all.
MAX_DRAWN_CALLS = 400


def latest_calls(graph: SessionDag, limit: int = MAX_DRAWN_CALLS) -> SessionDag:
    """The sub-DAG of the ``limit`` latest calls and the variables they touch."""
    if len(graph.calls) <= limit:
        return graph
    calls = sorted(graph.calls, key=lambda c: c.seq)[-limit:]
    kept = {c.call_id for c in calls}
    touched = {v for c in calls for v in (*c.inputs, *c.outputs)}
    edges = [e for e in graph.edges if (e.source in kept or e.target in kept)]
    variables = [v for v in graph.vars if v.var_id in touched]
    return SessionDag(graph.session_id, graph.live, calls, variables, edges, graph.label, graph.tags)


def node_link(session_id: str, node_id: str) -> str:
    return f"/sessions/{session_id}?node={node_id}#detail"


@dataclass(frozen=True)
class SessionSnapshot:
    """What a session page draws from, taken on the event loop in time bounded by what is
    drawn: the DAG of the latest calls (and the selected node), and a count of all calls per
    state to run off the loop (None: count the DAG's calls, a closed session's whole DAG)."""

    graph: SessionDag
    count_states: Callable[[], dict[DisplayState, int]] | None = None
    partials: dict[str, str] = field(default_factory=dict)  # see partial_texts


def session_snapshot(ops: OperatorViews, session_id: str, selected: str | None = None) -> SessionSnapshot:
    graph = ops.session_dag(session_id, latest=MAX_DRAWN_CALLS, keep=selected)
    counts = ops.state_counts(session_id) if graph.live else None
    return SessionSnapshot(graph, counts, partial_texts(graph, selected))


def partial_texts(graph: SessionDag, selected: str | None) -> dict[str, str]:
    """The text generated so far of the selected node's variables still being generated (a
    call's outputs, or the variable itself), by var id: what its detail shows growing live.
    Only the selected node's, so a page's snapshot stays bounded (each is already cut to
    its latest ``VALUE_PREVIEW`` characters by the DAG view)."""
    if not selected or not graph.live:
        return {}
    call = next((c for c in graph.calls if c.call_id == selected), None)
    wanted = set(call.outputs) if call is not None else {selected}
    return {v.var_id: v.partial for v in graph.vars if v.var_id in wanted and v.partial}


def session_page(snapshot: SessionSnapshot | SessionDag, selected: str | None = None) -> SessionPage:
    """The session page of a snapshot (:func:`session_snapshot`, or a whole DAG). Pure: it
    runs in a worker thread, off the event loop."""
    if isinstance(snapshot, SessionDag):
        snapshot = SessionSnapshot(snapshot)
    graph = snapshot.graph
    session_id = graph.session_id
    states = {state: 0 for state in CALL_STATES}
    counted = snapshot.count_states() if snapshot.count_states else None
    for state, n in (counted or {}).items():
        states[state] = n
    if counted is None:
        for call in graph.calls:
            states[call.state] = states.get(call.state, 0) + 1
    names = {v.var_id: v.name for v in graph.vars}
    detail = None
    if selected:
        call = next((c for c in graph.calls if c.call_id == selected), None)
        var = next((v for v in graph.vars if v.var_id == selected), None)
        if call is not None or var is not None:
            detail = NodeDetail(call, var, names, snapshot.partials)
    drawn = latest_calls(graph)
    return SessionPage(
        graph,
        dag.render(drawn, lambda node: node_link(session_id, node), selected),
        charts.gantt(drawn.calls),
        states,
        detail,
        selected if detail is not None else None,
        len(drawn.calls),
        max(sum(states.values()), len(graph.calls)),
    )


@dataclass(frozen=True)
class EngineTree:
    view: ContextTreeView
    svg: Markup
    shared_nodes: int
    sessions: list[str]  # sessions holding contexts on the engine


def context_trees(ops: OperatorViews) -> list[EngineTree]:
    out = []
    for engine in ops.engine_views():
        view = ops.context_tree(engine.engine_id)
        sessions = sorted({s for n in view.nodes for s in n.sessions})
        out.append(EngineTree(view, tree.render(view), sum(n.shared for n in view.nodes), sessions))
    return out
