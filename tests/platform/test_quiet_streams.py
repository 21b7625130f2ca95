"""An engine streams per token only what someone reads along with
(platform/serve/scheduler/runner.py): an output nobody follows, or one followed for its
value alone, is asked for with ``stream_interval_ms`` (its first token at once, then
joined pieces), since a per-token event costs the engine and the ServeCore CPU on every
step. A follower's, a streamed OpenAI answer's and a batch's streamed output's tokens come
one by one. The engine's side of the interval: tests/engines/builtin/test_engine_api.py."""

from __future__ import annotations

import pytest
import pytest_asyncio

from parrot.engines.protocol.openai_stream import Finish
from parrot.platform.serve.calls.service import Binding, CallRequest
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.scheduler.runner import QUIET_STREAM_MS
from parrot.platform.serve.sessions.oneshot import OneShot
from parrot.wire.sampling import SamplingParams

SAMPLING = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest_asyncio.fixture(loop_scope="function")
async def core(fake_engine):
    core = ServeCore()
    await core.start()
    await core.engines.register_builtin(fake_engine.url)
    yield core, fake_engine.engine
    await core.stop()


def intervals(engine) -> list[int]:
    """``stream_interval_ms`` of each generation asked of the engine, in order."""
    return [args["stream_interval_ms"] for op, args in engine.requests if op == "generate"]


def two_calls() -> list[CallRequest]:
    first = CallRequest("Start: {{a}}", [Binding("a", is_output=True, sampling=SAMPLING)], [], None)
    second = CallRequest(
        "Given {{p}} go on: {{a}}",
        [Binding("p", output_of=(0, "a")), Binding("a", is_output=True, sampling=SAMPLING)],
        [],
        None,
    )
    return [first, second]


async def read_all(events) -> list:
    return [event async for event in events if event is not None]


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(("deltas", "last"), [(True, 0), (False, QUIET_STREAM_MS)])
async def test_only_an_output_read_along_with_is_streamed_per_token(core, deltas, last):
    core, engine = core
    session, _ = await core.sessions.create()
    (_, first), (_, second) = await core.calls.submit_batch(session, two_calls())
    # As POST /v1/semantic_calls follows the output it streams: right after the submit.
    events = core.streams.follow(session, second["a"], deltas=deltas)
    got = await read_all(events)
    assert intervals(engine) == [QUIET_STREAM_MS, last]
    assert got[-1].value == session.vars[second["a"]].value  # the value, whatever the pieces
    assert session.vars[first["a"]].value  # the quiet one has its whole value too


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(("stream", "interval"), [(True, 0), (False, QUIET_STREAM_MS)])
async def test_an_openai_answer_is_streamed_per_token_only_when_it_streams(core, stream, interval):
    core, engine = core
    run = await OneShot.start(core, ["Say it:"], SAMPLING, 2, core.engines.models()[0], stream)
    if stream:
        events = [event async for event in run.events()]
        assert sorted(e.index for e in events if isinstance(e, Finish)) == [0, 1]
    else:
        await run.answers()
    assert intervals(engine) == [interval, interval]
