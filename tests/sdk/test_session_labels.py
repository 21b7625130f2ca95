"""Issue 38 §3: ``client.session(label=..., tags=...)`` labels the session (plain and
pipelined, sync and async) so the dashboard finds it; a bad label raises the server's 400;
on the fake engine, through the real HTTP API (the LangChain models' labels:
tests/adapters/test_models.py)."""

from __future__ import annotations

import pytest

from parrot.sdk.api import AsyncClient, BadRequestError, Client, Output

ONE = Output(max_tokens=1, temperature=0)


def test_a_session_is_made_with_its_label_and_tags(server, fake_server):
    _, core = fake_server
    with server.session(label="Tide tables", tags=["harbour", "weekly"]) as session:
        info = session.info()
        assert (info.label, info.tags) == ("Tide tables", ["harbour", "weekly"])
        (found,) = core.views.session_summaries("tide TABLES")
        assert found.session_id == session.session_id and found.tags == ("harbour", "weekly")
    with server.session() as plain:  # no label: no body sent, as before
        assert (plain.info().label, plain.info().tags) == (None, [])


def test_a_pipelined_session_gets_its_label_from_the_batch_that_makes_it(server):
    with server.session(pipeline=True, label="one trip", tags=["batch"]) as session:
        call = session.submit("Say yes: {{a}}", outputs={"a": ONE})
        call.outputs["a"].get()
        info = session.info()
        assert (info.label, info.tags) == ("one trip", ["batch"])
    with server.session(pipeline=True, label="made alone") as empty:
        assert empty.info().label == "made alone"  # made by its first request, with no call


async def test_the_async_client_labels_its_sessions_too(fake_server_url):
    async with AsyncClient(fake_server_url, timeout=60) as client:
        async with client.session(label="async", tags=["a"]) as session:
            info = await session.info()
            assert (info.label, info.tags) == ("async", ["a"])
        async with client.session(pipeline=True, label="async pipelined") as session:
            await (await session.submit("Say yes: {{a}}", outputs={"a": ONE})).outputs["a"].get()
            assert (await session.info()).label == "async pipelined"


def test_a_bad_label_raises_the_servers_reason(fake_server_url):
    with Client(fake_server_url, timeout=60) as client:
        with pytest.raises(BadRequestError, match=r"length <= 200 \(label\)"):
            client.session(label="x" * 201)
        with pytest.raises(BadRequestError, match=r"length >= 1 \(tags\[0\]\)"):
            client.session(tags=[""])


def test_a_chat_and_a_streamed_chat_are_labelled_by_their_metadata(server, fake_server):
    """The SDK's one-call chats (the OpenAI front) carry OpenAI's ``metadata``: the request
    is found on the requests page by its label, its other keys as tags."""
    _, core = fake_server
    asked = [{"role": "user", "content": "Which tide is next?"}]
    server.chat(asked, metadata={"label": "tide desk", "shift": "night"}, max_tokens=2)
    "".join(d.text for d in server.stream_chat(asked, metadata={"label": "tide stream"}, max_tokens=2))
    (plain,) = core.views.recent_requests("tide desk")
    assert plain.asked.label == "tide desk" and plain.asked.tags == ("shift=night",)
    (streamed,) = core.views.recent_requests("tide stream")
    assert streamed.asked.stream and streamed.asked.label == "tide stream"
