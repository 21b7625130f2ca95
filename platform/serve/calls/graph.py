"""The graph of a session: semantic calls as chains of nodes, linked by semantic variables.

A call's template becomes a :class:`RequestChain` of nodes (``ConstantFill`` for text,
``PlaceholderFill`` for an input variable, ``PlaceholderGen`` for an output variable),
split into :class:`CompletionChain` s of fills ending in one generation: the unit the
scheduler runs. A chain depends on the producers of the variables it fills and on the
chain before it in its own call. Variables link calls of a session into a DAG.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from parrot.engines.protocol.schemas import GenerateResponse, StreamEnd
from parrot.platform.serve.calls.state import CallState
from parrot.platform.serve.errors import GraphError
from parrot.platform.serve.variables.formats import read_field
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.wire.sampling import SamplingParams
from parrot.wire.template import Chunk, PathStep, PlaceholderChunk, TemplateError, TextChunk


@dataclass(eq=False)
class ConstantFill:
    text: str


@dataclass(eq=False)
class PlaceholderFill:
    var: SemanticVariable
    path: tuple[PathStep, ...] = ()  # a field of the variable's JSON value: {{plan.steps[0]}}

    @property
    def text(self) -> str | None:
        """What it fills in: the value, or the field at ``path`` (strings unquoted, other JSON
        compact); None while there is no value. Raises ``FieldError`` (a missing field)."""
        if self.var.value is None or not self.path:
            return self.var.value
        return read_field(self.var.value, self.path)


@dataclass(eq=False)
class PlaceholderGen:
    var: SemanticVariable
    sampling: SamplingParams
    placeholder: str = ""  # the template's name for it (its variable may be named otherwise)


@dataclass(eq=False)
class TransformGen:
    """An output derived from the inputs by native string transforms, on the ServeCore
    (no LLM call, no code from the call)."""

    var: SemanticVariable
    steps: list  # of parrot.platform.serve.calls.transforms.Step


FillNode = ConstantFill | PlaceholderFill
Node = ConstantFill | PlaceholderFill | PlaceholderGen | TransformGen


@dataclass(eq=False)
class CompletionChain:
    """Fills, then one generation: what one engine runs as one task."""

    call: RequestChain
    index: int  # position among the call's chains
    fills: list[FillNode]
    gen: PlaceholderGen | TransformGen
    result: GenerateResponse | StreamEnd | None = None  # the engine's answer, once generated
    # Set by a latency-critical get downstream: how far upstream of the awaited variable
    # this chain is (1 = its producer); 0 = not latency-critical.
    latency_depth: int = 0
    # The consumer call that waits on this chain together with others (a task group):
    # (its application's start, its submission order), so groups sort by application.
    group: tuple[int, int] | None = None
    gathers: bool = False  # it is such a consumer: it waits on a task group's outputs
    prompt_ids_by_model: dict[str, list[int]] = field(default_factory=dict)  # model -> prompt it ran with

    @property
    def key(self) -> str:
        """Stable identity: the call and the chain's position in it."""
        return f"{self.call.call_id}#{self.index}"

    @property
    def settled(self) -> bool:
        return self.gen.var.ready or self.gen.var.error is not None

    @property
    def previous(self) -> CompletionChain | None:
        return self.call.chains[self.index - 1] if self.index else None

    def input_vars(self) -> list[SemanticVariable]:
        return [n.var for n in self.fills if isinstance(n, PlaceholderFill)]

    def upstream(self) -> list[CompletionChain]:
        """Chains that must finish before this one can run."""
        deps = [v.producer for v in self.input_vars() if v.producer is not None]
        if self.previous is not None:
            deps.append(self.previous)
        return deps

    def ready(self) -> bool:
        """All inputs have values and the earlier part of the call has been generated."""
        earlier_done = self.previous is None or self.previous.gen.var.ready
        return earlier_done and all(v.ready for v in self.input_vars())

    def prompt_nodes(self) -> Iterator[Node]:
        """Every node whose text precedes this chain's generation, from the call's start."""
        for chain in self.call.chains[: self.index]:
            yield from chain.fills
            yield chain.gen
        yield from self.fills


@dataclass(eq=False)
class RequestChain:
    call_id: str
    nodes: list[Node]
    chains: list[CompletionChain] = field(default_factory=list)
    seq: int = 0  # submission order in the ServeCore (stable across restarts)
    engine_id: str | None = None  # where its (latest) chain ran
    # Wall-clock seconds: submitted_at, started_at (first chain), finished_at (all settled).
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def state(self) -> CallState:
        outs = self.output_vars()
        if any(v.error for v in outs):
            return CallState.FAILED
        if all(v.ready for v in outs):
            return CallState.DONE
        return CallState.RUNNING if "started_at" in self.timings else CallState.PENDING

    @property
    def stored(self) -> bool:
        return self.chains[0].gen.var.stored

    @property
    def error(self) -> str | None:
        return next((v.error for v in self.output_vars() if v.error), None)

    @classmethod
    def build(
        cls,
        call_id: str,
        chunks: list[Chunk],
        variables: Mapping[str, SemanticVariable],
        outputs: Mapping[str, SamplingParams],
    ) -> RequestChain:
        """Nodes from template chunks; ``variables`` binds every placeholder, ``outputs``
        gives the sampling of those that are outputs."""
        nodes: list[Node] = []
        for chunk in chunks:
            if isinstance(chunk, TextChunk):
                nodes.append(ConstantFill(chunk.text))
            elif chunk.name in outputs:
                nodes.append(
                    PlaceholderGen(variables[chunk.name], outputs[chunk.name], placeholder=chunk.name)
                )
            else:
                nodes.append(PlaceholderFill(variables[chunk.name], chunk.path))
        call = cls(call_id, nodes)
        fills: list[FillNode] = []
        for node in nodes:
            if isinstance(node, PlaceholderGen):
                call.chains.append(CompletionChain(call, len(call.chains), fills, node))
                fills = []
            else:
                fills.append(node)
        if not call.chains:
            raise TemplateError("a semantic call needs at least one output placeholder")
        # Text after the last output is not part of any generation; it is kept in ``nodes``.
        return call

    @classmethod
    def prompt(
        cls,
        call_id: str,
        pieces: list[str],
        output: SemanticVariable,
        sampling: SamplingParams,
    ) -> RequestChain:
        """Text pieces as they are (no template parsing), then one generation."""
        fills: list[FillNode] = [ConstantFill(p) for p in pieces if p]
        gen = PlaceholderGen(output, sampling)
        call = cls(call_id, [*fills, gen])
        call.chains.append(CompletionChain(call, 0, fills, gen))
        return call

    @classmethod
    def transform(
        cls, call_id: str, inputs: list[SemanticVariable], output: SemanticVariable, steps: list
    ) -> RequestChain:
        """A transform call: its inputs' values, in order, through ``steps`` into ``output``."""
        fills: list[FillNode] = [PlaceholderFill(v) for v in inputs]
        gen = TransformGen(output, steps)
        call = cls(call_id, [*fills, gen])
        call.chains.append(CompletionChain(call, 0, fills, gen))
        return call

    def outputs(self) -> dict[str, str]:
        """Output placeholder (or transform output) name -> variable id."""
        names = [c.gen.placeholder if isinstance(c.gen, PlaceholderGen) else "" for c in self.chains]
        return {name or c.gen.var.name: c.gen.var.var_id for name, c in zip(names, self.chains, strict=True)}

    def output_vars(self) -> list[SemanticVariable]:
        return [c.gen.var for c in self.chains]

    def input_vars(self) -> list[SemanticVariable]:
        return [v for c in self.chains for v in c.input_vars()]


def add(call: RequestChain) -> None:
    """Link a new call into its session's DAG, or raise :class:`GraphError` (nothing
    changes then)."""
    outputs = call.output_vars()
    for var in outputs:
        if var.producer is not None:
            raise GraphError(
                f"variable {var.name!r} ({var.var_id}) is already produced by call "
                f"{var.producer.call.call_id}"
            )
        if var.ready:
            raise GraphError(
                f"variable {var.name!r} ({var.var_id}) already has a value; it cannot be an output"
            )
    out_ids = {v.var_id for v in outputs}
    for var in call.input_vars():
        if var.var_id in out_ids:
            raise GraphError(f"variable {var.name!r} is both an input and an output of this call")
    # A cycle: some chain upstream of this call's inputs consumes one of its outputs.
    for chain in _ancestors(call):
        hit = next((v for v in chain.input_vars() if v.var_id in out_ids), None)
        if hit is not None:
            raise GraphError(
                f"call would create a cycle: its output {hit.name!r} feeds call {chain.call.call_id}, "
                "which this call depends on"
            )
    link(call)


def link(call: RequestChain) -> None:
    """Link a call in without checks: for calls restored from the store, which were
    checked when they were first submitted. The DAG is the variables' links (each output's
    producer, each input's consumers): a session's calls themselves are its own."""
    for chain in call.chains:
        chain.gen.var.producer = chain
        for var in chain.input_vars():
            var.consumers.append(chain)


def unlink(call: RequestChain) -> None:
    """Undo :func:`link` (a call whose store write failed: it never existed)."""
    for chain in call.chains:
        if chain.gen.var.producer is chain:
            chain.gen.var.producer = None
        for var in chain.input_vars():
            if chain in var.consumers:
                var.consumers.remove(chain)


def _ancestors(call: RequestChain) -> Iterator[CompletionChain]:
    seen: set[str] = set()
    stack = [v.producer for v in call.input_vars() if v.producer is not None]
    while stack:
        chain = stack.pop()
        if chain.key in seen:
            continue
        seen.add(chain.key)
        yield chain
        stack.extend(chain.upstream())


def producers_of(var: SemanticVariable) -> list[tuple[CompletionChain, int]]:
    """The chains that must run for ``var`` to get its value, with their depth (1 = its
    producer), nearest first: what a ``get`` activates, backwards through the DAG."""
    found: list[tuple[CompletionChain, int]] = []
    seen: set[str] = set()
    queue = deque([(var.producer, 1)] if var.producer is not None else [])
    while queue:
        chain, depth = queue.popleft()
        if chain.key in seen:
            continue
        seen.add(chain.key)
        found.append((chain, depth))
        queue.extend((up, depth + 1) for up in chain.upstream())
    return found


def placeholder_names(chunks: list[Chunk]) -> list[str]:
    return [c.name for c in chunks if isinstance(c, PlaceholderChunk)]
