"""OpenAI-compatible engines behind the ServeCore: registered over the API, a DAG runs on
one end to end (a second engine's real ``/v1`` routes, chat and completions modes), and the
registered API key shows up in no response and no log line."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from conftest import ServerThread

from parrot.engines.openai.config import OpenAIEngineConfig
from parrot.engines.openai.request import build_request
from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams

SECRET = "sk-parrot-test-0123456789abcdef"
ADMIN = {"Authorization": "Bearer admin"}


@pytest.fixture
def servecore(tmp_path):
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    server = ServerThread(create_app(core, admin_token="admin"))
    with server, httpx.Client(base_url=server.url, timeout=120) as api:
        yield api


def served_model(engine_server) -> str:
    return httpx.get(f"{engine_server.url}/v1/models").json()["data"][0]["id"]


def out(name: str) -> dict:
    return {"name": name, "is_output": True, "sampling": {"max_tokens": 8, "temperature": 0}}


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_dag_runs_on_an_openai_engine(servecore, engine_server, api, caplog):
    caplog.set_level(logging.DEBUG)
    body = {
        "kind": "openai",
        "base_url": f"{engine_server.url}/v1",
        "model": served_model(engine_server),
        "api_key": SECRET,
        "api": api,
        "capacity": 4,
    }
    r = servecore.post("/v1/engines", json=body, headers=ADMIN)
    assert r.status_code == 201, r.text
    engine = r.json()
    assert engine["kind"] == "openai" and engine["up"] and engine["model"] == body["model"]
    assert engine["backend"] == "openai-compatible"  # Parrot's own /v1 is none of the kinds it plans for
    s = servecore.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    template_a = "<|im_start|>user\nName a sea creature.<|im_end|>\n<|im_start|>assistant\n{{a}}"
    a = servecore.post(
        "/v1/semantic_call",
        headers=auth,
        json={"session_id": sid, "template": template_a, "parameters": [out("a")]},
    ).json()
    template_b = "<|im_start|>user\nDescribe {{a}} in three words.<|im_end|>\n<|im_start|>assistant\n{{b}}"
    b = servecore.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": template_b,
            "parameters": [{"name": "a", "var_id": a["outputs"]["a"]}, out("b")],
        },
    ).json()
    final = servecore.get(f"/v1/semantic_var/{b['outputs']['b']}", params={"session_id": sid}, headers=auth)
    assert final.status_code == 200 and final.json()["value"], final.text
    for call in (a, b):
        info = servecore.get(f"/v1/semantic_call/{call['call_id']}", params={"session_id": sid}, headers=auth)
        assert info.json()["state"] == "done" and info.json()["engine"] == engine["engine_id"]
    # The key is in no response and no log line.
    pages = [
        r.text,
        servecore.get("/v1/engines").text,
        servecore.get("/metrics").text,
        servecore.get(f"/v1/session/{sid}", headers=auth).text,
        servecore.get("/schema/openapi.json").text,
    ]
    assert all(SECRET not in page for page in pages)
    leaks = [r for r in caplog.records if SECRET in r.getMessage()]
    assert not leaks, [(r.name, r.getMessage()[:300]) for r in leaks]


def test_bad_openai_registrations_leak_no_key(servecore, caplog):
    caplog.set_level(logging.DEBUG)
    body = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": SECRET}
    r = servecore.post("/v1/engines", json=body, headers=ADMIN)
    assert r.status_code == 400 and "could not reach" in r.json()["error"]["message"], r.text
    assert SECRET not in r.text
    r = servecore.post("/v1/engines", json={**body, "api": "embeddings"}, headers=ADMIN)
    assert r.status_code == 400 and SECRET not in r.text
    assert servecore.get("/v1/engines").json() == []
    leaks = [r for r in caplog.records if SECRET in r.getMessage()]
    assert not leaks, [(r.name, r.getMessage()[:300]) for r in leaks]


def test_a_builtin_and_an_openai_engine_of_one_model_each_get_their_own_prompt(servecore, engine_server):
    """The same model behind a builtin engine (token contexts) and an OpenAI endpoint (text
    contexts): each call's prompt is built for the engine it lands on. Calls used to fail
    with "Expected int, got str (token_ids[0])": the prompts were kept per model name, so a
    text prompt went to the builtin engine (or token ids to the endpoint)."""
    builtin = servecore.post("/v1/engines", json={"url": engine_server.url}, headers=ADMIN)
    assert builtin.status_code == 201, builtin.text
    body = {
        "kind": "openai",
        "base_url": f"{engine_server.url}/v1",
        "model": served_model(engine_server),
        "capacity": 1,  # one task at a time: the others go to the builtin engine
    }
    openai = servecore.post("/v1/engines", json=body, headers=ADMIN)
    assert openai.status_code == 201, openai.text
    assert builtin.json()["model"] == openai.json()["model"]
    s = servecore.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    calls = []
    for i in range(8):  # enough calls at once that both engines take some
        ask = f"<|im_start|>user\nName sea creature number {i}.<|im_end|>\n"
        template = ask + "<|im_start|>assistant\n{{a}}"
        r = servecore.post(
            "/v1/semantic_call",
            headers=auth,
            json={"session_id": sid, "template": template, "parameters": [out("a")]},
        )
        assert r.status_code == 201, r.text
        calls.append(r.json())
    engines = set()
    for call in calls:
        var = servecore.get(
            f"/v1/semantic_var/{call['outputs']['a']}", params={"session_id": sid}, headers=auth
        )
        assert var.status_code == 200 and var.json()["value"], var.text
        info = servecore.get(f"/v1/semantic_call/{call['call_id']}", params={"session_id": sid}, headers=auth)
        assert info.json()["state"] == "done", info.text
        engines.add(info.json()["engine"])
    assert engines == {builtin.json()["engine_id"], openai.json()["engine_id"]}


# -- typed outputs (issue 21) ---------------------------------------------------------------------
CREATURE = {
    "title": "creature",
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20}},
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_format_is_sent_as_the_endpoints_structured_output_request(api):
    """What goes to the endpoint for each kind (documented in
    ``parrot.engines.openai.structured_outputs``)."""
    config = OpenAIEngineConfig(base_url="http://127.0.0.1:1/v1", model="m", api=api)

    def body(**fmt) -> dict:
        sampling = SamplingParams(max_tokens=4, format=OutputFormat(**fmt))
        return build_request(config, "Q", sampling)

    schema = {"name": "creature", "schema": CREATURE, "strict": True}
    shapes = {
        "json_schema": {"type": "json_schema", "json_schema": schema},
        "json_object": {"type": "json_object"},
    }
    for kind, value in (("json_schema", CREATURE), ("json_object", True)):
        sent = body(**{kind: value})
        got = sent["response_format"] if api == "chat" else sent["extra_body"]["response_format"]
        assert got == shapes[kind]
        assert set(sent.get("extra_body", {})) == (set() if api == "chat" else {"response_format"})
    untitled = body(json_schema={"title": "not a name!", "type": "object"})
    assert (untitled.get("response_format") or untitled["extra_body"]["response_format"])["json_schema"][
        "name"
    ] == "output"
    assert body(regex=r"\d+")["extra_body"] == {"structured_outputs": {"regex": r"\d+"}, "regex": r"\d+"}
    assert body(choice=["a.b", 'say "hi"'])["extra_body"] == {
        "structured_outputs": {"choice": ["a.b", 'say "hi"']},
        "regex": r'(a\.b)|(say "hi")',
        "grammar": 'root ::= "a.b" | "say \\"hi\\""',
    }
    assert body(grammar='start: "x"+')["extra_body"] == {
        "structured_outputs": {"grammar": 'start: "x"+'},
        "grammar": '%llguidance {}\nstart: "x"+',
    }
    assert "response_format" not in body(regex="a") and "extra_body" not in build_request(
        config, "Q", SamplingParams()
    )


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_typed_outputs_on_an_openai_engine(servecore, engine_server, api):
    """On a real OpenAI-compatible server (the builtin engine's own ``/v1``): a JSON schema
    and a JSON object go as ``response_format``, which it honours, so the values are valid
    and a field of one fills the next call; a choice goes as vLLM's ``structured_outputs``
    (which this server honours too) and SGLang / llama.cpp fields. A value the backend cut
    short (``max_tokens``) is checked by the ServeCore and fails the call with what did not
    match: never stored as valid."""
    body = {"kind": "openai", "base_url": f"{engine_server.url}/v1", "model": served_model(engine_server)}
    assert servecore.post("/v1/engines", json={**body, "api": api}, headers=ADMIN).status_code == 201
    s = servecore.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}

    def call(user: str, output: dict, inputs: tuple[dict, ...] = ()) -> dict:
        template = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{{{{{output['name']}}}}}"
        r = servecore.post(
            "/v1/semantic_call",
            headers=auth,
            json={"session_id": sid, "template": template, "parameters": [*inputs, output]},
        )
        assert r.status_code == 201, r.text
        return r.json()

    def get(c: dict, name: str) -> httpx.Response:
        return servecore.get(
            f"/v1/semantic_var/{c['outputs'][name]}", params={"session_id": sid}, headers=auth
        )

    def typed(name: str, fmt: dict) -> dict:
        return {**out(name), "sampling": {"max_tokens": 40, "temperature": 0}, "format": fmt}

    creature = call("Name a sea creature, in JSON.", typed("c", {"json_schema": CREATURE}))
    anything = call("Give the name and age of a person as a JSON object.", typed("j", {"json_object": True}))
    choice = call("Name a sea creature.", typed("x", {"choice": ["alpha-7", "beta-9"]}))
    cut = {**typed("cut", {"json_schema": CREATURE}), "sampling": {"max_tokens": 2, "temperature": 0}}
    short = call("Name a sea creature, in JSON.", cut)
    c_var = {"name": "c", "var_id": creature["outputs"]["c"]}
    field = call("Describe {{c.name}} in three words.", out("d"), (c_var,))
    value = get(creature, "c")
    assert value.status_code == 200, value.text
    name = json.loads(value.json()["value"])["name"]
    assert 1 <= len(name) <= 20
    obj = get(anything, "j")
    assert obj.status_code == 200 and isinstance(json.loads(obj.json()["value"]), dict), obj.text
    chosen = get(choice, "x")
    assert chosen.status_code == 200 and chosen.json()["value"] in ("alpha-7", "beta-9"), chosen.text
    refused = get(short, "cut")
    assert refused.status_code == 424, refused.text
    assert "is not JSON" in refused.json()["error"]["message"], refused.text
    assert get(field, "d").status_code == 200
    dag = servecore.get(f"/v1/session/{sid}/dag", headers=auth).json()
    parts = next(c for c in dag["calls"] if c["call_id"] == field["call_id"])["template"]
    assert ("c.name", name) in [(p["name"], p["text"]) for p in parts]
