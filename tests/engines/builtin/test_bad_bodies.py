"""The builtin engine's server answers bodies it cannot read with a clear 4xx on every JSON
route (issue 14, items 5 and 7): nested 10^4 deep, invalid UTF-8, or not sent as JSON."""

from __future__ import annotations

from bad_bodies import assert_bad_bodies_rejected, assert_error


def test_every_json_route_rejects_deep_nesting_bad_utf8_and_non_json_types(client):
    routes = assert_bad_bodies_rejected(client, lambda _: {}, "/ping")
    assert routes >= 9  # fill, generate(_stream), free_context, abort, render_chat, tokenize, 2 OpenAI


def test_a_valid_fill_sent_as_text_plain_is_refused(client, ids):
    cid = next(ids)
    body = b'{"context_id": %d, "token_ids": [1, 2, 3]}' % cid
    r = client.post("/fill", content=body, headers={"content-type": "text/plain"})
    assert_error(r, 415, "Content-Type: application/json")
    # nothing was filled: the context does not exist
    r = client.post("/generate", json={"context_id": cid, "sampling": {"max_tokens": 1}})
    assert_error(r, 404, "does not exist")
    r = client.post("/fill", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    client.post("/free_context", json={"context_id": cid})
