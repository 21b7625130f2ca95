"""Pipelined sessions and one-round-trip calls (issue 35: a single call is one HTTP round
trip, as an OpenAI request is): the calls of ``client.session(pipeline=True)`` are queued on
the client and sent together when something needs the server, the stream of a queued
output riding on the same request; ``client.call`` runs a call in one request. The
requests are counted as the client sends them. On the fake engine, and the values checked
against plain sessions on the real engine too."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from parrot.sdk.api import AsyncClient, BadRequestError, Input, Output, semantic_function


@semantic_function
def name_a(thing: Input, name: Output(max_tokens=4, temperature=0)):
    """Name a {{thing}}: {{name}}"""


@semantic_function
def describe(name: Input, words: Output(max_tokens=4, temperature=0)):
    """Describe {{name}} in three words: {{words}}"""


@semantic_function
def two_outputs(thing: Input, a: Output(max_tokens=2), b: Output(max_tokens=2)):
    """{{thing}}: {{a}} and {{b}}"""


@contextmanager
def requests_of(client) -> Iterator[list[str]]:
    """The requests ``client`` sends in the block, as ``METHOD /path``."""
    sent: list[str] = []
    hooks = client._transport._http.event_hooks

    def hook(request: httpx.Request):
        sent.append(f"{request.method} {request.url.path}")

    async def async_hook(request: httpx.Request):
        hook(request)

    added = async_hook if isinstance(client, AsyncClient) else hook
    hooks["request"].append(added)
    try:
        yield sent
    finally:
        hooks["request"].remove(added)


def live_sessions(client) -> int:
    text = httpx.get(f"{client.config.base_url}/metrics", timeout=30).text
    return int(float(re.search(r"^parrot:num_sessions (\S+)$", text, re.M).group(1)))


def plain_chain(server, thing: str) -> list[str]:
    with server.session():
        first = name_a(thing)
        second = describe(first)
        return [first.get(), second.get(), describe(second).get()]


REAL_TOO = pytest.mark.parametrize("server_url", ["fake", "real"], indirect=True)


@REAL_TOO
def test_a_dependent_chain_and_its_answer_in_one_request(server):
    expected = plain_chain(server, "sea creature")
    with requests_of(server) as sent, server.session(pipeline=True) as s:
        first = name_a("sea creature")
        second = describe(first)
        third = describe(second)
        assert sent == [] and s.session_id is None and third.var_id is None
        assert third.get() == expected[2]
        assert sent == ["POST /v1/semantic_calls"]  # the session, the calls, the answer
        assert s.session_id and third.var_id and third.call_id
        assert [first.get(), second.get()] == expected[:2]
        assert [c.call_id for c in s.info().calls] == [first.call_id, second.call_id, third.call_id]
    assert sent[-1] == f"DELETE /v1/session/{s.session_id}"


@REAL_TOO
def test_a_single_call_is_one_round_trip(server):
    with server.session():
        expected = name_a("lighthouse").get()
    before = live_sessions(server)
    with requests_of(server) as sent:
        assert server.call(name_a, "lighthouse") == expected
    assert sent == ["POST /v1/semantic_calls"]
    with requests_of(server) as sent:
        assert "".join(server.stream_call(name_a, "lighthouse")) == expected
    assert sent == ["POST /v1/semantic_calls"]
    assert live_sessions(server) == before  # each made and deleted by its one request


def test_what_needs_the_server_sends_the_queue_first(server):
    with requests_of(server) as sent, server.session(pipeline=True) as s:
        first = name_a("kite")
        topic = s.var("topic", "wind")  # the queue, then the variable
        assert sent == ["POST /v1/semantic_calls", "POST /v1/semantic_var"]
        assert first.var_id and topic.var_id
        later = describe(topic)
        assert first.get()  # the queue first (the later call), then the get
        assert sent[2:] == ["POST /v1/semantic_calls", f"GET /v1/semantic_var/{first.var_id}"]
        assert later.get()
        unread = describe(later)
    # The block's end sends what it left queued, then deletes the session.
    assert sent[-2:] == ["POST /v1/semantic_calls", f"DELETE /v1/session/{s.session_id}"]
    assert unread.var_id is not None


def test_a_refused_call_raises_where_the_queue_is_sent(server):
    with requests_of(server) as sent, server.session(pipeline=True) as s:
        first = name_a("kite")
        describe(first, output_criteria="soon")
        with pytest.raises(BadRequestError, match=r"call 1 of the batch: .*output_criteria"):
            first.get()
        assert s.session_id is None  # a refused batch makes nothing, its session neither
        with pytest.raises(BadRequestError, match="was refused"):
            describe(first).get()  # it reads a refused call's output
    assert sent == ["POST /v1/semantic_calls"]


def test_a_queued_output_of_another_session_is_refused(server):
    with server.session(pipeline=True) as s, server.session() as other:
        queued = name_a("kite", session=s)
        with pytest.raises(ValueError, match="another session's call that is not sent yet"):
            describe(queued, session=other)
    with pytest.raises(TypeError, match="2 outputs"):
        server.call(two_outputs, "x")


def test_an_empty_pipelined_session_sends_nothing(server):
    with requests_of(server) as sent, server.session(pipeline=True):
        pass
    assert sent == []


@REAL_TOO
def test_the_async_client(server_url, server):
    expected = plain_chain(server, "river")

    async def main():
        async with AsyncClient(server_url, timeout=120) as client:
            with requests_of(client) as sent:
                async with client.session(pipeline=True):
                    first = await name_a.asubmit("river")
                    second = await describe.asubmit(first)
                    third = await describe.asubmit(second)
                    pieces = [p async for p in third.astream()]
                    assert sent == ["POST /v1/semantic_calls"]
                    assert "".join(pieces) == expected[2] == third.value
                    assert await first.get() == expected[0]
                sent.clear()
                assert await client.call(name_a, "river") == expected[0]
                assert [p async for p in client.stream_call(name_a, "river")]
                assert sent == ["POST /v1/semantic_calls"] * 2

    asyncio.run(main())
