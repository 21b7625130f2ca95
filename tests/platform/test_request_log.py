"""Issue 38 §3: the OpenAI front's requests are recorded for operators. The ring of records
(bounded, newest first, searched by label, tag, id or model), a trace written once with what
ended it; and through the real ``openai`` client on the fake engine: labels from
``metadata`` or the ``X-Parrot-Label`` header, tokens, engine, format and tools, refusals and
failures with their reason, a client that goes away (plain and streamed)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from types import SimpleNamespace

import httpx
import openai
import pytest
from conftest import ServerThread
from waiting import wait_until

from parrot.engines.protocol.errors import BadRequestError, NotFoundError
from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.requests import RequestFacts, RequestLog, RequestStatus
from parrot.wire.tool_syntax import GENERIC, SYNTAXES


def facts(n: int, label: str | None = None, tags: tuple[str, ...] = (), model: str = "m") -> RequestFacts:
    return RequestFacts(f"chatcmpl-{n}", "/v1/chat/completions", model, 1, False, "hi", label, tags)


# -- the log ------------------------------------------------------------------------------
def test_the_log_keeps_the_last_requests_newest_first():
    log = RequestLog(keep=3)
    for n in range(5):
        log.trace(facts(n)).end(RequestStatus.DONE)
    assert len(log) == 3
    assert [r.request_id for r in log.recent()] == ["chatcmpl-4", "chatcmpl-3", "chatcmpl-2"]
    assert log.get("chatcmpl-2").status == RequestStatus.DONE
    with pytest.raises(NotFoundError, match="not among the last 3 requests"):
        log.get("chatcmpl-1")  # gone with the oldest
    with pytest.raises(ValueError):
        RequestLog(keep=0)


def test_search_finds_a_request_by_label_tag_id_or_model_whatever_the_case():
    log = RequestLog()
    log.trace(facts(1, "Harbour report", ("team=tides",), "smol-135m")).end(RequestStatus.DONE)
    log.trace(facts(2, "weather", model="qwen")).end(RequestStatus.DONE)
    found = lambda query: [r.request_id for r in log.recent(query)]  # noqa: E731
    assert found("HARBOUR") == found("tides") == found("smol") == found("chatcmpl-1") == ["chatcmpl-1"]
    assert found("  ") == found(None) == ["chatcmpl-2", "chatcmpl-1"]
    assert found("nothing like it") == []


async def test_a_trace_is_written_once_with_what_ended_it():
    log = RequestLog()

    def ended(n: int):
        return log.get(f"chatcmpl-{n}")

    with log.trace(facts(1)).watch(done=True):
        pass
    assert ended(1).status == RequestStatus.DONE and ended(1).error is None
    trace = log.trace(facts(2))
    with pytest.raises(BadRequestError), trace.watch():
        raise BadRequestError("the prompt is empty")
    trace.end(RequestStatus.DONE)  # the first end wins
    assert (ended(2).status, ended(2).error) == (RequestStatus.FAILED, "the prompt is empty")
    with pytest.raises(asyncio.CancelledError), log.trace(facts(3)).watch():
        raise asyncio.CancelledError
    assert ended(3).status == RequestStatus.CANCELLED
    with log.trace(facts(4)).watch():  # without done, a normal end writes nothing
        pass
    with pytest.raises(NotFoundError):
        ended(4)

    async def answer(trace):  # a stream whose reader stops early (GeneratorExit)
        with trace.watch(done=True):
            yield 1
            yield 2

    stream = answer(log.trace(facts(5)))
    await anext(stream)
    await stream.aclose()
    assert ended(5).status == RequestStatus.CANCELLED
    assert [r.request_id for r in log.recent()] == [f"chatcmpl-{n}" for n in (5, 3, 2, 1)]
    assert ended(5).duration_s >= 0 and ended(5).ttft_s is None and ended(5).engines == ()


def choice(text: str | None, reason: str | None, first_token_at: float | None, engine: str | None):
    """What a trace reads of a choice's call: its chain's result, its timings, its engine."""
    result = None
    if text is not None:
        result = SimpleNamespace(
            text=text, finish_reason=reason, token_ids=[1] * 7, prompt_tokens=40, cached_tokens=32
        )
    timings = {} if first_token_at is None else {"first_token_at": first_token_at}
    return SimpleNamespace(chains=[SimpleNamespace(result=result)], timings=timings, engine_id=engine)


@pytest.mark.parametrize(("tool_choice", "first_reason"), [("required", "tool_calls"), ("none", "stop")])
def test_a_complete_list_of_tool_calls_is_recorded_as_the_client_was_told(tool_choice, first_reason):
    """``tool_calls`` for an answer that is a complete list of calls (as the front tells
    its client), the engine's reason otherwise; tokens summed over the choices. Answers in a
    model's own syntax are read in it."""
    calls = '{"tool_calls": [{"name": "tide_at", "arguments": {"port": "Harlingen"}}]}'
    choices = [
        choice(calls, "stop", 5.2, "engine-1"),
        choice('{"tool_calls": [{"name": "tide', "length", 5.1, "engine-0"),
        choice(None, None, None, None),  # never answered
    ]
    log = RequestLog()
    asked = facts(1)
    trace = log.trace(replace(asked, n=3, tools=("tide_at",), tool_choice=tool_choice))
    trace.read_tools_with(GENERIC if tool_choice != "none" else None)  # as the front does
    trace.started_at = 5.0
    trace.running("m", choices)
    trace.end(RequestStatus.DONE)
    record = log.get(asked.request_id)
    assert record.finish_reasons == (first_reason, "length", None)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (40, 32, 14)
    assert record.engines == ("engine-0", "engine-1") and record.ttft_s == pytest.approx(0.1)
    native = log.trace(replace(facts(2), tools=("tide_at",), tool_choice=tool_choice))
    native.read_tools_with(SYNTAXES["hermes"] if tool_choice != "none" else None)
    hermes = '<tool_call>\n{"name": "tide_at", "arguments": {"port": "Harlingen"}}\n</tool_call>'
    native.running("m", [choice(hermes, "stop", 5.2, "engine-1")])
    native.end(RequestStatus.DONE)
    assert log.get(facts(2).request_id).finish_reasons == (first_reason,)


# -- through the front, on the fake engine -----------------------------------------------
@pytest.fixture
def front(fake_engine):
    core = ServeCore()
    app = create_app(core, engine_urls=(fake_engine.url,))
    with (
        ServerThread(app) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as oai,
    ):
        yield server.url, core, oai


def test_requests_are_recorded_with_their_label_tokens_engine_and_tools(front):
    _, core, oai = front
    (engine,) = core.views.engine_views()
    messages = [
        {"role": "system", "content": "You keep the harbour's log."},
        {"role": "user", "content": "How high was the tide at noon?"},
    ]
    chat = oai.chat.completions.create(
        model=engine.model,
        messages=messages,
        max_tokens=5,
        temperature=0,
        metadata={"label": "harbour-log", "team": "tides"},
    )
    record = core.views.request_record(chat.id)
    assert record.asked.route == "/v1/chat/completions" and record.status == RequestStatus.DONE
    assert (record.asked.label, record.asked.tags) == ("harbour-log", ("team=tides",))
    assert record.asked.prompt_preview == "How high was the tide at noon?"  # the last user message
    assert record.prompt_tokens == chat.usage.prompt_tokens > 0
    assert record.completion_tokens == chat.usage.completion_tokens == 5
    assert record.cached_tokens == chat.usage.prompt_tokens_details.cached_tokens
    assert record.engines == (engine.engine_id,) and record.model == engine.model
    assert record.finish_reasons == (chat.choices[0].finish_reason,)
    assert 0 < record.ttft_s <= record.duration_s and not record.asked.stream
    assert record.asked.output is None and record.asked.tools == ()

    # Streamed, labelled by the header; the prompt's end is kept.
    prompt = "Ships in the harbour today: " + "the Albatross, " * 40 + "and"
    chunks = list(
        oai.completions.create(
            model=engine.model,
            prompt=prompt,
            max_tokens=4,
            n=2,
            stream=True,
            extra_headers={"X-Parrot-Label": "ship list"},
        )
    )
    rid = chunks[0].id
    record = core.views.request_record(rid)
    assert record.asked.stream and record.asked.n == 2 and record.asked.label == "ship list"
    assert record.asked.route == "/v1/completions" and record.status == RequestStatus.DONE
    assert record.completion_tokens == 8 and record.finish_reasons == ("length", "length")
    assert record.asked.prompt_preview.startswith("…") and record.asked.prompt_preview.endswith("and")
    assert [r.request_id for r in core.views.recent_requests()][:2] == [rid, chat.id]
    assert [r.request_id for r in core.views.recent_requests("SHIP")] == [rid]

    # Tools: their names and the choice; the request fails on the fake engine (it refuses
    # every format), and its record says why.
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
        for name in ("tide_at", "moon_phase")
    ]
    with pytest.raises(openai.APIStatusError, match="does not constrain generation to a format"):
        oai.chat.completions.create(
            model=engine.model, messages=messages, max_tokens=32, tools=tools, tool_choice="required"
        )
    record = core.views.recent_requests()[0]
    assert record.asked.tools == ("tide_at", "moon_phase") and record.asked.tool_choice == "required"
    assert record.status == RequestStatus.FAILED and "format" in record.error
    assert record.engines == (engine.engine_id,)


def test_refusals_and_failures_are_recorded_with_their_reason(front):
    _, core, oai = front
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with pytest.raises(openai.APIStatusError, match="does not constrain generation to a format"):
        oai.chat.completions.create(
            model=core.engines.models()[0],
            messages=[{"role": "user", "content": "A city, as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
        )
    record = core.views.recent_requests()[0]
    assert record.asked.output == "json_schema: place"
    assert record.status == RequestStatus.FAILED and "format" in record.error
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="no-such-model", prompt="Hi", extra_body={"metadata": {"label": "lost"}})
    record = core.views.recent_requests()[0]
    assert (record.status, record.model, record.asked.model) == (RequestStatus.FAILED, None, "no-such-model")
    assert "not served here" in record.error and record.asked.label == "lost"
    assert record.prompt_tokens == record.completion_tokens == 0 and record.engines == ()


def test_a_client_that_goes_away_is_recorded_as_cancelled(front, fake_engine):
    url, core, _ = front
    fake_engine.engine.step_s = 0.05  # 200 tokens take 10 s
    body = {"prompt": "Tell me a very long story.", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
    record = wait_until(lambda: next(iter(core.views.recent_requests()), None), what="the record")
    assert record.status == RequestStatus.CANCELLED and "went away" in record.error
    assert record.duration_s < 5

    streamed = {**body, "stream": True}
    with (
        httpx.stream("POST", f"{url}/v1/completions", json=streamed, timeout=30) as answer,
        contextlib.closing(answer.iter_bytes()) as pieces,
    ):
        next(pieces)  # the first piece of the answer, then the client leaves
    cancelled = lambda: [r for r in core.views.recent_requests() if r.asked.stream]  # noqa: E731
    (record,) = wait_until(cancelled, what="the streamed request's record")
    assert record.status == RequestStatus.CANCELLED and record.completion_tokens < 200


@pytest.mark.parametrize(
    ("metadata", "headers", "message"),
    [
        ({"label": ""}, {}, "metadata.label: Expected `str` of length >= 1"),
        ({"label": "x" * 201}, {}, "metadata.label: Expected `str` of length <= 200"),
        ({}, {"X-Parrot-Label": "y" * 201}, "X-Parrot-Label: Expected `str` of length <= 200"),
        ({f"k{n}": "v" for n in range(17)}, {}, "length <= 16"),
        ({"label": 3}, {}, "Expected `str`"),
    ],
)
def test_a_bad_label_is_refused_with_what_is_wrong(front, metadata, headers, message):
    url, core, _ = front
    body = {"prompt": "Hello", "max_tokens": 1, "metadata": metadata}
    answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["error"]["message"]
    assert core.views.recent_requests() == []  # refused before it ran
