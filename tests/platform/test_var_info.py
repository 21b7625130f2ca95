"""What the API says of a variable is true (issue 24, defect 9): the answer of a create or a
``PUT`` carries the value it holds (it said ``"value": null`` for a ready variable), and a
session listing, which never carries values, leaves the field out instead of saying null.
The SDK decodes both."""

from __future__ import annotations

import httpx
import pytest

from parrot.wire.responses import VarSummary


@pytest.fixture
def api(parrot_url):
    with httpx.Client(base_url=parrot_url, timeout=60) as client:
        yield client


def test_a_put_and_a_create_answer_with_the_value_and_a_listing_leaves_it_out(api):
    r = api.post("/v1/session")
    sid, auth = r.json()["session_id"], {"Authorization": f"Bearer {r.json()['session_auth']}"}
    made = api.post("/v1/semantic_var", headers=auth, json={"session_id": sid, "name": "t", "value": "tides"})
    assert made.status_code == 201 and made.json()["ready"] and made.json()["value"] == "tides", made.text
    empty = api.post("/v1/semantic_var", headers=auth, json={"session_id": sid, "name": "later"})
    assert empty.json()["ready"] is False and empty.json()["value"] is None, empty.text
    var_id = empty.json()["var_id"]
    put = api.put(f"/v1/semantic_var/{var_id}", headers=auth, json={"session_id": sid, "value": "glaciers"})
    assert put.status_code == 200, put.text
    assert (put.json()["ready"], put.json()["value"]) == (True, "glaciers"), put.text
    listing = api.get(f"/v1/session/{sid}", headers=auth).json()["vars"]
    assert [(v["name"], v["ready"]) for v in listing] == [("t", True), ("later", True)]
    assert all("value" not in v for v in listing), listing  # not sent: never a false null
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204


def test_the_sdk_decodes_answers_and_listings(parrot):
    session = parrot.session()
    try:
        var = session.var("later")
        var.set("glaciers")
        info = session.info()
        assert [type(v) for v in info.vars] == [VarSummary] and info.vars[0].ready
        assert var.get() == "glaciers"
    finally:
        session.delete()
