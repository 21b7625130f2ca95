"""Every exception class of the SDK, raised by a real server response (or a real refused
connection), carrying the server's status, code and message: the very class the server
raised (one hierarchy, :mod:`parrot.wire.errors`)."""

from __future__ import annotations

import pytest
from conftest import ServerThread, free_port

from parrot.engines.protocol.errors import FormatTooLargeError
from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url
from parrot.sdk.api import (
    AuthError,
    BadRequestError,
    Client,
    ConflictError,
    EngineUnavailableError,
    ForbiddenError,
    GraphError,
    Input,
    NotFoundError,
    Output,
    ParrotError,
    PayloadTooLargeError,
    ProducerFailedError,
    ServerUnreachableError,
    TemplateError,
    UnauthorizedError,
    Var,
    WaitTimeoutError,
    semantic_function,
)
from parrot.sdk.http import Op, nothing
from parrot.wire.errors import MethodNotAllowedError


@semantic_function
def answer(question: Input, reply: Output(max_tokens=3, temperature=0)):
    """Q: {{question}} A: {{reply}}"""


def raised(kind: type[ParrotError], status: int | None, code: str | None, run) -> ParrotError:
    with pytest.raises(kind) as info:
        run()
    error = info.value
    assert (error.status, error.code) == (status, code) and str(error) == error.message != ""
    return error


def test_not_found_bad_request_and_template_errors(parrot):
    with parrot.session() as session:
        unknown = Var(session, "var-0123456789abcdef", "ghost")
        error = raised(NotFoundError, 404, "not_found", unknown.get)
        assert "does not exist in session" in str(error)
        raised(NotFoundError, 404, "not_found", lambda: session.call_info("call-nope"))
        given = session.var("given", "yes")
        error = raised(BadRequestError, 400, "bad_request", lambda: given.set("again"))
        assert "already has a value" in str(error) and not isinstance(error, TemplateError)
        raised(BadRequestError, 400, "bad_request", lambda: session.var("x").get(criteria="fast"))
        raised(BadRequestError, 400, "invalid_request", lambda: session.var(""))
        error = raised(TemplateError, 400, "bad_template", lambda: session.submit("Hi {{name", {}, {}))
        assert "unclosed placeholder" in str(error)
        error = raised(
            TemplateError,
            400,
            "bad_template",
            lambda: session.submit("Q {{q}}: {{a}}", {"q": "x"}, {"a": Output(), "b": Output()}),
        )
        assert "'b' has no placeholder" in str(error)
    raised(NotFoundError, 404, "not_found", lambda: parrot.attach("0000", "secret").info())


def test_auth_errors(parrot, parrot_url, monkeypatch):
    with parrot.session() as session:
        error = raised(
            ForbiddenError, 403, "forbidden", lambda: parrot.attach(session.session_id, "x").info()
        )
        assert isinstance(error, AuthError) and "does not belong" in str(error)
    monkeypatch.delenv("PARROT_ADMIN_TOKEN", raising=False)
    with Client(parrot_url) as anonymous:
        error = raised(UnauthorizedError, 401, "unauthorized", lambda: anonymous.remove_engine("engine-1"))
        assert isinstance(error, AuthError) and "admin token" in str(error)
    with Client(parrot_url, admin_token="wrong") as impostor:
        raised(ForbiddenError, 403, "forbidden", lambda: impostor.remove_engine("engine-1"))
    assert len(parrot.engines()) == 1


def test_conflicts(parrot, engine_server):
    error = raised(ConflictError, 409, "conflict", lambda: parrot.register_engine(engine_server.url))
    assert not isinstance(error, GraphError)
    with parrot.session() as session:
        target = session.var("reply")
        answer("Why?", reply=target)
        error = raised(GraphError, 409, "graph_conflict", lambda: answer("How?", reply=target))
        assert "already produced" in str(error) and isinstance(error, ConflictError)


def test_wait_timeout_and_producer_failed(parrot):
    with parrot.session() as session:
        never = session.var("never")
        error = raised(WaitTimeoutError, 408, "timeout", lambda: never.get(timeout=0.01))
        assert isinstance(error, TimeoutError) and "no value after" in str(error)
        # A transform that fails on the server, and a call that depends on it: neither gets a value.
        doomed = session.transform(["no digits here"], [{"type": "regex", "pattern": "[0-9]+"}])
        downstream = answer(doomed)
        error = raised(ProducerFailedError, 424, "producer_failed", downstream.get)
        assert "did not match" in str(error)
        raised(ProducerFailedError, 424, "producer_failed", doomed.get)
        assert not doomed.ready


def test_no_engine_registered(tmp_path):
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    with ServerThread(create_app(core)) as server, Client(server.url) as client, client.session():
        error = raised(EngineUnavailableError, 503, "no_engine", lambda: answer("Why?"))
        assert "no engine is registered" in str(error)


def test_unknown_model(parrot):
    with parrot.session():
        error = raised(NotFoundError, 404, "unknown_model", lambda: answer("Why?", models=["no-such-model"]))
        assert "no registered engine serves the 1 model(s) asked for" in str(error)


def test_unreachable_server():
    with Client(f"http://127.0.0.1:{free_port()}", timeout=5) as client:
        error = raised(ServerUnreachableError, None, None, client.healthz)
        assert isinstance(error, ConnectionError) and "unreachable" in str(error)


def test_a_too_large_format_is_413_and_not_a_bad_request(parrot):
    """The class the server raised (a FormatTooLargeError, over --max-format-chars) is the
    one the SDK raises: a PayloadTooLargeError, which is not a BadRequestError (the request
    is well formed, only too large)."""
    with parrot.session() as session:
        huge = Output(choice=[f"{n:04d}" + "x" * 96 for n in range(1000)])  # 100k characters of JSON
        submit = lambda: session.submit("A: {{a}}", {}, {"a": huge})  # noqa: E731
        error = raised(FormatTooLargeError, 413, "format_too_large", submit)
        assert isinstance(error, PayloadTooLargeError) and not isinstance(error, BadRequestError)
        assert "max_format_chars" in str(error) and session.info().calls == []


def test_litestar_answers_and_a_deleted_session(parrot):
    """A route's wrong method (Litestar's own 405) comes back as the hierarchy's class of
    its status; a variable of a deleted session is not found."""
    patch = Op("PATCH", "/healthz", nothing)
    error = raised(MethodNotAllowedError, 405, "method_not_allowed", lambda: parrot.send(patch))
    assert not isinstance(error, BadRequestError | NotFoundError)
    session = parrot.session()
    var = session.var("v")
    session.delete()
    error = raised(NotFoundError, 404, "not_found", var.get)
    assert type(error) is NotFoundError and "does not exist" in str(error)
