"""API fuzzing (issue 14): schemathesis against the ServeCore's and the builtin engine's own
OpenAPI schemas, each served by a real server on 127.0.0.1 (the ServeCore on the shared
real engine). Every answer must conform to the schema (documented status, content type,
body) and none may be a 5xx; see ``fuzzing.py``.

Most cases name real things (a live session with its ``session_auth``, its variables and
calls, the admin token, contexts held on the engine), so they reach the handlers and not
only the 401 / 404 in front of them; the rest keep what the fuzzer made up. Sizes that
would only make the model run long (``max_tokens``, ``n``, a get's ``timeout``) are cut.

Quick size (in ``make test``): 6 cases per operation and generation mode. Full size, the
numbers in docs/reliability.md (``-s`` prints the summary):

    PARROT_FUZZ_EXAMPLES=100 .venv/bin/pytest tests/fuzz -s
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import schemathesis
import schemathesis.specs.openapi.schemas  # (see below)
from conftest import ServerThread
from fuzzing import FuzzReport, fuzz
from schemathesis import Case

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url

# schemathesis imports its OpenAPI modules on first use, and pytest's assertion rewriting
# compiles them then; compiling while other threads of the test (its servers) run can trip
# CPython 3.11's check of the AST's recursion depth (a SystemError, gh-106905). Imported at
# collection, they are compiled before any thread starts.

EXAMPLES = int(os.environ.get("PARROT_FUZZ_EXAMPLES", "6"))
SEED = int(os.environ.get("PARROT_FUZZ_SEED", "14"))
ADMIN = "fuzz-admin-token"
REAL = 0.8  # the share of cases that name real things
MAX_TOKENS, MAX_N, MAX_WAIT_S = 2, 2, 0.5
# Context ids of the engine fuzz, clear of the ids other tests use (10_000 and up) and of
# a ServeCore's (2**48 and up): fuzzing must not free contexts another test holds.
FUZZ_CONTEXTS, FUZZ_CONTEXT_COUNT = 2**40, 64


def cut_sizes(value: object) -> None:
    """Cut, in place, the sizes that only make the engine work long."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("max_tokens", "max_completion_tokens") and _is_int(item) and item > MAX_TOKENS:
                value[key] = MAX_TOKENS
            elif key == "n" and _is_int(item) and item > MAX_N:
                value[key] = MAX_N
            else:
                cut_sizes(item)
    elif isinstance(value, list):
        for item in value:
            cut_sizes(item)


def cap_generations(body: object) -> None:
    """Give the generations a request asks for without a length a small one (a default
    length can be the model's whole context)."""
    if not isinstance(body, dict):
        return
    if ("prompt" in body or "messages" in body) and "max_completion_tokens" not in body:
        body.setdefault("max_tokens", MAX_TOKENS)  # an OpenAI route
    if "context_id" in body and isinstance(body.setdefault("sampling", {}), dict):
        body["sampling"].setdefault("max_tokens", MAX_TOKENS)  # the engine's generate
    parameters = body.get("parameters")
    for parameter in parameters if isinstance(parameters, list) else []:
        output = isinstance(parameter, dict) and parameter.get("is_output") is True
        if output and isinstance(parameter.setdefault("sampling", {}), dict):
            parameter["sampling"].setdefault("max_tokens", MAX_TOKENS)  # a semantic call's output


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _replace_keys(value: object, keys: tuple[str, ...], pick) -> None:
    """Replace, in place, the values of ``keys`` anywhere in a body by ``pick()``."""
    if isinstance(value, dict):
        for key in list(value):
            if key in keys:
                value[key] = pick()
            else:
                _replace_keys(value[key], keys, pick)
    elif isinstance(value, list):
        for item in value:
            _replace_keys(item, keys, pick)


# -- the ServeCore ------------------------------------------------------------------------
class ServeCoreWorld:
    """Real things for the fuzzer to name: a session with a variable holding a value, one
    waiting for its value, the outputs of a finished and of a failed transform, and the
    engine."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        (engine,) = http.get("/v1/engines").json()
        self.engine_id = engine["engine_id"]
        self.session_id, self.auth = self.new_session()
        var = self._post("/v1/semantic_var", {"name": "topic", "value": "tides"})
        empty = self._post("/v1/semantic_var", {"name": "later"})
        steps = [{"type": "strip"}, {"type": "upper"}]
        call = self._post("/v1/semantic_transform", {"inputs": [{"var_id": var}], "steps": steps})
        # a call that fails (the input is no JSON): its output answers 424 with the reason
        broken = [{"type": "json_field", "path": "a"}]
        failed = self._post("/v1/semantic_transform", {"inputs": [{"value": "not json"}], "steps": broken})
        self.var_ids = [var, empty, call["outputs"]["result"], failed["outputs"]["result"]]
        # A stream of the waiting one never ends (no value comes): one such case held the
        # run for the client's whole timeout (60 s); streams name the others.
        self.ending_var_ids = [v for v in self.var_ids if v != empty]
        self.call_ids = [call["call_id"], failed["call_id"]]

    def new_session(self) -> tuple[str, str]:
        body = self.http.post("/v1/session").raise_for_status().json()
        return body["session_id"], body["session_auth"]

    def _post(self, path: str, body: dict):
        headers = {"Authorization": f"Bearer {self.auth}"}
        r = self.http.post(path, json={"session_id": self.session_id, **body}, headers=headers)
        answer = r.raise_for_status().json()
        return answer if "call_id" in answer else answer["var_id"]

    def prepare(self, case: Case, rnd: random.Random) -> None:
        if rnd.random() < REAL:
            session_id, auth = self.session_id, self.auth
            if case.method == "DELETE" and case.path.startswith("/v1/session"):
                session_id, auth = self.new_session()  # keep the shared one alive
            self._name_real_things(case, rnd, session_id)
            token = ADMIN if case.path.startswith("/v1/engines") else auth
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
            if case.method == "POST" and case.path == "/v1/engines" and isinstance(case.body, dict):
                _keep_on_this_machine(case.body)
        cut_sizes(case.body)
        cap_generations(case.body)
        if case.method == "GET" and case.path == "/v1/semantic_var/{var_id}":
            query = case.query if isinstance(case.query, dict) else {}
            wait = query.get("timeout", MAX_WAIT_S)  # the default waits 300 s for a value
            query["timeout"] = min(wait, MAX_WAIT_S) if isinstance(wait, int | float) else wait
            case.query = query

    def _name_real_things(self, case: Case, rnd: random.Random, session_id: str) -> None:
        path = case.path_parameters or {}
        if "session_id" in path:
            path["session_id"] = session_id
        if "var_id" in path:
            path["var_id"] = rnd.choice(
                self.ending_var_ids if case.path.endswith("/stream") else self.var_ids
            )
        if "call_id" in path:
            path["call_id"] = rnd.choice(self.call_ids)
        if "engine_id" in path and case.method != "DELETE":  # never remove the one engine
            path["engine_id"] = self.engine_id
        query = case.query or {}
        if "session_id" in query:
            query["session_id"] = session_id
        if isinstance(case.body, dict):
            if "session_id" in case.body:
                case.body["session_id"] = session_id
            _replace_keys(case.body, ("var_id",), lambda: rnd.choice(self.var_ids))


def _keep_on_this_machine(body: dict) -> None:
    """An engine URL the fuzzer made up points at a closed port here: registering must not
    wait on the network."""
    for key in ("url", "base_url"):
        if isinstance(body.get(key), str):
            try:
                parts = urlsplit(body[key])
                parts.port  # noqa: B018 (raises ValueError on a bad port)
            except ValueError:
                continue  # a URL that does not parse stays: the server must refuse it
            if parts.hostname:
                body[key] = urlunsplit((parts.scheme, "127.0.0.1:9", parts.path, "", ""))


@pytest.fixture(scope="module")
def servecore(engine_server, tmp_path_factory) -> Iterator[tuple[str, ServeCore]]:
    core = ServeCore(store=Store(sqlite_url(tmp_path_factory.mktemp("fuzz-db"))))
    app = create_app(core, engine_urls=(engine_server.url,), admin_token=ADMIN)
    with ServerThread(app) as server:
        yield server.url, core


def test_fuzz_the_servecore_api(servecore, client):
    url, core = servecore
    with httpx.Client(base_url=url, timeout=60) as http:
        world = ServeCoreWorld(http)
        schema = schemathesis.openapi.from_url(f"{url}/schema/openapi.json")
        report = fuzz(schema, "ServeCore", world.prepare, EXAMPLES, SEED)
        assert http.get("/healthz").json()["status"] == "ok"
        http.delete(f"/v1/session/{world.session_id}", headers={"Authorization": f"Bearer {world.auth}"})
    # The shared prompt prefixes this ServeCore keeps on the shared engine go with it.
    (slot,) = core.scheduler.engines.values()
    held = list(core.contexts.tree(slot).contexts)
    if held:
        assert client.post("/abort", json={"context_ids": held}).status_code == 200
    print(f"ServeCore fuzz: freed the {len(held)} contexts it held on the engine")
    assert_clean(report)


# -- the builtin engine -------------------------------------------------------------------
def engine_prepare(case: Case, rnd: random.Random) -> None:
    """Context ids go to the fuzz's own range (a few of them filled before the run)."""

    def own(value: object) -> object:
        return FUZZ_CONTEXTS + value % FUZZ_CONTEXT_COUNT if _is_int(value) and 0 <= value < 2**62 else value

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("context_id", "parent_context_id"):
                    value[key] = own(item)
                elif key == "context_ids" and isinstance(item, list):
                    value[key] = [own(v) for v in item]
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(case.body)
    cut_sizes(case.body)
    if case.path.startswith(("/generate", "/v1/")):
        cap_generations(case.body)
    if isinstance(case.body, dict) and isinstance(case.body.get("parent_timeout_ms"), int):
        case.body["parent_timeout_ms"] = min(case.body["parent_timeout_ms"], 100)


def test_fuzz_the_engine_api(client, engine_server):
    contexts = [FUZZ_CONTEXTS + i for i in range(FUZZ_CONTEXT_COUNT)]
    for cid in contexts[:4]:
        assert (
            client.post("/fill", json={"context_id": cid, "text": "The tide tables say"}).status_code == 200
        )
    try:
        schema = schemathesis.openapi.from_url(f"{engine_server.url}/schema/openapi.json")
        report = fuzz(schema, "builtin engine", engine_prepare, EXAMPLES, SEED)
        assert client.get("/ping").status_code == 200
    finally:
        client.post("/abort", json={"context_ids": contexts})
    assert_clean(report)


def assert_clean(report: FuzzReport) -> None:
    print(report.summary())
    assert report.cases >= 2 * len(report.per_operation), report.summary()  # every operation ran
    assert not report.failures, report.summary()
