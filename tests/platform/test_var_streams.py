"""Streamed semantic variables (issue 22): ``GET /v1/semantic_var/{id}/stream`` sends the
text as it is written, then the value or the reason; deltas always join to the value; late
followers, failures, deleted sessions, followers that leave, the limits, first-token times
(on the fake engine, a token every 20 ms); multi-byte characters of a typed output (on the
real engine), and an OpenAI-kind engine (the real engine's OpenAI routes). The SDK's
streams run on the real engine end to end (tests/sdk/test_var_streams.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import ServerThread
from fake_engine import FakeEngine, FakeEngineServer
from httpx_sse import connect_sse
from waiting import wait_until

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.limits.settings import Limits
from parrot.platform.store.store import Store, sqlite_url

LIMITS = Limits(max_subscribers_per_var=2, max_subscribers_per_session=3)
ADMIN = {"Authorization": "Bearer admin"}
PROMPT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> ServeCore:
    return ServeCore(store=Store(sqlite_url(tmp_path_factory.mktemp("streams"))), limits=LIMITS)


@pytest.fixture(scope="module")
def api(core):
    """The API of ``core`` on a fake engine whose tokens take 20 ms each (a stream has
    several deltas, and a follower that connects at once finds the producer running)."""
    with FakeEngineServer(FakeEngine(step_s=0.02)) as engine, served(core, engine.url) as client:
        yield client


@contextlib.contextmanager
def served(core: ServeCore, engine_url: str) -> Iterator[httpx.Client]:
    app = create_app(core, engine_urls=(engine_url,), admin_token="admin")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


class Session:
    def __init__(self, api: httpx.Client) -> None:
        body = api.post("/v1/session").json()
        self.api, self.sid = api, body["session_id"]
        self.auth = {"Authorization": f"Bearer {body['session_auth']}"}

    def call(self, template: str, parameters: list[dict]) -> dict:
        body = {"session_id": self.sid, "template": template, "parameters": parameters}
        r = self.api.post("/v1/semantic_call", json=body, headers=self.auth)
        assert r.status_code == 201, r.text
        return r.json()

    def ask(self, question: str, **sampling) -> tuple[str, str]:
        """A one-output call; (call id, output var id)."""
        sampling = {"max_tokens": 24, "temperature": 0} | sampling
        out = {"name": "a", "is_output": True, "sampling": sampling}
        call = self.call(PROMPT.format(q=question) + "{{a}}", [out])
        return call["call_id"], call["outputs"]["a"]

    def stream(
        self, var_id: str, stop_after: int | None = None, into: list | None = None
    ) -> list[tuple[str, dict]]:
        """The (event, data) pairs of the variable's stream (the first ``stop_after`` only),
        appended to ``into`` as they come when it is given."""
        events = [] if into is None else into
        url = f"/v1/semantic_var/{var_id}/stream"
        with connect_sse(self.api, "GET", url, params={"session_id": self.sid}, headers=self.auth) as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            for sse in source.iter_sse():
                events.append((sse.event, json.loads(sse.data)))
                if stop_after is not None and len(events) >= stop_after:
                    break
        return events

    def get(self, var_id: str) -> dict:
        r = self.api.get(f"/v1/semantic_var/{var_id}", params={"session_id": self.sid}, headers=self.auth)
        assert r.status_code == 200, r.text
        return r.json()

    def info(self) -> dict:
        return self.api.get(f"/v1/session/{self.sid}", headers=self.auth).json()


def joined(events: list[tuple[str, dict]]) -> str:
    return "".join(data["delta"] for name, data in events if name == "delta")


def final(events: list[tuple[str, dict]]) -> tuple[str, dict]:
    assert events and all(name == "delta" for name, _ in events[:-1]), events
    return events[-1]


def test_deltas_join_to_the_value(api):
    s = Session(api)
    _, var = s.ask("Write a short poem about the sea.", max_tokens=40, ignore_eos=True)
    events = s.stream(var)
    name, data = final(events)
    assert name == "value"
    deltas = [d for n, d in events if n == "delta"]
    assert len(deltas) >= 2  # streamed, not sent at the end
    assert joined(events) == data["value"] == s.get(var)["value"]
    assert data["finish_reason"] == "length" and data["tokens"] == 40
    assert sum(d["tokens"] for d in deltas) == 40


def test_a_stop_string_is_never_streamed(api):
    s = Session(api)
    # Greedy: find the text first, then stop on a string from its middle.
    _, probe = s.ask("Count from one to twenty in words, separated by commas.", max_tokens=40)
    text = s.get(probe)["value"]
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    assert len(stop.strip()) >= 2, text
    _, var = s.ask("Count from one to twenty in words, separated by commas.", max_tokens=40, stop=[stop])
    events = s.stream(var)
    name, data = final(events)
    assert name == "value" and data["finish_reason"] == "stop"
    assert joined(events) == data["value"] == text[: text.index(stop)]
    assert stop not in joined(events)


def test_multi_byte_characters_and_two_outputs_of_one_call(engine_server, tmp_path):
    core = ServeCore(store=Store(sqlite_url(tmp_path)), limits=LIMITS)
    with served(core, engine_server.url) as api:
        multi_byte_characters_and_two_outputs_of_one_call(api)


def multi_byte_characters_and_two_outputs_of_one_call(api: httpx.Client) -> None:
    s = Session(api)
    word = "café ☕ naïve 日本語 ü"
    template = PROMPT.format(q="Say something.") + "{{first}} and then {{second}}"
    params = [
        {"name": "first", "is_output": True, "format": {"choice": [word]}, "sampling": {"max_tokens": 40}},
        {"name": "second", "is_output": True, "sampling": {"max_tokens": 12, "temperature": 0}},
    ]
    outputs = s.call(template, params)["outputs"]
    first, second = s.stream(outputs["first"]), s.stream(outputs["second"])
    assert final(first)[0] == "value" and joined(first) == word == final(first)[1]["value"]
    assert final(first)[1]["format"] == {"choice": [word]}  # typed: as a get says
    assert final(second)[0] == "value" and joined(second) == final(second)[1]["value"]
    assert final(second)[1]["value"] == s.get(outputs["second"])["value"]


def test_late_and_very_late_followers(api):
    s = Session(api)
    _, var = s.ask("Tell me a long story about a dragon.", max_tokens=64, ignore_eos=True)
    early = s.stream(var, stop_after=1)  # the producer is running: it has written something
    assert early[0][0] == "delta"
    late = s.stream(var)  # arrives while it runs: first what exists, then the rest
    assert final(late)[0] == "value" and joined(late) == final(late)[1]["value"]
    very_late = s.stream(var)  # after the value: the value at once
    assert [name for name, _ in very_late] == ["value"]
    assert very_late[0][1]["value"] == final(late)[1]["value"]
    assert very_late[0][1]["finish_reason"] == "length"


def test_a_client_set_value_streams_as_its_value(api, core):
    s = Session(api)
    body = {"session_id": s.sid, "name": "given"}
    var = api.post("/v1/semantic_var", json=body, headers=s.auth).json()["var_id"]
    got: list = []
    follower = threading.Thread(target=lambda: got.extend(s.stream(var)))
    follower.start()
    wait_until(lambda: s.sid in core.streams._per_session, what="the follower")  # it waits for the value
    r = api.put(f"/v1/semantic_var/{var}", json={"session_id": s.sid, "value": "hello"}, headers=s.auth)
    assert r.status_code == 200, r.text
    follower.join(30)
    assert got == [("value", {"value": "hello", "finish_reason": None, "tokens": 0, "format": None})]


def test_a_failed_producer_ends_the_stream_with_its_reason(api):
    s = Session(api)
    body = {
        "session_id": s.sid,
        "inputs": [{"value": "not json"}],
        "steps": [{"type": "json_field", "path": "x"}],
    }
    r = api.post("/v1/semantic_transform", json=body, headers=s.auth)
    assert r.status_code == 201, r.text
    broken = r.json()["outputs"]["result"]
    out = {"name": "a", "is_output": True, "sampling": {"max_tokens": 8}}
    call = s.call(PROMPT.format(q="Repeat: {{x}}") + "{{a}}", [{"name": "x", "var_id": broken}, out])
    events = s.stream(call["outputs"]["a"])
    assert [name for name, _ in events] == ["error"]
    error = events[0][1]["error"]
    assert error["code"] == "producer_failed" and error["status"] == 424
    assert "input" in error["message"] and "failed" in error["message"]


def test_deleting_the_session_ends_its_streams(api):
    s = Session(api)
    _, var = s.ask("Tell me a very long story about a castle.", max_tokens=200, ignore_eos=True)
    got: list = []
    follower = threading.Thread(target=lambda: s.stream(var, into=got))
    follower.start()
    wait_until(lambda: got, what="the first delta")  # the producer is running
    assert api.delete(f"/v1/session/{s.sid}", headers=s.auth).status_code == 204
    follower.join(30)
    assert not follower.is_alive()
    name, data = got[-1]
    assert name == "error" and data["error"]["code"] == "session_closed", got


def test_a_follower_that_leaves_costs_nothing(api, core):
    s = Session(api)
    _, var = s.ask("Describe a forest in detail.", max_tokens=48, ignore_eos=True)
    first = s.stream(var, stop_after=1)
    assert first[0][0] == "delta"
    assert no_followers(core, s.sid)  # its follower count went back to zero
    assert s.get(var)["ready"]  # the generation went on to its end
    assert final(s.stream(var))[0] == "value"


def no_followers(core: ServeCore, session_id: str) -> bool:
    """Whether the session's followers are all gone (the server sees a client leave at its
    next write or keep-alive)."""
    deadline = time.monotonic() + 20
    while session_id in core.streams._per_session and time.monotonic() < deadline:
        time.sleep(0.05)
    return session_id not in core.streams._per_session


def test_followers_are_bounded_per_variable_and_per_session(api, core):
    s = Session(api)
    _, var = s.ask("Write a long essay about rivers.", max_tokens=120, ignore_eos=True)
    _, other = s.ask("Write a long essay about lakes.", max_tokens=120, ignore_eos=True)
    url = f"/v1/semantic_var/{var}/stream"
    params = {"session_id": s.sid}
    with (
        connect_sse(api, "GET", url, params=params, headers=s.auth) as one,
        connect_sse(api, "GET", url, params=params, headers=s.auth) as two,
    ):
        assert one.response.status_code == two.response.status_code == 200
        three = api.get(url, params=params, headers=s.auth)
        assert three.status_code == 429
        assert "--max-subscribers-per-var" in three.json()["error"]["message"]
        other_url = f"/v1/semantic_var/{other}/stream"
        with connect_sse(api, "GET", other_url, params=params, headers=s.auth) as four:
            assert four.response.status_code == 200
            five = api.get(other_url, params=params, headers=s.auth)
            assert five.status_code == 429
            assert "--max-subscribers-per-session" in five.json()["error"]["message"]
    # once they left, there is room again
    assert no_followers(core, s.sid)
    assert final(s.stream(var))[0] == "value"


def test_bad_stream_requests(api):
    s = Session(api)
    _, var = s.ask("Hi.", max_tokens=4)
    r = api.get("/v1/semantic_var/var-nope/stream", params={"session_id": s.sid}, headers=s.auth)
    assert r.status_code == 404 and "var-nope" in r.json()["error"]["message"]
    r = api.get(f"/v1/semantic_var/{var}/stream", params={"session_id": s.sid})
    assert r.status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert (
        api.get(f"/v1/semantic_var/{var}/stream", params={"session_id": s.sid}, headers=bad).status_code
        == 403
    )
    r = api.get(
        f"/v1/semantic_var/{var}/stream", params={"session_id": s.sid, "criteria": "soon"}, headers=s.auth
    )
    assert r.status_code == 400 and "criteria" in r.json()["error"]["message"]
    assert api.get("/healthz").status_code == 200


def test_first_token_times_of_semantic_calls(api):
    before = _ttft_count(api)
    s = Session(api)
    _, var = s.ask("Name three colors.", max_tokens=12)
    s.get(var)
    timings = s.info()["calls"][0]["timings"]
    assert (
        timings["submitted_at"]
        <= timings["started_at"]
        <= timings["first_token_at"]
        <= timings["finished_at"]
    )
    dag = api.get(f"/v1/session/{s.sid}/dag", headers=s.auth).json()
    assert dag["calls"][0]["timings"]["first_token_at"] == timings["first_token_at"]
    assert _ttft_count(api) > before  # the histogram counts semantic calls too


def _ttft_count(api: httpx.Client) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("parrot:time_to_first_token_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no time-to-first-token histogram")


def test_an_openai_engine_streams_from_its_backend(tmp_path, engine_server):
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    with (
        ServerThread(create_app(core, admin_token="admin")) as server,
        httpx.Client(base_url=server.url, timeout=120) as api,
    ):
        model = httpx.get(f"{engine_server.url}/v1/models").json()["data"][0]["id"]
        body = {"kind": "openai", "base_url": f"{engine_server.url}/v1", "model": model, "api": "completions"}
        assert api.post("/v1/engines", json=body, headers=ADMIN).status_code == 201
        s = Session(api)
        _, var = s.ask("Write a short poem about the moon.", max_tokens=32, ignore_eos=True)
        events = s.stream(var)
        name, data = final(events)
        assert name == "value" and len(events) >= 3  # deltas came one by one from the backend
        assert joined(events) == data["value"] == s.get(var)["value"]
