"""Hostile output formats, fuzzed (issue 37): deep and recursive JSON schemas, catastrophic
regexes, huge alternations and enums, and Lark grammars (good, bad and costly), each given
where a format goes: a call's output parameter, a typed variable, ``response_format`` and a
tool's ``parameters`` on the OpenAI front (JSON schemas), vLLM's ``structured_outputs``
there (regexes and grammars). No answer may be a 5xx, and ``/healthz``, asked all along
from another thread, keeps a p99 under 300 ms. The ServeCore runs on the fake engine:
what is under test is what happens before a format reaches an engine (the fake refuses
to generate with one: a front request that passed the checks answers 424).

Quick size in ``make test`` (``PARROT_FUZZ_EXAMPLES``, default 6, times 5 here)."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from conftest import ServerThread
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url

EXAMPLES = 5 * int(os.environ.get("PARROT_FUZZ_EXAMPLES", "6"))
STALL_S = 0.3  # the issue's bound on /healthz's p99 beside a hostile request

WORDS = st.text("abcxyz", min_size=1, max_size=6)


def deep(depth: int, kind: str) -> dict:
    schema: dict = {"type": "string", "maxLength": 4}
    for _ in range(depth):
        schema = (
            {"type": "array", "items": schema, "maxItems": 2}
            if kind == "array"
            else {"type": "object", "properties": {"x": schema}, "required": ["x"]}
        )
    return schema


RECURSIVE = [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]},
    {"type": "object", "properties": {"self": {"$ref": "#"}}},
    {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}, "maxItems": 3}]},
    {"$ref": "#", "type": "object"},
]

schemas = st.one_of(
    st.builds(deep, st.integers(1, 600), st.sampled_from(["array", "object"])),
    st.sampled_from(RECURSIVE),
    st.builds(lambda n: {"enum": [f"value {i}" for i in range(n)]}, st.integers(1, 3000)),
    st.builds(
        lambda n: {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}},
        st.integers(1, 1200),
    ),
    st.builds(lambda ws: {"type": "string", "pattern": "|".join(ws)}, st.lists(WORDS, max_size=300)),
)
regexes = st.one_of(
    st.sampled_from(
        ["(a|aa)+$", "(x+x+)+y", "((a{100}){100}){100}", "(a{1000}){1000}", "[a-z&&[^aeiou]]{3}"]
    ),
    st.builds(lambda n, m: f"(a{{{n}}}){{{m}}}", st.integers(1, 2000), st.integers(1, 2000)),
    st.builds(lambda ws: "|".join(ws), st.lists(WORDS, min_size=1, max_size=5000)),
    st.text(max_size=40),  # whatever: most of it is not a regex
)
grammars = st.one_of(
    st.sampled_from([
        'start: e\ne: e "+" t | t\nt: "1"\n',  # left recursion
        "start: x\n",  # an undefined rule
        'start: a\na: a\n',  # no way out
        "start: /(a|aa)+b/\n",
    ]),
    st.builds(
        lambda ws: "start: " + " | ".join(f'"{w}"' for w in ws) + "\n",
        st.lists(WORDS, min_size=1, max_size=3000),
    ),
    st.text(max_size=60),
)
formats = st.one_of(
    st.builds(lambda s: {"json_schema": s}, schemas),
    st.builds(lambda r: {"regex": r}, regexes),
    st.builds(lambda g: {"grammar": g}, grammars),
    st.builds(lambda ws: {"choice": ws}, st.lists(WORDS, min_size=1, max_size=3000, unique=True)),
)
SURFACES = ("call output", "typed variable", "response_format", "tool parameters", "structured_outputs")


def request_for(fmt: dict, surface: str, session: tuple[str, dict]) -> tuple[str, dict, dict] | None:
    """(path, body, headers) giving ``fmt`` where ``surface`` takes it (None: it does not)."""
    sid, auth = session
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    schema = fmt.get("json_schema")
    if surface == "call output":
        out = {"name": "a", "is_output": True, "format": fmt, "sampling": {"max_tokens": 2}}
        return "/v1/semantic_call", {"session_id": sid, "template": "Q: {{a}}", "parameters": [out]}, auth
    if surface == "typed variable":
        return "/v1/semantic_var", {"session_id": sid, "name": "v", "format": fmt}, auth
    if surface == "response_format" and schema is not None:
        rf = {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}
        return "/v1/chat/completions", {**chat, "response_format": rf}, {}
    if surface == "tool parameters" and schema is not None:
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        return "/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": "required"}, {}
    if surface == "structured_outputs" and ("regex" in fmt or "grammar" in fmt):
        return "/v1/chat/completions", {**chat, "structured_outputs": fmt}, {}
    return None


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from fake_engine import FakeEngineServer

    store = Store(sqlite_url(tmp_path_factory.mktemp("format-fuzz")))
    with FakeEngineServer() as engine:
        app = create_app(ServeCore(store=store), engine_urls=(engine.url,))
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
            yield client


def test_hostile_formats_get_no_5xx_and_do_not_stall_the_server(api):
    body = api.post("/v1/session").json()
    session = (body["session_id"], {"Authorization": f"Bearer {body['session_auth']}"})
    waits: list[float] = []
    done = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=api.base_url, timeout=10) as other:
            while not done.is_set():
                started = time.monotonic()
                assert other.get("/healthz").status_code == 200
                waits.append(time.monotonic() - started)
                time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    statuses: list[int] = []

    @seed(37)
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(fmt=formats, surface=st.sampled_from(SURFACES))
    def hostile(fmt: dict, surface: str) -> None:
        request = request_for(fmt, surface, session)
        if request is None:
            return
        path, payload, headers = request
        r = api.post(path, json=payload, headers=headers)
        statuses.append(r.status_code)
        assert r.status_code < 500, (path, str(fmt)[:300], r.text[:300])

    try:
        hostile()
    finally:
        done.set()
        watcher.join()
    ordered = sorted(waits)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    assert waits and {s // 100 for s in statuses} == {2, 4}, statuses  # some taken, some refused
    assert p99 < STALL_S, f"/healthz p99 {p99 * 1000:.0f} ms beside {len(statuses)} hostile formats"
