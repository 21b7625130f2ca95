"""Streamed semantic variables in the SDK (issue 22), against a Parrot server (the API on
the fake engine: ``server_url``; the real ``parrot serve`` for a plain and a typed stream):
``for piece in var.stream()`` / ``async for piece in var.astream()`` hand out the text as it
is generated, the pieces join to the value, the value is kept for ``get()``; late
streams, semantic functions' outputs, and the stream's errors as :class:`ParrotError`."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_until

from parrot.sdk import (
    AsyncClient,
    ForbiddenError,
    Input,
    NotFoundError,
    Output,
    ProducerFailedError,
    Var,
    semantic_function,
)
from parrot.wire.errors import SessionClosedError

PROMPT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
LONG = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}


def ask(session, question: str, **sampling) -> Var:
    call = session.submit(PROMPT.format(q=question) + "{{a}}", outputs={"a": Output(**(LONG | sampling))})
    return call.outputs["a"]


@pytest.mark.parametrize("server_url", ["fake", "real"], indirect=True)
def test_stream_hands_out_the_value_piece_by_piece(server):
    with server.session() as session:
        var = ask(session, "Write a short poem about the sea.")
        pieces = list(var.stream())
        assert len(pieces) >= 2 and all(pieces)  # streamed, not sent at the end
        assert var.value == "".join(pieces) and var.finish_reason == "length"
        assert var.get() == var.value  # kept: no second wait
        # What another handle of the same variable gets from the server.
        assert Var(session, var.var_id, "a").get() == "".join(pieces)


def test_late_and_very_late_streams(server):
    with server.session() as session:
        var = ask(session, "Tell me a long story about a dragon.", max_tokens=64)
        first = next(var.stream())  # the producer is running: it has written something
        assert first
        late = Var(session, var.var_id, "a")  # starts with what exists, then the rest
        pieces = list(late.stream())
        assert "".join(pieces) == late.value and late.value.startswith(first)
        very_late = Var(session, var.var_id, "a")  # after the value: the value, whole
        assert list(very_late.stream()) == [late.value]
        assert very_late.finish_reason == "length"
        assert list(late.stream()) == [late.value]  # a handle that has the value asks nothing


def test_a_set_value_streams_whole(server, fake_server):
    core = fake_server[1]
    with server.session() as session:
        given = session.var("given")
        streamed: list[str] = []
        follower = threading.Thread(target=lambda: streamed.extend(Var(session, given.var_id, "g").stream()))
        follower.start()
        # it waits for the value, on the server
        wait_until(lambda: session.session_id in core.streams._per_session, what="the follower")
        given.set("hello")
        follower.join(30)
        assert streamed == ["hello"]


def test_outputs_of_semantic_functions_stream(server):
    @semantic_function()
    def story(topic: Input, text: Output(**LONG)):
        """<|im_start|>user
        Tell a story about {{topic}}.<|im_end|>
        <|im_start|>assistant
        {{text}}"""

    with server.session():
        out = story("a lighthouse")
        pieces = list(out.stream())
        assert len(pieces) >= 2 and "".join(pieces) == out.get() == out.value


def failing_output(session) -> Var:
    """An output whose producer fails: it reads a field of a text that is not JSON."""
    broken = session.transform(["not json"], [{"type": "json_field", "path": "x"}])
    call = session.submit(
        PROMPT.format(q="Repeat: {{x}}") + "{{a}}", {"x": broken}, {"a": Output(max_tokens=8)}
    )
    return call.outputs["a"]


def test_stream_errors_are_parrot_errors(server):
    with server.session() as session:
        with pytest.raises(ProducerFailedError, match="failed") as failed:
            list(failing_output(session).stream())
        assert failed.value.status == 424 and failed.value.code == "producer_failed"
        with pytest.raises(NotFoundError):
            list(Var(session, "var-nope", "x").stream())
        var = ask(session, "Hi.", max_tokens=4)
        with pytest.raises(ForbiddenError):
            list(Var(server.attach(session.session_id, "wrong"), var.var_id, "a").stream())


def test_deleting_the_session_ends_its_streams(server):
    session = server.session()
    var = ask(session, "Tell me a very long story about a castle.", max_tokens=200)
    stream = var.stream()
    assert next(stream)  # it is being written
    session.delete()
    with pytest.raises(NotFoundError) as closed:
        list(stream)
    assert closed.value.code == "session_closed" and var.value is None
    assert type(closed.value) is SessionClosedError  # the server's class, from the stream's error event


async def test_astream(server_url):
    async with AsyncClient(server_url, timeout=120) as client, client.session() as session:
        call = await session.submit(
            PROMPT.format(q="Describe a forest.") + "{{a}}", outputs={"a": Output(**LONG)}
        )
        var = call.outputs["a"]
        pieces = [piece async for piece in var.astream()]
        assert len(pieces) >= 2 and "".join(pieces) == var.value == await var.get()
        assert [p async for p in var.astream()] == [var.value]
        broken = await session.transform(["not json"], [{"type": "json_field", "path": "x"}])
        failing = await session.submit(
            PROMPT.format(q="Repeat: {{x}}") + "{{a}}", {"x": broken}, {"a": Output(max_tokens=8)}
        )
        with pytest.raises(ProducerFailedError):
            [p async for p in failing.outputs["a"].astream()]


@pytest.mark.parametrize("server_url", ["real"], indirect=True)  # a format: the real engine
def test_a_typed_variable_streamed_by_a_handle_that_did_not_type_it_parses(server):
    """The value event says the variable's format, as a get does: ``get()`` after the
    stream returns the parsed JSON, ``get_text()`` the text the pieces joined to."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    with server.session() as session:
        typed = session.submit(
            PROMPT.format(q="Give a number as JSON.") + "{{a}}",
            outputs={"a": Output(schema=schema, max_tokens=32, temperature=0)},
        ).outputs["a"]
        untyped = Var(session, typed.var_id, "a")  # knows nothing of its format
        text = "".join(untyped.stream())
        assert untyped.get_text() == text
        parsed = untyped.get()
        assert isinstance(parsed, dict) and isinstance(parsed["n"], int)
