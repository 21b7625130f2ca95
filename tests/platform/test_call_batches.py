"""``POST /v1/semantic_calls``: a DAG of calls in one request (outputs of earlier calls of
the batch as inputs), a session made by the batch, the answer streamed in the same
request and the session closed after it; refused batches leave nothing behind. On the
fake engine (the same route on the real engine: tests/sdk/test_pipeline.py)."""

from __future__ import annotations

import itertools
import json
import re

import httpx
import pytest
from httpx_sse import connect_sse
from rest import api_on_fake_engine, new_session, out  # noqa: F401  (the api fixture)


def chain(n: int) -> list[dict]:
    """``n`` calls, each reading the previous one's output."""
    calls = [{"template": "Start: {{a}}", "parameters": [out("a", 4)]}]
    for k in range(1, n):
        ref = {"call": k - 1, "output": "a"}
        calls.append(
            {
                "template": "Given {{prev}} go on: {{a}}",
                "parameters": [{"name": "prev", "output_of": ref}, out("a", 4)],
            }
        )
    return calls


def live_sessions(api: httpx.Client) -> int:
    found = re.search(r"^parrot:num_sessions (\S+)$", api.get("/metrics").text, re.M)
    assert found, "the metrics name the live sessions"
    return int(float(found.group(1)))


def streamed(api: httpx.Client, body: dict) -> list[tuple[str, dict]]:
    """The events of a batch answered as a stream (201, ``text/event-stream``)."""
    with connect_sse(api, "POST", "/v1/semantic_calls", json=body) as source:
        assert source.response.status_code == 201, source.response.read()
        return [(event.event, json.loads(event.data)) for event in source.iter_sse()]


def test_a_batch_opens_a_session_and_links_its_calls(api):
    r = api.post("/v1/semantic_calls", json={"calls": chain(3)})
    assert r.status_code == 201, r.text
    body = r.json()
    auth = {"Authorization": f"Bearer {body['session_auth']}"}
    sid = body["session_id"]
    calls = body["calls"]
    assert len(calls) == 3
    # The second call reads the first one's output variable, the third the second's.
    for before, after in itertools.pairwise(calls):
        (prev,) = [p for p in after["param_info"] if p["name"] == "prev"]
        assert prev["var_id"] == before["outputs"]["a"]
    last = calls[-1]["outputs"]["a"]
    got = api.get(f"/v1/semantic_var/{last}", params={"session_id": sid}, headers=auth)
    assert got.status_code == 200 and got.json()["value"]
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert [c["call_id"] for c in info["calls"]] == [c["call_id"] for c in calls]
    assert all(c["state"] == "done" for c in info["calls"])
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204


def test_a_batch_in_an_existing_session(api):
    sid, auth = new_session(api)
    topic = api.post(
        "/v1/semantic_var", json={"session_id": sid, "name": "t", "value": "tides"}, headers=auth
    )
    calls = chain(2)
    calls[0] = {
        "template": "About {{t}}: {{a}}",
        "parameters": [{"name": "t", "var_id": topic.json()["var_id"]}, out("a", 4)],
    }
    r = api.post("/v1/semantic_calls", json={"session_id": sid, "calls": calls}, headers=auth)
    assert r.status_code == 201, r.text
    assert r.json()["session_id"] == sid and "session_auth" not in r.json()
    # Without the session's auth: refused as every session route refuses it.
    refused = api.post("/v1/semantic_calls", json={"session_id": sid, "calls": calls})
    assert refused.status_code == 401
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204


def test_the_answer_streamed_in_the_same_request_and_the_session_closed(api):
    before = live_sessions(api)
    body = {"calls": chain(3), "stream": {"call": 2, "output": "a"}, "close": True}
    got = streamed(api, body)
    assert got[0][0] == "submitted" and len(got[0][1]["calls"]) == 3
    assert got[-1][0] == "value"
    deltas = "".join(e["delta"] for name, e in got if name == "delta")
    assert deltas == got[-1][1]["value"] and deltas
    assert live_sessions(api) == before  # closed by the same request
    sid, auth = got[0][1]["session_id"], {"Authorization": f"Bearer {got[0][1]['session_auth']}"}
    assert api.get(f"/v1/session/{sid}", headers=auth).status_code == 404


def test_without_deltas_the_stream_is_the_value_alone(api):
    with_deltas = streamed(api, {"calls": chain(2), "stream": {"call": 1, "output": "a"}, "close": True})
    body = {"calls": chain(2), "stream": {"call": 1, "output": "a"}, "close": True, "deltas": False}
    got = streamed(api, body)
    assert [name for name, _ in got] == ["submitted", "value"]
    assert any(name == "delta" for name, _ in with_deltas)  # the same batch streams its pieces
    assert got[-1][1]["value"] == with_deltas[-1][1]["value"] and got[-1][1]["finish_reason"]


def test_streamed_without_close_the_session_stays(api):
    body = {"calls": chain(1), "stream": {"call": 0, "output": "a"}}
    submitted = streamed(api, body)[0][1]
    auth = {"Authorization": f"Bearer {submitted['session_auth']}"}
    info = api.get(f"/v1/session/{submitted['session_id']}", headers=auth)
    assert info.status_code == 200 and info.json()["calls"][0]["state"] == "done"
    assert api.delete(f"/v1/session/{submitted['session_id']}", headers=auth).status_code == 204


BAD_BATCHES = [
    (
        "a forward reference",
        [
            {
                "template": "{{x}} {{a}}",
                "parameters": [{"name": "x", "output_of": {"call": 1, "output": "a"}}, out("a")],
            }
        ],
        "call 0 of the batch: output_of call 1",
    ),
    (
        "an output the call does not have",
        [
            *chain(1),
            {
                "template": "{{x}} {{a}}",
                "parameters": [{"name": "x", "output_of": {"call": 0, "output": "b"}}, out("a")],
            },
        ],
        "call 1 of the batch: output_of call 0: it has no output 'b'",
    ),
    (
        "a bad template after good calls",
        [*chain(2), {"template": "{{a}}", "parameters": [out("a")]}],
        "call 2 of the batch",
    ),
    (
        "an input with two bindings",
        [
            *chain(1),
            {
                "template": "x {{x}} {{a}}",
                "parameters": [
                    {"name": "x", "value": "v", "output_of": {"call": 0, "output": "a"}},
                    out("a"),
                ],
            },
        ],
        "give one of var_id, value and output_of",
    ),
]


@pytest.mark.parametrize(("calls", "message"), [b[1:] for b in BAD_BATCHES], ids=[b[0] for b in BAD_BATCHES])
def test_a_refused_batch_leaves_nothing_behind(api, calls, message):
    before = live_sessions(api)
    r = api.post("/v1/semantic_calls", json={"calls": calls})
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert live_sessions(api) == before  # the session the batch would have opened is gone
    sid, auth = new_session(api)
    r = api.post("/v1/semantic_calls", json={"session_id": sid, "calls": calls}, headers=auth)
    assert r.status_code == 400
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert info["calls"] == [] and info["vars"] == []  # no call of the batch was accepted
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204


BAD_BODIES = [
    ("close without stream", {"calls": chain(1), "close": True}, "give 'stream'"),
    ("deltas without stream", {"calls": chain(1), "deltas": False}, "'deltas' is about the streamed"),
    ("stream of no call", {"calls": chain(1), "stream": {"call": 3, "output": "a"}}, "no call 3"),
    ("stream of no output", {"calls": chain(1), "stream": {"call": 0, "output": "z"}}, "no output 'z'"),
    ("no calls", {"calls": []}, "calls"),
    ("a negative call", {"calls": chain(1), "stream": {"call": -1, "output": "a"}}, "stream.call"),
]


@pytest.mark.parametrize(("body", "message"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_batch_bodies(api, body, message):
    before = live_sessions(api)
    r = api.post("/v1/semantic_calls", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert live_sessions(api) == before


def test_output_of_is_for_batches_only(api):
    sid, auth = new_session(api)
    body = {
        "session_id": sid,
        "template": "{{x}} {{a}}",
        "parameters": [{"name": "x", "output_of": {"call": 0, "output": "a"}}, out("a")],
    }
    r = api.post("/v1/semantic_call", json=body, headers=auth)
    assert r.status_code == 400 and "POST /v1/semantic_calls" in r.json()["error"]["message"]
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204
