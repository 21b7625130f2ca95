"""Read-only views of a session's DAG and an engine's context tree, for operators.

The dashboard and the JSON routes ``GET /v1/session/{id}/dag`` and
``GET /v1/engines/{id}/contexts`` show these; they are built from the graph and the context
tree by the functions here (called by :mod:`.operator_views`), so nothing outside the serve
layer reads the scheduler's structures. Values are cut to ``VALUE_PREVIEW`` characters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from parrot.platform.serve.calls.graph import (
    CompletionChain,
    ConstantFill,
    PlaceholderFill,
    PlaceholderGen,
    RequestChain,
    SemanticVariable,
    TransformGen,
)
from parrot.platform.serve.calls.state import CallState
from parrot.platform.serve.contexts.tree import ContextTree
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.formats import FieldError
from parrot.wire.formats import OutputFormat
from parrot.wire.template import format_path

VALUE_PREVIEW = 4000  # characters of a value or a template piece shown
TREE_NODES = 400  # context-tree nodes shown per engine (the first in depth-first order)


class DisplayState(StrEnum):
    """A call's state as operators see it: :class:`CallState` with its ``pending`` split
    into ``waiting`` (for inputs) and ``queued`` (ready, waiting for an engine)."""

    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = CallState.RUNNING.value
    DONE = CallState.DONE.value
    FAILED = CallState.FAILED.value


def _cut(text: str | None) -> tuple[str | None, bool]:
    if text is None or len(text) <= VALUE_PREVIEW:
        return text, False
    return text[:VALUE_PREVIEW], True


@dataclass(frozen=True)
class TemplatePart:
    """A piece of a call's template: ``text`` (constant), ``input`` or ``output`` (a
    variable: its value, or None while it has none)."""

    kind: str
    text: str | None
    name: str = ""
    var_id: str = ""
    truncated: bool = False


@dataclass(frozen=True)
class DagCall:
    call_id: str
    seq: int  # submission order in the ServeCore
    kind: str  # "llm" or "transform"
    state: DisplayState
    engine: str | None
    inputs: list[str]  # var ids, in template order
    outputs: list[str]
    latency_critical: bool  # a latency get (or output_criteria) waits on it
    group: str | None  # the task group it belongs to (named after the consumer call)
    timings: dict[str, float]  # submitted_at, started_at, first_token_at, finished_at (unix s)
    error: str | None
    template: list[TemplatePart]
    sampling: dict[str, dict] = field(default_factory=dict)  # output name -> settings


@dataclass(frozen=True)
class DagVar:
    var_id: str
    name: str
    state: str  # "empty", "ready" or "failed"
    value: str | None
    error: str | None
    producer: str | None  # call id
    consumers: list[str]  # call ids
    truncated: bool = False
    format: OutputFormat | None = None  # a typed variable's format
    partial: str | None = None  # while its producer generates: the text so far (its end)


@dataclass(frozen=True)
class DagEdge:
    """Semantic-variable flow: var -> call (an input) or call -> var (an output)."""

    source: str
    target: str


@dataclass(frozen=True)
class SessionDag:
    session_id: str
    live: bool  # False: a recently closed session, as it was when it closed
    calls: list[DagCall]
    vars: list[DagVar]
    edges: list[DagEdge]
    label: str | None = None  # the session's, as its client named it
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    live: bool
    calls: int
    states: dict[DisplayState, int]  # call state -> count
    started_at: float | None  # the first call's submission (unix seconds)
    last_activity_at: float | None  # the latest call timing
    closed_at: float | None = None
    label: str | None = None  # what its client named it
    tags: tuple[str, ...] = ()

    def matches(self, query: str | None) -> bool:
        """Whether ``query`` (case aside) is part of its label, one of its tags or its id;
        no query matches every session."""
        return matches(query, self.label, self.session_id, *self.tags)


@dataclass(frozen=True)
class ContextNode:
    """A node of an engine's prefix tree: a run of tokens some contexts hold."""

    node_id: int  # position in depth-first order (0 is the first node under the root)
    parent: int | None
    start: int  # tokens on the path before this node
    tokens: int  # tokens of this node
    contexts: int  # contexts whose path passes through it (they all share these tokens)
    refs: int  # tasks using those contexts now
    sessions: list[str]  # sessions whose contexts hold it
    shared: bool  # held by a context every session shares (constant text) or by >1 session
    subtree_tokens: int  # tokens of this node and everything under it
    kv_blocks: int | None  # KV blocks those tokens take (estimate: tokens / block size)


@dataclass(frozen=True)
class ContextTreeView:
    engine_id: str
    model: str
    text: bool  # symbols are characters (an OpenAI engine), else tokens
    contexts: int
    held_tokens: int  # each shared token once
    block_size: int | None
    kv_blocks_used: int | None
    kv_blocks_total: int | None
    nodes: list[ContextNode]
    truncated: bool = False  # more nodes than TREE_NODES


# -- session DAG ---------------------------------------------------------------------------
def call_state(call: RequestChain) -> DisplayState:
    state = call.state
    if state != CallState.PENDING:
        return DisplayState(state.value)
    chain = next((c for c in call.chains if not c.settled), None)
    return DisplayState.QUEUED if chain is not None and chain.ready() else DisplayState.WAITING


def _template(call: RequestChain) -> list[TemplatePart]:
    parts = []
    for node in call.nodes:
        if isinstance(node, ConstantFill):
            text, cut = _cut(node.text)
            parts.append(TemplatePart("text", text, truncated=cut))
        elif isinstance(node, PlaceholderFill):
            try:
                text, cut = _cut(node.text)
            except FieldError:  # the call fails (or failed) for it
                text, cut = None, False
            name = node.var.name + format_path(node.path)
            parts.append(TemplatePart("input", text, name, node.var.var_id, cut))
        else:
            gen = isinstance(node, PlaceholderGen) and node.placeholder
            name = node.placeholder if gen else node.var.name
            text, cut = _cut(node.var.value)
            parts.append(TemplatePart("output", text, name, node.var.var_id, cut))
    return parts


def _group(chains: Iterable[CompletionChain]) -> str | None:
    group = next((c.group for c in chains if c.group is not None), None)
    return None if group is None else f"group-{group[1]}"


def dag_call(call: RequestChain) -> DagCall:
    transform = any(isinstance(c.gen, TransformGen) for c in call.chains)
    sampling = {
        (c.gen.placeholder or c.gen.var.name): msgspec.to_builtins(c.gen.sampling)
        for c in call.chains
        if isinstance(c.gen, PlaceholderGen)
    }
    return DagCall(
        call_id=call.call_id,
        seq=call.seq,
        kind="transform" if transform else "llm",
        state=call_state(call),
        engine=call.engine_id,
        inputs=[v.var_id for v in call.input_vars()],
        outputs=[v.var_id for v in call.output_vars()],
        latency_critical=any(c.latency_depth > 0 for c in call.chains),
        group=_group(call.chains),
        timings=dict(call.timings),
        error=call.error,
        template=_template(call),
        sampling=sampling,
    )


def dag_var(var: SemanticVariable) -> DagVar:
    value, cut = _cut(var.value)
    state = "failed" if var.error else "ready" if var.ready else "empty"
    consumers = sorted({c.call.call_id for c in var.consumers})
    producer = var.producer.call.call_id if var.producer is not None else None
    partial = var.partial
    if partial is not None and len(partial) > VALUE_PREVIEW:
        partial = "…" + partial[-VALUE_PREVIEW:]  # the end is what is new
    return DagVar(
        var.var_id, var.name, state, value, var.error, producer, consumers, cut, var.format, partial
    )


def session_dag(
    session_id: str,
    calls: Iterable[RequestChain],
    variables: Iterable[SemanticVariable],
    live: bool,
    latest: int | None = None,
    keep: str | None = None,
    named: tuple[str | None, tuple[str, ...]] = (None, ()),
) -> SessionDag:
    """The DAG of these calls and variables; with ``latest``, only the latest calls (and the
    variables they touch, and the node ``keep`` if any): what a page draws of a big session,
    made in time linear in what it draws, not in the session. ``named``: the session's label
    and tags."""
    ordered = sorted(calls, key=lambda c: c.seq)
    if latest is not None and len(ordered) > latest:
        cut = len(ordered) - latest
        ordered = [c for c in ordered[:cut] if c.call_id == keep] + ordered[cut:]
        touched = {v.var_id for c in ordered for v in (*c.input_vars(), *c.output_vars())}
        variables = [v for v in variables if v.var_id in touched or v.var_id == keep]
    edges = []
    for call in ordered:
        inputs = dict.fromkeys(v.var_id for v in call.input_vars())
        edges += [DagEdge(v, call.call_id) for v in inputs]
        edges += [DagEdge(call.call_id, v.var_id) for v in call.output_vars()]
    return SessionDag(
        session_id, live, [dag_call(c) for c in ordered], [dag_var(v) for v in variables], edges, *named
    )


def count_states(calls: Iterable[RequestChain]) -> dict[DisplayState, int]:
    """How many of these calls are in each display state."""
    states: dict[DisplayState, int] = {}
    for call in calls:
        state = call_state(call)
        states[state] = states.get(state, 0) + 1
    return states


def summarize(session: Session, live: bool, closed_at: float | None = None) -> SessionSummary:
    calls = list(session.calls.values())
    states = count_states(calls)
    times = [t for c in calls for t in c.timings.values()]
    submitted = [c.timings["submitted_at"] for c in calls if "submitted_at" in c.timings]
    return SessionSummary(
        session.session_id,
        live,
        len(calls),
        states,
        min(submitted, default=None),
        max(times, default=None),
        closed_at,
        session.label,
        session.tags,
    )


def matches(query: str | None, *texts: str | None) -> bool:
    """Whether ``query`` is part of one of ``texts``, case aside (the dashboard's search
    boxes); an empty query matches everything."""
    query = (query or "").strip().casefold()
    return not query or any(query in text.casefold() for text in texts if text)


# -- context trees -------------------------------------------------------------------------
def _subtree_tokens(tree: ContextTree) -> dict[int, int]:
    """Tokens under each node (by ``id``), its own included; iterative (paths may be deep)."""
    order = list(tree.tree.nodes())  # every node comes before its children
    total = {id(n): len(n.segment) for n in order}
    for node in reversed(order):
        if node.parent is not None and id(node.parent) in total:
            total[id(node.parent)] += total[id(node)]
    return total


def context_tree(
    engine_id: str, model: str, tree: ContextTree, info: dict, limit: int = TREE_NODES
) -> ContextTreeView:
    block = info.get("block_size") if not tree.text else None
    nodes: list[ContextNode] = []
    under = _subtree_tokens(tree)
    stack = [(child, None) for child in reversed(list(tree.tree.root.children.values()))]
    truncated = False
    while stack:
        node, parent = stack.pop()
        if len(nodes) >= limit:
            truncated = True
            break
        holders = list(node.holders)
        sessions = sorted({c.owner for c in holders if c.owner is not None})
        common = any(c.owner is None for c in holders)
        nodes.append(
            ContextNode(
                node_id=len(nodes),
                parent=parent,
                start=node.depth,
                tokens=len(node.segment),
                contexts=len(holders),
                refs=sum(c.refs for c in holders),
                sessions=sessions,
                shared=common or len(sessions) > 1,
                subtree_tokens=under[id(node)],
                kv_blocks=math.ceil(under[id(node)] / block) if block else None,
            )
        )
        me = len(nodes) - 1
        stack += [(child, me) for child in reversed(list(node.children.values()))]
    return ContextTreeView(
        engine_id=engine_id,
        model=model,
        text=tree.text,
        contexts=len(tree),
        held_tokens=tree.held_symbols(),
        block_size=block,
        kv_blocks_used=info.get("kv_blocks_used"),
        kv_blocks_total=info.get("kv_blocks_total"),
        nodes=nodes,
        truncated=truncated,
    )
