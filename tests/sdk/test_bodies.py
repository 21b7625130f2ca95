"""Request bodies are the wire contract's structs on both sides (issue 34, item 4): the
server documents and validates each route's body with the struct the SDK sends, and the
SDK refuses what the server's types would refuse before it sends anything."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from parrot.sdk.api import BadRequestError, Output
from parrot.wire.adapter_bodies import RenderChat
from parrot.wire.bodies import CreateVar, RegisterEngine, SetVar, SubmitCall, SubmitCalls, SubmitTransform
from parrot.wire.errors import TransformError

ROUTES = [
    ("/v1/semantic_var", "post", CreateVar),
    ("/v1/semantic_var/{var_id}", "put", SetVar),
    ("/v1/semantic_call", "post", SubmitCall),
    ("/v1/semantic_calls", "post", SubmitCalls),
    ("/v1/semantic_transform", "post", SubmitTransform),
    ("/v1/engines", "post", RegisterEngine),
    ("/v1/render_chat", "post", RenderChat),
]


@pytest.fixture(scope="module")
def openapi(parrot_url) -> dict:
    return httpx.get(f"{parrot_url}/schema/openapi.json", timeout=30).json()


@pytest.mark.parametrize(("path", "method", "body"), ROUTES, ids=[r[0] + " " + r[1] for r in ROUTES])
def test_the_server_documents_each_body_as_the_wire_struct(openapi, path, method, body):
    ref = openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[1]
    component = openapi["components"]["schemas"][name]
    assert name == body.__name__
    fields = msgspec.structs.fields(body)
    assert set(component["properties"]) == {f.encode_name for f in fields}
    assert set(component.get("required", ())) == {f.encode_name for f in fields if f.required}


def test_what_the_sdk_sends_is_what_the_server_takes(parrot):
    """A call with an input by value, one by Var, an output with sampling and a format; a
    transform; both answered, and the server kept what was sent (the format)."""
    with parrot.session() as session:
        given = session.var("given", "four")
        call = session.submit(
            "Say {{a}} and {{b}}: {{out}}",
            {"a": "one", "b": given},
            {"out": Output(choice=["yes", "no"], max_tokens=4, temperature=0)},
        )
        assert call.outputs["out"].get() in ("yes", "no")
        loud = session.transform([given, "!"], [{"type": "join"}, {"type": "upper"}], output="loud")
        assert loud.get() == "FOUR!"
        (listed,) = [v for v in session.info().vars if v.var_id == call.outputs["out"].var_id]
        assert listed.format is not None and listed.format.choice == ["yes", "no"]


def test_bad_bodies_are_refused_before_they_are_sent_or_by_the_server(parrot):
    with parrot.session() as session:
        with pytest.raises(BadRequestError, match=r"transform steps: .*`\$\[0\]\.type`") as local:
            session.transform(["a"], [{"type": "rot13"}])
        assert local.value.status is None  # the SDK's own check: nothing was sent
        with pytest.raises(TransformError, match="invalid regex") as remote:
            session.transform(["a"], [{"type": "regex", "pattern": "("}])  # a type fits, the server says no
        assert (remote.value.status, remote.value.code) == (400, "transform_error")
        assert session.info().calls == [] and session.info().vars == []
    with pytest.raises(TypeError, match="engine_kind"):
        parrot.register_engine("http://127.0.0.1:1", engine_kind="builtin")
    with pytest.raises(BadRequestError, match="a builtin engine needs 'url'") as no_url:
        parrot.register_engine(capacity=2)  # the server's check of a kind's fields
    assert no_url.value.status == 400 and type(no_url.value) is BadRequestError
