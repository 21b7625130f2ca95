"""Calls become chains of nodes; variables link them into a DAG; cycles are refused."""

from __future__ import annotations

import itertools

import pytest

from parrot.platform.serve.calls import graph
from parrot.platform.serve.calls.graph import ConstantFill, PlaceholderFill, PlaceholderGen, RequestChain
from parrot.platform.serve.errors import GraphError
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.wire.sampling import SamplingParams
from parrot.wire.template import TemplateError, parse_template

GEN = SamplingParams(max_tokens=8)


class Session:
    """A tiny harness: named variables and the calls linked through them."""

    def __init__(self) -> None:
        self.vars: dict[str, SemanticVariable] = {}
        self.calls: list[RequestChain] = []
        self.ids = itertools.count(1)

    def var(self, name: str, value: str | None = None) -> SemanticVariable:
        if name not in self.vars:
            self.vars[name] = SemanticVariable(f"v{len(self.vars)}", name, value)
        return self.vars[name]

    def call(self, template: str, outputs: list[str], add: bool = True) -> RequestChain:
        chunks = parse_template(template)
        names = [c.name for c in chunks if hasattr(c, "name")]
        call = RequestChain.build(
            f"c{next(self.ids)}", chunks, {n: self.var(n) for n in names}, dict.fromkeys(outputs, GEN)
        )
        if add:
            graph.add(call)
            self.calls.append(call)
        return call


def test_request_chain_nodes_and_completion_chains():
    s = Session()
    s.var("doc", "text")
    call = s.call("Read {{doc}}. Title: {{title}}. Summary: {{summary}}. Done.", ["title", "summary"])
    kinds = [type(n) for n in call.nodes]
    assert kinds == [
        ConstantFill,
        PlaceholderFill,
        ConstantFill,
        PlaceholderGen,
        ConstantFill,
        PlaceholderGen,
        ConstantFill,
    ]
    first, second = call.chains
    assert [type(n) for n in first.fills] == [ConstantFill, PlaceholderFill, ConstantFill]
    assert first.gen.var.name == "title" and second.gen.var.name == "summary"
    assert second.previous is first and second.upstream() == [first]
    assert [type(n) for n in second.prompt_nodes()] == kinds[:5]
    assert first.ready() and not second.ready()
    s.vars["title"].value = "T"
    assert second.ready()


def test_chain_of_three_calls_links_through_variables():
    s = Session()
    s.var("topic", "tides")
    a = s.call("Write about {{topic}}: {{a}}", ["a"])
    b = s.call("Improve: {{a}} -> {{b}}", ["b"])
    c = s.call("Shorten: {{b}} -> {{c}}", ["c"])
    assert c.chains[0].upstream() == [b.chains[0]] and b.chains[0].upstream() == [a.chains[0]]
    order = graph.producers_of(s.vars["c"])
    assert [(chain.call.call_id, depth) for chain, depth in order] == [("c3", 1), ("c2", 2), ("c1", 3)]
    assert s.vars["a"].consumers == [b.chains[0]]
    assert not b.chains[0].ready()


def test_map_reduce_shape():
    s = Session()
    for i in range(4):
        s.var(f"chunk{i}", f"part {i}")
        s.call(f"Summarize {{{{chunk{i}}}}}: {{{{s{i}}}}}", [f"s{i}"])
    reduce = s.call("Combine {{s0}} {{s1}} {{s2}} {{s3}}: {{final}}", ["final"])
    assert len(reduce.chains[0].upstream()) == 4
    assert len(graph.producers_of(s.vars["final"])) == 5


def test_cycles_and_second_producers_are_refused_without_changing_the_graph():
    s = Session()
    s.call("x {{v}} -> {{w}}", ["w"])
    with pytest.raises(GraphError, match="cycle"):
        s.call("y {{w}} -> {{v}}", ["v"])
    assert s.vars["v"].producer is None and len(s.calls) == 1 and not s.vars["w"].consumers
    with pytest.raises(GraphError, match="already produced by call c1"):
        s.call("z: {{w}}", ["w"])
    u = s.var("u")
    call = RequestChain.build("c9", parse_template("q {{a}} -> {{b}}"), {"a": u, "b": u}, {"b": GEN})
    with pytest.raises(GraphError, match="both an input and an output"):
        graph.add(call)
    s.var("done", "value")
    with pytest.raises(GraphError, match="already has a value"):
        s.call("r: {{done}}", ["done"])


def test_a_call_needs_an_output():
    s = Session()
    with pytest.raises(TemplateError, match="at least one output"):
        s.call("just {{text}}", [], add=False)
