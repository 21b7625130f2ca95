"""Every bad input gets a 4xx with a message that says what was wrong; the engine keeps serving."""

from __future__ import annotations

import pytest

PROMPT = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"


def assert_error(r, status: int, *fragments: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    message = body["error"]["message"]
    for fragment in fragments:
        assert fragment in message, message


@pytest.fixture
def healthy(client, ids):
    """After each bad request, a normal fill + generate still works."""
    yield
    cid = next(ids)
    assert client.post("/fill", json={"context_id": cid, "text": PROMPT}).status_code == 200
    r = client.post("/generate", json={"context_id": cid, "sampling": {"max_tokens": 3}})
    assert r.status_code == 200 and len(r.json()["token_ids"]) >= 1
    client.post("/free_context", json={"context_id": cid})


@pytest.fixture
def filled(client, ids):
    cid = next(ids)
    assert client.post("/fill", json={"context_id": cid, "text": PROMPT}).status_code == 200
    yield cid
    client.post("/free_context", json={"context_id": cid})


def test_generate_on_unknown_context(client, healthy):
    r = client.post("/generate", json={"context_id": 987654321, "sampling": {"max_tokens": 4}})
    assert_error(r, 404, "context 987654321 does not exist")


def test_unknown_parent(client, healthy, ids):
    r = client.post("/fill", json={"context_id": next(ids), "parent_context_id": 123456789, "token_ids": [1]})
    assert_error(r, 404, "parent context 123456789 does not exist")


def test_existing_context_with_another_parent(client, healthy, filled, ids):
    other = next(ids)
    client.post("/fill", json={"context_id": other, "token_ids": [5, 6]})
    r = client.post("/fill", json={"context_id": filled, "parent_context_id": other, "token_ids": [1]})
    assert_error(r, 409, f"context {filled} already exists")
    client.post("/free_context", json={"context_id": other})


def test_empty_token_list(client, healthy, ids):
    assert_error(
        client.post("/fill", json={"context_id": next(ids), "token_ids": []}), 400, "at least one token"
    )
    assert_error(client.post("/fill", json={"context_id": next(ids), "text": ""}), 400, "at least one token")


def test_token_and_text_together_or_neither(client, healthy, ids):
    r = client.post("/fill", json={"context_id": next(ids), "token_ids": [1], "text": "a"})
    assert_error(r, 400, "exactly one of token_ids or text")
    assert_error(
        client.post("/fill", json={"context_id": next(ids)}), 400, "exactly one of token_ids or text"
    )


def test_token_outside_vocabulary(client, healthy, ids):
    r = client.post("/fill", json={"context_id": next(ids), "token_ids": [1, 49152]})
    assert_error(r, 400, "token id 49152 is outside the vocabulary")
    r = client.post("/fill", json={"context_id": next(ids), "token_ids": [-1]})
    assert_error(r, 400, "token id -1")


def test_prompt_plus_max_tokens_over_context_length(client, healthy, filled):
    r = client.post("/generate", json={"context_id": filled, "sampling": {"max_tokens": 9000}})
    assert_error(r, 400, "over the model's context length of 8192")


def test_more_kv_than_the_cache_can_hold(client, healthy, ids):
    capacity = client.get("/ping").json()["kv_blocks_total"] * 16
    assert capacity < 8192  # the test engine's cache is smaller than the model's context
    r = client.post("/fill", json={"context_id": next(ids), "token_ids": [5] * (capacity + 1)})
    assert_error(r, 400, "more than the whole cache holds")


def test_malformed_json(client, healthy):
    r = client.post(
        "/fill", content=b'{"context_id": 1, "token_ids": [1,', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"]


def test_wrong_types(client, healthy):
    r = client.post("/fill", json={"context_id": "seven", "token_ids": [1]})
    assert_error(r, 400, "context_id")
    r = client.post("/fill", json={"context_id": 1, "token_ids": [1], "bogus": True})
    assert_error(r, 400, "bogus")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", 1e9),
        ("top_p", 0),
        ("top_p", 5),
        ("top_k", -3),
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("presence_penalty", 7),
        ("frequency_penalty", -9),
        ("repetition_penalty", 0),
        ("seed", -1),
    ],
)
def test_absurd_sampling_values(client, healthy, filled, field, value):
    r = client.post("/generate", json={"context_id": filled, "sampling": {field: value}})
    assert_error(r, 400, field)


def test_generate_on_empty_fork_of_nothing_is_rejected(client, healthy, ids):
    r = client.post("/generate_stream", json={"context_id": next(ids), "sampling": {"max_tokens": 2}})
    assert_error(r, 404, "does not exist")


def test_unknown_route_and_method(client, healthy):
    assert client.get("/nope").status_code == 404
    assert client.get("/fill").status_code == 405
