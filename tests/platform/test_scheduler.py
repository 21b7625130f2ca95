"""The serve layer's scheduling: DAGs without client round trips, one engine request per
task, fill-ahead of known prefixes, continuing a call's own generation, shared system
prompts, task groups, priorities, failure propagation. On the fake engine; where tokens
or the engine's answers matter (fill-ahead, continuing, shared prefixes: a real tokenizer's
boundaries; priorities on the engine; a fork from another session's context) on the real
engine too. Chains and map-reduce run on the real engine end to end in the SDK's tests
(test_examples.py), a failed producer in test_errors.py."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import pytest_asyncio

from parrot.platform.serve.calls.service import Binding, CallRequest
from parrot.platform.serve.calls.transforms import JsonField
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import ProducerFailedError
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")
DOCUMENT = " ".join(f"Line {i}: the keeper logged wind, tide and the lamp's oil at dawn." for i in range(24))


class Spy:
    """Records the requests a ServeCore sends to a real engine client. A generation is
    recorded as ``generate`` whether it is streamed or not (semantic calls stream theirs)."""

    def __init__(self, client) -> None:
        self.client = client
        self.calls: list[tuple[str, dict]] = []
        for name in ("fill", "generate", "generate_stream", "abort", "free_context"):
            setattr(self, name, self._wrap(name))

    def _wrap(self, name):
        method = getattr(self.client, name)
        recorded = "generate" if name == "generate_stream" else name

        def call(*args, **kwargs):
            self.calls.append((recorded, {"args": args, **kwargs}))
            return method(*args, **kwargs)

        return call

    def __getattr__(self, name):
        return getattr(self.client, name)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)


@pytest_asyncio.fixture(loop_scope="function")
async def core(engine_url):
    core = ServeCore()
    await core.start()
    slot = await core.engines.register_builtin(engine_url)
    slot.client = Spy(slot.client)
    yield core
    await core.stop()


def out(name: str, max_tokens: int = 8) -> Binding:
    return Binding(name=name, is_output=True, sampling=SamplingParams(max_tokens=max_tokens, temperature=0))


async def call(core, session, template: str, **params) -> dict:
    parameters = [p if isinstance(p, Binding) else Binding(name=n, **p) for n, p in params.items()]
    request, outputs = await core.calls.submit(session, template, parameters, [], None)
    return {"request": request, **outputs}


def spy(core) -> Spy:
    return core.engines.slots()[0].client


async def test_a_chain_runs_in_order_with_one_engine_request_per_step(core):
    session, _ = await core.sessions.create()
    a = await call(core, session, "Write one sentence about tides: {{a}}", a=out("a"))
    # (known prefixes shorter than FILL_AHEAD_MIN tokens: no fill ahead; a token is a byte)
    b = await call(core, session, "Shorten: {{x}}\nShorter: {{b}}", x={"var_id": a["a"]}, b=out("b"))
    c = await call(core, session, "Title: {{y}}\nTitle: {{c}}", y={"var_id": b["b"]}, c=out("c"))
    # Everything was submitted; only the last value is awaited.
    await core.vars.get(session, c["c"], "latency", 120)
    steps = [x["request"] for x in (a, b, c)]
    for before, after in itertools.pairwise(steps):  # server-side timings
        assert after.timings["started_at"] >= before.timings["finished_at"]
    assert spy(core).count("generate") == 3 and spy(core).count("fill") == 0  # nothing else
    # Each prompt is the whole rendered text, tokenized at once.
    slot = core.engines.slots()[0]
    rendered = f"Shorten: {session.vars[a['a']].value}\nShorter: "
    expected = (await core.tokenizers.encode(slot.model, rendered)).ids
    assert tuple(steps[1].chains[0].prompt_ids_by_model[slot.model]) == expected


@pytest.mark.parametrize("engine_url", ["fake", "real"], indirect=True)
async def test_a_waiting_call_has_its_known_prefix_filled_ahead(core):
    """The document before the placeholder is filled while the first step generates; when
    the summary arrives only the rest of the prompt is computed."""
    session, _ = await core.sessions.create()
    first = await call(core, session, "Name a harbour town: {{town}}", town=out("town", 24))
    second = await call(
        core,
        session,
        "Document: " + DOCUMENT + "\nTown: {{t}}\nQuestion: who kept the lamp?\nAnswer: {{answer}}",
        t={"var_id": first["town"]},
        answer=out("answer"),
    )
    await core.vars.get(session, second["answer"], "latency", 120)
    stats = core.views.stats()
    doc_tokens = len((await core.tokenizers.encode(core.engines.models()[0], "Document: " + DOCUMENT)).ids)
    assert stats.filled_ahead >= doc_tokens - 2
    fills = [kw for name, kw in spy(core).calls if name == "fill"]
    generations = [kw for name, kw in spy(core).calls if name == "generate"]
    assert len(fills) == 1 and len(generations) == 2
    # The second generation forked the context filled ahead, at (nearly) the document's end.
    ahead_id = fills[0]["args"][0]
    assert generations[1]["args"][2] == ahead_id and generations[1]["parent_len"] >= doc_tokens - 2


@pytest.mark.parametrize(("prefix", "filled"), [("Short note", False), ("Document: " + DOCUMENT, True)])
async def test_beside_a_producer_about_to_run_only_a_long_prefix_is_filled_ahead(core, prefix, filled):
    """Submitted in one request, the producer runs at once: a fill ahead of its consumer
    would ride in the producer's steps (mixed steps), worth it for a long prefix only."""
    session, _ = await core.sessions.create()
    first = CallRequest("Name a harbour town: {{town}}", [out("town", 24)], [], None)
    bindings = [Binding("t", output_of=(0, "town")), out("answer")]
    second = CallRequest(prefix + "\nTown: {{t}}\nAnswer: {{answer}}", bindings, [], None)
    _, (_, outputs) = await core.calls.submit_batch(session, [first, second])
    await core.vars.get(session, outputs["answer"], "latency", 120)
    assert spy(core).count("fill") == (1 if filled else 0)
    assert (core.views.stats().filled_ahead > 0) == filled


@pytest.mark.parametrize("engine_url", ["fake", "real"], indirect=True)
async def test_a_multi_output_call_continues_from_what_it_generated(core):
    session, _ = await core.sessions.create()
    both = await call(
        core, session, "Pick a colour: {{a}}\nNow a fruit of that colour: {{b}}", a=out("a", 6), b=out("b", 6)
    )
    await core.vars.get(session, both["b"], "latency", 120)
    first, second = both["request"].chains
    model = core.engines.models()[0]
    kept = first.prompt_ids_by_model[model] + first.result.token_ids
    # The second prompt starts with the first prompt and the generated tokens as they are,
    # and forks the first generation's context there (nothing of it computed again).
    assert second.prompt_ids_by_model[model][: len(kept)] == kept
    generations = [kw for name, kw in spy(core).calls if name == "generate"]
    assert generations[1]["args"][2] == generations[0]["args"][0]
    assert generations[1]["parent_len"] == len(kept)


async def test_map_reduce_runs_the_maps_as_one_group_before_the_reduce(core):
    session, _ = await core.sessions.create()
    maps = [
        await call(
            core,
            session,
            "Summarize: {{p}}\nSummary: {{s}}",
            p={"value": f"Section {i}: lamp {i} lit."},
            s=out("s"),
        )
        for i in range(6)
    ]
    params = {f"s{i}": {"var_id": m["s"]} for i, m in enumerate(maps)}
    inputs = " ".join(f"{{{{s{i}}}}}" for i in range(6))
    reduce = await call(core, session, f"Combine: {inputs}\nAll: {{{{total}}}}", **params, total=out("total"))
    await core.vars.get(session, reduce["total"], "throughput", 180)
    groups = {m["request"].chains[0].group for m in maps}
    assert groups == {(next(iter(session.calls.values())).seq, reduce["request"].seq)}
    last_map = max(m["request"].timings["finished_at"] for m in maps)
    assert reduce["request"].timings["started_at"] >= last_map


@pytest.mark.parametrize("engine_url", ["fake", "real"], indirect=True)
async def test_sessions_share_the_system_prompt_context(core):
    system = "You are a museum guide for the old lighthouse. Reply briefly. " * 6
    for n in range(3):
        session, _ = await core.sessions.create()
        answer = await call(
            core, session, system + "\nUser: {{q}}\nGuide: {{a}}", q={"value": f"Question {n}?"}, a=out("a")
        )
        await core.vars.get(session, answer["a"], "latency", 120)
    # The first call kept the template's constant text as a checkpoint context shared by
    # every session; the later calls (other sessions) forked at least that much (from the
    # checkpoint, or deeper from an earlier prompt that shares more with theirs).
    generations = [kw for name, kw in spy(core).calls if name == "generate"]
    assert [len(kw["checkpoints"]) for kw in generations] == [1, 0, 0]
    ((checkpoint, length),) = generations[0]["checkpoints"]
    earlier = {checkpoint, generations[0]["args"][0]}
    for kw in generations[1:]:
        assert kw["args"][2] in earlier and kw["parent_len"] >= length
        earlier.add(kw["args"][0])


@pytest.mark.parametrize("engine_url", ["fake", "real"], indirect=True)
async def test_latency_critical_tasks_run_first_on_the_engine_too(core):
    session, _ = await core.sessions.create()
    bulk = await call(core, session, "Story: {{s}}", s=out("s"))
    urgent = await call(core, session, "Answer now: {{a}}", a=out("a"))
    await core.vars.get(session, urgent["a"], "latency", 120)
    await core.vars.get(session, bulk["s"], "throughput", 120)
    priorities = [kw["priority"] for name, kw in spy(core).calls if name == "generate"]
    assert sorted(priorities) == [0, 1]


async def test_a_failed_producer_fails_its_consumers_with_the_reason(core):
    session, _ = await core.sessions.create()
    steps = [JsonField(path="x")]  # the input is not JSON: the transform fails
    _, outputs = await core.calls.submit_transform(session, [Binding("input0", value="not json")], steps, "x")
    consumer = await call(core, session, "Echo {{x}}: {{y}}", x={"var_id": outputs["x"]}, y=out("y"))
    with pytest.raises(ProducerFailedError, match="input 'x' failed"):
        await core.vars.get(session, consumer["y"], "latency", 30)
    assert consumer["request"].state == "failed" and spy(core).count("generate") == 0


@pytest.mark.parametrize("engine_url", ["fake", "real"], indirect=True)
async def test_a_context_another_session_forks_from_outlives_its_session_until_the_fork(core):
    """Session B's call forks deep into session A's context; A is deleted before B's request
    reaches the engine: A's context stays until B is done with it (then it is freed), so B
    runs once, without a "parent does not exist" retry."""
    prompt = "You keep the tide tables of the harbour and answer in a few words. " * 8 + "Q: {{q}}\nA: {{a}}"
    first, _ = await core.sessions.create()
    a = await call(core, first, prompt, q={"value": "When is high water?"}, a=out("a", 4))
    value = (await core.vars.get(first, a["a"], "latency", 120)).value
    engine = spy(core)
    gate, held_calls = asyncio.Event(), []
    generate = engine.generate_stream

    async def held(*args, **kwargs):  # B's request waits here, placed but not yet sent
        held_calls.append(args)
        await gate.wait()
        async for event in generate(*args, **kwargs):
            yield event

    engine.generate_stream = held
    second, _ = await core.sessions.create()
    asked = prompt.replace("{{q}}", "When is high water?")
    continued = asked.replace("{{a}}", value + " And low water? {{b}}")
    b = await call(core, second, continued, b=out("b", 4))
    for _ in range(2000):
        if held_calls:
            break
        await asyncio.sleep(0.01)
    ((_, _, forked_from),) = held_calls
    assert forked_from == next(kw for n, kw in engine.calls if n == "generate")["args"][0]  # A's context
    await core.sessions.delete(first)
    assert forked_from in core.contexts.tree(core.engines.slots()[0]).contexts  # kept for B
    gate.set()
    assert (await core.vars.get(second, b["b"], "latency", 120)).value
    assert len(held_calls) == 1 and engine.count("generate") == 2  # B ran once
    for _ in range(100):  # freed in the background once B was done with it
        if forked_from not in core.contexts.tree(core.engines.slots()[0]).contexts:
            break
        await asyncio.sleep(0.05)
    assert forked_from not in core.contexts.tree(core.engines.slots()[0]).contexts
    freed = [i for n, kw in engine.calls if n == "abort" for i in kw["args"][0]]
    freed += [kw["args"][0] for n, kw in engine.calls if n == "free_context"]
    assert forked_from in freed
