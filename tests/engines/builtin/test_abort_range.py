"""``POST /abort_range``: what a restarted ServeCore uses to free the contexts its killed run
left (each run's ids lie in a range of their own); contexts outside the range stay."""

from __future__ import annotations

REGION = 7 * 2**48  # a ServeCore run's region (no other test uses it)


def fill(client, context_id: int) -> None:
    r = client.post("/fill", json={"context_id": context_id, "text": "The sea is wide and deep."})
    assert r.status_code == 200, r.text


def test_abort_range_frees_the_contexts_of_the_range_only(client, ids):
    inside = [REGION + 3, REGION + 2**40]
    outside = [next(ids), REGION + 2**48]  # a direct client's id; the next region's first
    for cid in inside + outside:
        fill(client, cid)
    before = client.get("/ping").json()["num_contexts"]
    r = client.post("/abort_range", json={"start": REGION, "end": REGION + 2**48})
    assert r.status_code == 200 and r.json() == {"aborted_jobs": 0, "freed_contexts": 2}
    assert client.get("/ping").json()["num_contexts"] == before - 2
    for cid in inside:
        assert client.post("/free_context", json={"context_id": cid}).json()["freed_tokens"] == 0
    for cid in outside:  # still there (freed now, by this test)
        assert client.post("/free_context", json={"context_id": cid}).json()["freed_tokens"] > 0
    bad = client.post("/abort_range", json={"start": REGION, "end": REGION})
    assert bad.status_code == 400 and "start < end" in bad.json()["error"]["message"]
