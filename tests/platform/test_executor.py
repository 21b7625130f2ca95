"""The DAG runs on the real engine without client round trips: chains, map-reduce, sharing."""

from __future__ import annotations

import itertools

import pytest
import pytest_asyncio

from parrot.engines.protocol.sampling import SamplingParams
from parrot.platform.serve.context_manager import ContextTree
from parrot.platform.serve.engine_client import HttpEngine
from parrot.platform.serve.errors import ProducerFailedError
from parrot.platform.serve.executor import EngineSlot, GlobalScheduler
from parrot.platform.serve.graph import Graph, RequestChain, SemanticVariable
from parrot.platform.serve.graph_executor import GraphExecutor
from parrot.platform.serve.template import parse_template
from parrot.platform.serve.variables import Variables

pytestmark = pytest.mark.asyncio(loop_scope="function")
SAMPLING = SamplingParams(max_tokens=8, temperature=0.0)


class App:
    """A session's variables, graph and executor over one engine (the ServeCore's parts)."""

    def __init__(self, scheduler: GlobalScheduler, session_id: str, seq) -> None:
        self.session_id = session_id
        self.vars: dict[str, SemanticVariable] = {}
        self.graph = Graph()
        self.executor = GraphExecutor(session_id, scheduler, seq)
        self.calls = itertools.count(1)

    def var(self, name: str, value: str | None = None) -> SemanticVariable:
        if name not in self.vars:
            self.vars[name] = SemanticVariable(f"{self.session_id}-{name}", name, value)
        return self.vars[name]

    def call(self, template: str, output: str, models: tuple[str, ...] = ()) -> RequestChain:
        chunks = parse_template(template)
        names = [c.name for c in chunks if hasattr(c, "name")]
        request = RequestChain.build(
            f"{self.session_id}-c{next(self.calls)}",
            chunks,
            {n: self.var(n) for n in names},
            {output: SAMPLING},
        )
        self.graph.add(request)
        self.executor.submit(request.chains, models)
        return request


@pytest_asyncio.fixture(loop_scope="function")
async def scheduler(engine_server, engine, ids):
    client = HttpEngine(engine_server.url)
    variables = Variables()
    sched = GlobalScheduler(variables)
    slot = EngineSlot("e1", engine.model_name, client, ContextTree(client, ids), capacity=16)
    sched.add_engine(slot)
    sched.start()
    yield sched
    await sched.stop()
    assert all(n.refs == 0 for n in slot.tree._all())  # every task released its context
    await slot.tree.evict(max_contexts=0)
    assert len(slot.tree) == 0
    await client.aclose()


async def test_three_step_chain_completes_with_one_final_get(scheduler):
    app = App(scheduler, "s1", itertools.count())
    app.var("topic", "lighthouses")
    done = []
    scheduler.on_done = lambda task: done.append(task.chain.gen.var.name)
    app.call("Write one sentence about {{topic}}: {{a}}", "a")
    app.call("Make this sentence shorter: {{a}}\nShorter: {{b}}", "b")
    app.call("Give a title for: {{b}}\nTitle: {{c}}", "c")
    # Everything was submitted; only the last value is awaited.
    final = await scheduler.variables.wait(app.vars["c"], timeout=120)
    assert final and app.vars["a"].value and app.vars["b"].value
    assert done == ["a", "b", "c"]


async def test_map_reduce_runs_the_maps_as_a_group_before_the_reduce(scheduler):
    app = App(scheduler, "s2", itertools.count())
    started = []
    submit = scheduler.submit

    def record(task):
        started.append((task.chain.gen.var.name, task.group))
        submit(task)

    scheduler.submit = record
    for i in range(8):
        app.var(f"part{i}", f"Section {i}: the keeper lit lamp number {i}.")
        app.call(f"Summarize: {{{{part{i}}}}}\nSummary: {{{{s{i}}}}}", f"s{i}")
    inputs = " ".join(f"{{{{s{i}}}}}" for i in range(8))
    reduce = app.call(f"Combine these summaries: {inputs}\nCombined: {{{{total}}}}", "total")
    assert await scheduler.variables.wait(app.vars["total"], timeout=180)
    maps = [g for name, g in started if name.startswith("s")]
    assert len(maps) == 8 and len(set(maps)) == 1 and maps[0] is not None  # one task group
    assert started[-1][0] == "total" and all(app.vars[f"s{i}"].ready for i in range(8))
    assert reduce.chains[0].upstream() and len(reduce.chains[0].upstream()) == 8


async def test_sessions_share_the_system_prompt_context(scheduler):
    system = "You are a museum guide for the old lighthouse. Reply briefly. " * 6
    outputs = []
    for n in range(3):
        app = App(scheduler, f"u{n}", itertools.count())
        app.var("q", f"Question number {n}?")
        app.call(f"{system}\nUser: {{{{q}}}}\nGuide: {{{{a}}}}", "a")
        outputs.append(await scheduler.variables.wait(app.vars["a"], timeout=120))
    tree = scheduler.engines["e1"].tree
    assert ("text", f"{system}\nUser: ") in tree.roots  # one context for all three sessions
    assert len([k for k in tree.roots if k[0] == "text" and system in k[1]]) == 1
    assert all(outputs)


async def test_a_failed_producer_fails_its_consumers_with_the_reason(scheduler):
    app = App(scheduler, "s3", itertools.count())
    app.var("x", "hello")
    app.call("Echo {{x}}: {{y}}", "y", models=("no-such-model",))
    app.call("Again {{y}}: {{z}}", "z")
    with pytest.raises(ProducerFailedError, match="no engine serves"):
        await scheduler.variables.wait(app.vars["z"], timeout=30)
