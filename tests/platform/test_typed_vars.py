"""Typed semantic variables over the REST API on the real engine (issue 21): an output's
``format``, every bad format refused with nothing created, values checked whoever sets
them, field paths across the DAG, and the format kept across a restart."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import ServerThread

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.limits.settings import Limits
from parrot.platform.store.store import Store, sqlite_url

PLAN = {
    "type": "object",
    "properties": {
        "goal": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "meta": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
    "required": ["goal", "steps"],
    "additionalProperties": False,
}
PLAN_VALUE = '{"goal": "make tea", "steps": ["boil water", "add tea"], "meta": {"n": 2}}'
LIMITS = Limits(max_format_chars=2000)


def start(db: str, engine_url: str) -> ServerThread:
    return ServerThread(create_app(ServeCore(store=Store(db), limits=LIMITS), engine_urls=(engine_url,)))


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return sqlite_url(tmp_path_factory.mktemp("typed-db"))


@pytest.fixture(scope="module")
def api(engine_server, db):
    with start(db, engine_server.url) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


class Session:
    def __init__(self, api: httpx.Client) -> None:
        body = api.post("/v1/session").json()
        self.api, self.sid = api, body["session_id"]
        self.auth = {"Authorization": f"Bearer {body['session_auth']}"}

    def var(self, name: str, value: str | None = None, fmt: dict | None = None) -> httpx.Response:
        body = {"session_id": self.sid, "name": name, "value": value}
        if fmt is not None:
            body["format"] = fmt
        return self.api.post("/v1/semantic_var", json=body, headers=self.auth)

    def set(self, var_id: str, value: str) -> httpx.Response:
        body = {"session_id": self.sid, "value": value}
        return self.api.put(f"/v1/semantic_var/{var_id}", json=body, headers=self.auth)

    def get(self, var_id: str) -> httpx.Response:
        return self.api.get(f"/v1/semantic_var/{var_id}", params={"session_id": self.sid}, headers=self.auth)

    def call(self, template: str, parameters: list[dict]) -> httpx.Response:
        body = {"session_id": self.sid, "template": template, "parameters": parameters}
        return self.api.post("/v1/semantic_call", json=body, headers=self.auth)

    def call_info(self, call_id: str) -> dict:
        r = self.api.get(f"/v1/semantic_call/{call_id}", params={"session_id": self.sid}, headers=self.auth)
        return r.json()

    def info(self) -> dict:
        return self.api.get(f"/v1/session/{self.sid}", headers=self.auth).json()

    def dag(self) -> dict:
        return self.api.get(f"/v1/session/{self.sid}/dag", headers=self.auth).json()


def out(name: str, fmt: dict | None = None, max_tokens: int = 8, **extra) -> dict:
    p = {"name": name, "is_output": True, "sampling": {"max_tokens": max_tokens, "temperature": 0}, **extra}
    if fmt is not None:
        p["format"] = fmt
    return p


def refused(r: httpx.Response, status: int, code: str, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], error["message"]


# -- bad input: a clear 4xx, nothing created ----------------------------------------------------
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def bad_calls(s: Session) -> list[tuple[str, list[dict], int, str, tuple[str, ...]]]:
    plan = s.var("plan", PLAN_VALUE, {"json_schema": PLAN}).json()["var_id"]
    date = s.var("date", "2026-11-25", {"regex": r"\d{4}-\d{2}-\d{2}"}).json()["var_id"]
    typed_out = s.var("verdict", None, {"choice": ["yes", "no"]}).json()["var_id"]
    return [
        ("Q: {{q}} A: {{a}}", [{"name": "q", "value": "x", "format": {"json_object": True}}, out("a")],
         400, "bad_format", ("input 'q' cannot have a format",)),
        ("Q: {{a}}", [{**out("a"), "sampling": {"format": {"regex": "a+"}}}],
         400, "bad_format", ("'format'", "not in its sampling")),
        ("Q: {{a}}", [out("a", {"json_schema": {"type": "nope"}})],
         400, "bad_format", ("bad JSON schema", "Invalid type: nope")),
        ("Q: {{a}}", [out("a", {"json_schema": {"type": "string", "pattern": "(?<=a)b"}})],
         400, "bad_format", ("look-around", "not supported")),
        ("Q: {{a}}", [out("a", {"regex": "(unclosed"})], 400, "bad_format", ("bad regex", "unclosed group")),
        ("Q: {{a}}", [out("a", {"grammar": "start: x"})], 400, "bad_format", ("bad Lark grammar", "x")),
        # issue 37: formats that compile but that no text can start, refused at submit
        ("Q: {{a}}", [out("a", {"json_schema": {"$ref": "#"}})], 400, "bad_format", ("no text can start",)),
        ("Q: {{a}}", [out("a", {"json_schema": CYCLE})], 400, "bad_format", ("no text can start", "cycle")),
        ("Q: {{a}}", [out("a", {"choice": []})], 400, "invalid_request", ("length >= 1", "format.choice")),
        ("Q: {{a}}", [out("a", {"choice": ["x", "x"]})], 400, "invalid_request", ("distinct",)),
        ("Q: {{a}}", [out("a", {"regex": "a", "choice": ["a"]})], 400, "invalid_request", ("exactly one",)),
        ("Q: {{a}}", [out("a", {"json_object": False})], 400, "invalid_request", ("exactly one",)),
        ("Q: {{a}}", [out("a", {"choice": [f"option number {i}" for i in range(200)]})],
         413, "format_too_large", ("max_format_chars = 2000", "--max-format-chars")),
        ("Q: {{a.b}}", [out("a")], 400, "bad_template", ("output {{a.b}} reads a field",)),
        ("Q: {{plan.verdict}} {{a}}", [{"name": "plan", "var_id": plan}, out("a")],
         400, "bad_format", ("{{plan.verdict}}", "no field 'verdict'", "at character 3")),
        ("Q: {{plan.steps.first}} {{a}}", [{"name": "plan", "var_id": plan}, out("a")],
         400, "bad_format", ("{{plan.steps.first}}", "array at .steps")),
        ("Q: {{date.year}} {{a}}", [{"name": "date", "var_id": date}, out("a")],
         400, "bad_format", ("format is a regex",)),
        ("Q: {{a}}", [out("a", {"choice": ["maybe"]}, var_id=typed_out)],
         400, "bad_format", ("already has another format",)),
        ("Q: {{a[1}} x", [out("a")], 400, "bad_template", ("malformed field path", "at character 6")),
    ]  # fmt: skip


def test_bad_formats_and_paths_are_refused_and_create_nothing(api):
    s = Session(api)
    cases = bad_calls(s)
    before = s.info()
    for template, parameters, status, code, words in cases:
        refused(s.call(template, parameters), status, code, *words)
    after = s.info()
    assert (len(after["vars"]), len(after["calls"])) == (len(before["vars"]), len(before["calls"])) == (3, 0)
    verdict = next(v for v in after["vars"] if v["name"] == "verdict")
    assert verdict["format"] == {"choice": ["yes", "no"]}  # unchanged by the refused call


def test_a_format_on_a_variable_is_checked_with_the_same_rules(api):
    s = Session(api)
    refused(s.var("v", None, {"regex": "(("}), 400, "bad_format", "bad regex")
    refused(s.var("v", None, {"json_schema": CYCLE}), 400, "bad_format", "no text can start it")
    refused(s.var("v", None, {"choice": []}), 400, "invalid_request", "choice")
    big = {"json_schema": {"enum": ["x" * 3000]}}
    refused(s.var("v", None, big), 413, "format_too_large", "max_format_chars")
    assert s.info()["vars"] == []


# -- values: checked whoever sets them -----------------------------------------------------------
@pytest.mark.parametrize(
    ("fmt", "good", "bad", "why"),
    [
        ({"json_schema": PLAN}, PLAN_VALUE, '{"goal": "tea"}', '"steps" is a required property'),
        ({"json_object": True}, '{"a": 1}', '["a"]', "is not a JSON object"),
        ({"regex": r"\d{4}-\d{2}-\d{2}"}, "2026-11-25", "25/11/2026", "does not match the regex"),
        ({"choice": ["yes", "no"]}, "yes", "perhaps", "is not one of the choices"),
    ],
)
def test_a_client_set_value_must_match_the_format(api, fmt, good, bad, why):
    s = Session(api)
    refused(s.var("x", bad, fmt), 400, "format_mismatch", "variable 'x'", why)
    r = s.var("x", None, fmt)
    assert r.status_code == 201 and r.json()["format"] == fmt, r.text
    var_id = r.json()["var_id"]
    refused(s.set(var_id, bad), 400, "format_mismatch", why)
    assert next(v for v in s.info()["vars"] if v["var_id"] == var_id)["ready"] is False
    assert s.set(var_id, good).status_code == 200
    got = s.get(var_id).json()
    assert (got["value"], got["format"]) == (good, fmt)
    ready = s.var("y", good, fmt)
    assert ready.status_code == 201 and ready.json()["format"] == fmt
    assert s.var("z", "free text").json()["format"] is None  # an untyped variable has none


CUT_FORMATS = {
    "json_schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    # issue 37 (6): a grammar's value cut short was stored as valid (grammar values were not checked)
    "grammar": 'start: w " " w " " w " " w\nw: "yes" | "no"\n',
}


@pytest.mark.parametrize("kind", sorted(CUT_FORMATS))
def test_a_generated_value_that_does_not_match_fails_the_call_with_the_reason(api, kind):
    """Two tokens cannot hold the required object (or four words): the value is cut short
    (``length``), so it is not a text of its format, constrained decoding or not. The call
    fails with what did not match, the variable has no value, and its consumer fails in turn."""
    s = Session(api)
    fmt = {kind: CUT_FORMATS[kind]}
    a = s.call("Answer: {{a}}", [out("a", fmt, max_tokens=2)]).json()
    b = s.call("Then: {{a}} {{b}}", [{"name": "a", "var_id": a["outputs"]["a"]}, out("b")]).json()
    r = s.get(a["outputs"]["a"])
    refused(r, 424, "producer_failed", f"does not match the {kind} format of 'a'")
    info = s.call_info(a["call_id"])
    assert info["state"] == "failed" and f"does not match the {kind} format" in info["error"]
    assert s.call_info(b["call_id"])["state"] == "failed"
    var = next(v for v in s.info()["vars"] if v["var_id"] == a["outputs"]["a"])
    assert var["ready"] is False and var["format"] == fmt


# -- fields across the DAG ------------------------------------------------------------------------
def test_fields_of_a_typed_value_fill_the_next_calls(api, engine_server):
    """``{{plan.steps[0]}}`` fills ``boil water`` (unquoted) and ``{{plan.meta}}`` compact JSON;
    the call's greedy output is the engine's own on that text, so the prompt is exactly it."""
    s = Session(api)
    plan = s.var("plan", PLAN_VALUE, {"json_schema": PLAN}).json()["var_id"]
    template = "First {{plan.steps[0]}}, then {{ plan.steps[1] }}; {{plan.meta}} {{plan.goal}}:{{a}}"
    a = s.call(template, [{"name": "plan", "var_id": plan}, out("a", max_tokens=6)])
    assert a.status_code == 201, a.text
    value = s.get(a.json()["outputs"]["a"]).json()["value"]
    prompt = 'First boil water, then add tea; {"n":2} make tea:'
    direct = httpx.post(
        f"{engine_server.url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 6, "temperature": 0},
        timeout=120,
    ).json()["choices"][0]["text"]
    assert value == direct
    dag = s.dag()
    parts = next(c for c in dag["calls"] if c["call_id"] == a.json()["call_id"])["template"]
    inputs = [(p["name"], p["text"]) for p in parts if p["kind"] == "input"]
    assert inputs == [
        ("plan.steps[0]", "boil water"),
        ("plan.steps[1]", "add tea"),
        ("plan.meta", '{"n":2}'),
        ("plan.goal", "make tea"),
    ]
    assert next(v for v in dag["vars"] if v["var_id"] == plan)["format"] == {"json_schema": PLAN}


def test_a_field_missing_from_an_untyped_value_fails_the_consuming_call(api):
    """Untyped and ``json_object`` values are read when the call runs: a missing field (or a
    value that is not JSON) fails the call with the reason; a field that is there fills in."""
    s = Session(api)
    loose = s.var("loose", None, {"json_object": True}).json()["var_id"]
    text = s.var("text", "plain words").json()["var_id"]
    missing = s.call("Q: {{loose.steps[3]}} {{a}}", [{"name": "loose", "var_id": loose}, out("a")]).json()
    not_json = s.call("Q: {{text.a}} {{b}}", [{"name": "text", "var_id": text}, out("b")]).json()
    found = s.call(
        "Q: {{loose.steps[1]}} {{c}}", [{"name": "loose", "var_id": loose}, out("c", max_tokens=2)]
    )
    assert found.status_code == 201, found.text
    assert s.set(loose, '{"steps": ["one", "two"]}').status_code == 200
    refused(s.get(missing["outputs"]["a"]), 424, "producer_failed", "input 'loose' has no field .steps[3]",
            ".steps has no [3]: it is an array of 2 items")  # fmt: skip
    refused(s.get(not_json["outputs"]["b"]), 424, "producer_failed", "its value is not JSON")
    assert s.call_info(missing["call_id"])["state"] == "failed"
    assert s.get(found.json()["outputs"]["c"]).json()["ready"]
    parts = next(c for c in s.dag()["calls"] if c["call_id"] == found.json()["call_id"])["template"]
    assert ("loose.steps[1]", "two") in [(p["name"], p["text"]) for p in parts]


def test_an_output_bound_to_an_empty_variable_types_it(api):
    """An output may be bound to an existing variable: the call's format types it (stored),
    and a variable that already has a format gives it to the output."""
    s = Session(api)
    empty = s.var("verdict").json()["var_id"]
    typed = s.var("typed", None, {"choice": ["yes", "no"]}).json()["var_id"]
    r = s.call("Q: {{a}}", [out("a", {"choice": ["yes", "no"]}, var_id=empty, max_tokens=1)])
    assert r.status_code == 201, r.text
    r2 = s.call("Q: {{b}}", [out("b", var_id=typed, max_tokens=1)])
    assert r2.status_code == 201, r2.text
    formats = {v["var_id"]: v.get("format") for v in s.info()["vars"]}
    assert formats[empty] == formats[typed] == {"choice": ["yes", "no"]}
    sampling = {c["call_id"]: c["sampling"] for c in s.dag()["calls"]}
    assert sampling[r2.json()["call_id"]]["b"]["format"] == {"choice": ["yes", "no"]}


# -- restart --------------------------------------------------------------------------------------
def test_typed_variables_and_calls_keep_their_format_across_a_restart(engine_server, tmp_path):
    db = sqlite_url(tmp_path)
    with start(db, engine_server.url) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        s = Session(client)
        plan = s.var("plan", PLAN_VALUE, {"json_schema": PLAN}).json()["var_id"]
        date = s.var("date", None, {"regex": r"\d{4}"}).json()["var_id"]
        # waits for ``date``: unfinished at the restart, it runs again with its field path
        call = s.call("{{date}} {{plan.steps[0]}} {{a}}", [
            {"name": "date", "var_id": date}, {"name": "plan", "var_id": plan},
            out("a", {"choice": ["tea", "coffee"]}, max_tokens=4),
        ]).json()  # fmt: skip
    with start(db, engine_server.url) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        s.api = client
        formats = {v["name"]: v.get("format") for v in s.info()["vars"]}
        assert formats == {
            "plan": {"json_schema": PLAN},
            "date": {"regex": r"\d{4}"},
            "a": {"choice": ["tea", "coffee"]},
        }
        refused(s.set(date, "soon"), 400, "format_mismatch", "does not match the regex")
        assert s.set(date, "2026").status_code == 200
        r = s.get(call["outputs"]["a"])  # the engine's decoding is constrained to the choice
        assert r.status_code == 200 and r.json()["value"] in ("tea", "coffee"), r.text
        parts = next(c for c in s.dag()["calls"] if c["call_id"] == call["call_id"])["template"]
        assert ("plan.steps[0]", "boil water") in [(p["name"], p["text"]) for p in parts]


# -- a typed DAG on the real engine (its decoding constrained to each format) --------------------
STEPS = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 24},
            "minItems": 1,
            "maxItems": 3,
        }
    },
    "required": ["steps"],
    "additionalProperties": False,
}
REVIEW = {
    "type": "object",
    "properties": {"verdict": {"enum": ["good", "bad"]}, "reason": {"type": "string", "maxLength": 24}},
    "required": ["verdict", "reason"],
    "additionalProperties": False,
}


def chat(user: str, output: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{{{{{output}}}}}"


def test_a_three_call_dag_reads_fields_of_generated_typed_values(api):
    """Call 1 plans (a JSON schema), call 2 reviews ``{{plan.steps[0]}}`` (a JSON schema),
    call 3 decides from ``{{review.verdict}}`` (a choice): every value matches its format,
    and each field fills the next prompt as it is in the producer's value."""
    s = Session(api)
    plan = s.call(
        chat("List the steps to make tea, as JSON.", "plan"), [out("plan", {"json_schema": STEPS}, 96)]
    ).json()
    plan_id = plan["outputs"]["plan"]
    review = s.call(
        chat("Is this a good first step to make tea: {{plan.steps[0]}}? Answer in JSON.", "review"),
        [{"name": "plan", "var_id": plan_id}, out("review", {"json_schema": REVIEW}, 64)],
    ).json()
    review_id = review["outputs"]["review"]
    final = s.call(
        chat("The reviewer said {{review.verdict}}. What now?", "final"),
        [{"name": "review", "var_id": review_id}, out("final", {"choice": ["ship it", "try again"]}, 8)],
    )
    assert final.status_code == 201, final.text
    decision = s.get(final.json()["outputs"]["final"])
    assert decision.status_code == 200, decision.text
    assert decision.json()["value"] in ("ship it", "try again")
    steps = json.loads(s.get(plan_id).json()["value"])["steps"]
    verdict = json.loads(s.get(review_id).json()["value"])
    assert steps and all(isinstance(step, str) and 1 <= len(step) <= 24 for step in steps)
    assert verdict["verdict"] in ("good", "bad") and len(verdict["reason"]) <= 24
    calls = {c["call_id"]: c for c in s.dag()["calls"]}
    assert all(calls[c["call_id"]]["state"] == "done" for c in (plan, review, final.json()))

    def inputs(call_id: str) -> list:
        return [(p["name"], p["text"]) for p in calls[call_id]["template"] if p["kind"] == "input"]

    assert inputs(review["call_id"]) == [("plan.steps[0]", steps[0])]
    assert inputs(final.json()["call_id"]) == [("review.verdict", verdict["verdict"])]


@pytest.mark.asyncio(loop_scope="function")
async def test_a_call_the_store_refuses_leaves_its_output_variable_untyped(engine_server, tmp_path):
    """An output bound to an existing, untyped variable types it only if the call is stored:
    a refused write (503) leaves the variable as it was, in memory and in the store."""
    from test_journal import Refusal

    from parrot.platform.serve.calls.service import Binding
    from parrot.platform.serve.errors import StoreError
    from parrot.wire.formats import OutputFormat

    store = Store(sqlite_url(tmp_path))
    core = ServeCore(store=store)
    await core.start()
    try:
        await core.engines.register_builtin(engine_server.url)
        session, _ = await core.sessions.create()
        verdict = await core.vars.create(session, "verdict")
        fmt = OutputFormat(choice=["yes", "no"])
        params = [Binding(name="v", is_output=True, var_id=verdict.var_id, format=fmt)]
        async with Refusal(store):
            with pytest.raises(StoreError):
                await core.calls.submit(session, "Good? {{v}}", params, [], None)
        assert verdict.format is None and verdict.producer is None
        assert (await store.get_var(verdict.var_id)).format is None
        await core.calls.submit(session, "Good? {{v}}", params, [], None)
        assert verdict.format == fmt and (await store.get_var(verdict.var_id)).format == {
            "choice": ["yes", "no"]
        }
    finally:
        await core.stop()
