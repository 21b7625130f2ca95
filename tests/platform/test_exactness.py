"""Token-exact prompts: with greedy sampling, a semantic call's output equals what the
engine's own ``/v1/completions`` gives for the call's rendered prompt, whatever the call
shares with others (constant prefixes, several sessions, inputs at any boundary, prompts
filled ahead while waiting)."""

from __future__ import annotations

import httpx
import pytest
from conftest import ServerThread

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore

MAX_TOKENS = 10
SYSTEM = "You are the keeper's logbook. Answer in one plain line. " * 8
CASES = [  # (template, input values): inputs inside words, at spaces, unicode, braces
    (SYSTEM + "\nTopic: {{topic}}\nLine:{{line}}", {"topic": "the northern tide"}),
    (SYSTEM + "\nTopic: {{topic}}\nLine:{{line}}", {"topic": "  spaced   out  "}),
    (SYSTEM + "\nTopic: {{topic}}\nLine:{{line}}", {"topic": "café naïve 日本 🦜"}),
    (SYSTEM + "\nTopic:{{topic}}!\nLine: {{line}}", {"topic": "{{not a placeholder}}"}),
    ("Name:{{a}}{{b}}, age {{c}}.\nStory:{{line}}", {"a": "Mar", "b": "garet", "c": "7"}),
    ("{{topic}}{{line}}", {"topic": "The bell rang twice and"}),
]


def render(template: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        template = template.replace("{{" + name + "}}", value)
    return template.replace("{{line}}", "")


def completion(engine: httpx.Client, prompt: str) -> str:
    r = engine.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def clients(engine_server):
    app = create_app(ServeCore(), engine_urls=(engine_server.url,), admin_token="a")
    with (
        ServerThread(app) as server,
        httpx.Client(base_url=server.url, timeout=120) as api,
        httpx.Client(base_url=engine_server.url, timeout=120) as engine,
    ):
        yield api, engine


def session(api: httpx.Client) -> tuple[str, dict]:
    s = api.post("/v1/session").json()
    return s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}


def submit(api, sid, auth, template: str, inputs: dict) -> str:
    params = [{"name": n, **v} for n, v in inputs.items()]
    params.append(
        {"name": "line", "is_output": True, "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0}}
    )
    r = api.post(
        "/v1/semantic_call",
        json={"session_id": sid, "template": template, "parameters": params},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    return r.json()["outputs"]["line"]


def get(api, sid, auth, var_id: str) -> str:
    r = api.get(f"/v1/semantic_var/{var_id}", params={"session_id": sid}, headers=auth)
    assert r.status_code == 200, r.text
    return r.json()["value"]


def test_each_call_generates_what_the_engine_gives_for_its_rendered_prompt(clients):
    api, engine = clients
    for template, values in CASES:  # a session each: constant prefixes shared across them
        sid, auth = session(api)
        out = submit(api, sid, auth, template, {n: {"value": v} for n, v in values.items()})
        assert get(api, sid, auth, out) == completion(engine, render(template, values)), (template, values)


def test_a_chain_and_a_waiting_call_filled_ahead_are_exact_too(clients):
    api, engine = clients
    sid, auth = session(api)
    first = submit(api, sid, auth, "Name one harbour town:{{line}}", {})
    # This call waits for ``first``: its document is filled ahead meanwhile.
    document = "Document: " + " ".join(f"Entry {i}: calm sea, lamp lit at dusk." for i in range(20))
    template = document + "\nTown: {{town}}\nWhat happened there?{{line}}"
    second = submit(api, sid, auth, template, {"town": {"var_id": first}})
    town = get(api, sid, auth, first)
    assert town == completion(engine, "Name one harbour town:")
    assert get(api, sid, auth, second) == completion(engine, render(template, {"town": town}))
