"""The SDK's clients against a real ``parrot serve``: sessions, variables, calls, engines."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from parrot.sdk.api import (
    AsyncClient,
    Input,
    NotFoundError,
    Output,
    Session,
    Var,
    current_session,
    semantic_function,
)

SHORT = Output(max_tokens=4, temperature=0)


@semantic_function
def name_a(thing: Input, name: Output(max_tokens=4, temperature=0)):
    """Name a {{thing}}: {{name}}"""


@semantic_function
def describe(name: Input, words: Output(max_tokens=4, temperature=0)):
    """Describe {{name}} in three words: {{words}}"""


def test_whole_dag_is_submitted_before_the_first_get(parrot):
    """Three dependent calls: all three are on the server before anything is read, and the
    server runs each after its input is ready, without the client in between."""
    with parrot.session() as session:
        first = name_a("sea creature")
        second = describe(first)
        third = describe(second)
        info = session.info()
        assert [c.call_id for c in info.calls] == [first.call_id, second.call_id, third.call_id]
        assert third.value is None  # nothing has been read yet
        assert third.get(criteria="latency")
        assert third.ready and third.value is not None and first.ready
        timings = [v.call_info().timings for v in (first, second, third)]
        for before, after in itertools.pairwise(timings):
            assert after["started_at"] >= before["finished_at"]
    with pytest.raises(NotFoundError, match="does not exist"):
        session.info()  # the with block deleted it


def test_variables_calls_and_transforms(parrot):
    with parrot.session() as session:
        assert current_session() is session
        topic = session.var("topic", "tides")
        question = session.var("question")
        assert topic.ready and topic.get() == "tides" and not question.ready
        call = session.submit(
            "About {{topic}}. Q: {{question}} A: {{answer}}",
            inputs={"topic": topic, "question": question},
            outputs={"answer": SHORT},
        )
        answer = call.outputs["answer"]
        assert session.call_info(call.call_id).state == "pending"  # waits for the question
        question.set("When?")
        assert question.ready and question.value == "When?"
        assert answer.get(criteria="throughput", timeout=120)
        info = session.call_info(call.call_id)
        assert info.state == "done" and info.engine and info.outputs == {"answer": answer.var_id}
        loud = session.transform([answer, "!"], [{"type": "join", "separator": ""}, {"type": "upper"}])
        assert loud.get() == (answer.get() + "!").upper()
        names = {v.var_id: v.name for v in session.info().vars}
        assert names[topic.var_id] == "topic" and names[loud.var_id] == "result"
    assert current_session() is None


def test_text_parameters_render_and_braces_cannot_make_placeholders(parrot):
    @semantic_function
    def reply(tone, topic, question: Input, answer: Output(max_tokens=3, temperature=0)):
        """Tone: {{tone}}. Topic: {{topic}}. {{question}} {{answer}}"""

    with parrot.session() as session:
        answer = reply("calm", "{{question}} and {json}", "Why?")
        assert answer.get()
        # "calm" went into the prompt text; the braced value was sent as a value, as it is.
        made = {v.name: v for v in session.info().vars}
        assert "tone" not in made and set(made) == {"topic", "question", "answer"}
        assert Var(session, made["topic"].var_id, "topic").get() == "{{question}} and {json}"


def test_outputs_into_existing_vars_and_per_call_options(parrot):
    with parrot.session() as session:
        target = session.var("target")
        out = name_a("fruit", name=target)
        assert out is target and target.call_id is not None
        assert target.get()
        longer = name_a("bird", name=Output(max_tokens=6, temperature=0), output_criteria="latency")
        assert longer.get()
        with pytest.raises(NotFoundError, match="no registered engine serves"):
            name_a("tree", models=["no-such-model"])  # refused at once: no engine could run it


def test_engines_health_and_metrics(parrot, engine_server):
    assert parrot.healthz().status == "ok"
    (engine,) = parrot.engines()
    assert engine.up and engine.url == engine_server.url and engine.kind == "builtin"
    # the operators' one view of an engine: the builtin engine's own load from its last ping
    assert engine.missed_pings == 0 and engine.contexts >= 0 and engine.running <= engine.capacity
    assert engine.max_running and engine.kv_blocks_total
    assert 0 <= engine.kv_blocks_used <= engine.kv_blocks_total
    assert None not in (engine.jobs_running, engine.jobs_waiting, engine.tokens_per_s)
    model = httpx.get(f"{engine_server.url}/v1/models").json()["data"][0]["id"]
    second = parrot.register_engine(
        kind="openai", base_url=f"{engine_server.url}/v1", model=model, api="completions", capacity=2
    )
    try:
        assert second.kind == "openai" and second.up and second.capacity == 2
        assert {e.engine_id for e in parrot.engines()} == {engine.engine_id, second.engine_id}
    finally:
        parrot.remove_engine(second.engine_id)
    assert [e.engine_id for e in parrot.engines()] == [engine.engine_id]
    samples = parrot.metrics()
    assert samples['parrot:tasks_total{state="done"}'] >= 1
    assert any(k.startswith("parrot:engine_up{") for k in samples)


async def test_async_client_sessions_run_concurrently(parrot_url):
    """Each asyncio task sees its own session; ``await client.session()`` works without a
    block too."""

    async def chain(client: AsyncClient, thing: str) -> tuple[str, str]:
        async with client.session() as session:
            first = await name_a.asubmit(thing)
            second = await describe.asubmit(first)
            assert current_session() is session
            await asyncio.sleep(0)  # the other task runs here, in its own session
            assert current_session() is session
            return await second.aget(), session.session_id

    async with AsyncClient(parrot_url, timeout=120) as client:
        results = await asyncio.gather(chain(client, "fish"), chain(client, "bird"))
        assert all(value for value, _ in results) and results[0][1] != results[1][1]
        session = await client.session()
        var = await session.var("x", "1")
        assert await var.is_ready() and await var.get() == "1"
        with pytest.raises(TypeError, match="asubmit"):
            name_a("fish", session=session)
        await session.delete()
        with pytest.raises(NotFoundError):
            await session.info()


def test_sync_session_is_refused_by_asubmit(parrot):
    with parrot.session() as session:
        assert isinstance(session, Session)
        with pytest.raises(TypeError, match="without asubmit"):
            asyncio.run(name_a.asubmit("fish"))
