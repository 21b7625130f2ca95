"""Engine API for a ServeCore: forks at any length, prompt tail + generation in one request,
checkpoints, priorities and abort, on the real default model."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from waiting import until

PROMPT = "<|im_start|>user\nName three birds that live near the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def ids(ids, client):
    """Context ids for one test; every context made with them is freed after it (the engine
    is shared by the whole test session)."""
    yield from freed_after(ids, client)


def freed_after(ids, client: httpx.Client):
    """The body of an ``ids`` fixture (see above)."""
    made: list[int] = []

    class Ids:
        def __next__(self) -> int:
            made.append(next(ids))
            return made[-1]

    yield Ids()
    client.post("/abort", json={"context_ids": made})


def greedy(max_tokens: int = 12, **extra) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}


def tokenize(client: httpx.Client, text: str) -> list[int]:
    return client.post("/tokenize", json={"text": text}).json()["token_ids"]


def generate(client: httpx.Client, **body) -> dict:
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def alone(client: httpx.Client, ids, tokens: list[int], max_tokens: int = 12) -> dict:
    """The reference: the whole prompt filled into a fresh context, then generated."""
    cid = next(ids)
    return generate(
        client, context_id=cid, parent_context_id=None, token_ids=tokens, sampling=greedy(max_tokens)
    )


def test_generate_fills_its_prompt_tail_in_the_same_request(client, ids):
    tokens = tokenize(client, PROMPT)
    root = next(ids)
    assert client.post("/fill", json={"context_id": root, "token_ids": tokens[:10]}).status_code == 200
    child = generate(
        client, context_id=next(ids), parent_context_id=root, token_ids=tokens[10:], sampling=greedy()
    )
    two_requests = next(ids)
    client.post("/fill", json={"context_id": two_requests, "token_ids": tokens})
    ref = generate(client, context_id=two_requests, sampling=greedy())
    assert child["token_ids"] == ref["token_ids"] and child["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize("cut", [5, 16, 17, 32])  # inside a block, on a block edge, after it
def test_fork_at_a_length_sees_only_that_prefix(client, ids, cut):
    tokens = tokenize(client, PROMPT * 2)
    long_ctx = next(ids)
    # The parent holds the prompt and text after it that the fork must not see.
    client.post(
        "/fill", json={"context_id": long_ctx, "token_ids": tokens + tokenize(client, "Gulls, terns")}
    )
    forked = generate(
        client,
        context_id=next(ids),
        parent_context_id=long_ctx,
        parent_len=cut,
        token_ids=tokens[cut:],
        sampling=greedy(),
    )
    assert forked["token_ids"] == alone(client, ids, tokens)["token_ids"]


def test_fork_of_a_whole_prefix_without_tail_recomputes_its_last_token(client, ids):
    """Generating right at a fork point needs that token's hidden state, which the parent
    does not keep for a prefix: the fork computes it again (copying a shared block first)."""
    tokens = tokenize(client, PROMPT) + [28, 29, 30] * 8
    parent = next(ids)
    client.post("/fill", json={"context_id": parent, "token_ids": tokens})
    for cut in (21, 32):  # any length, on a block edge too
        got = generate(
            client, context_id=next(ids), parent_context_id=parent, parent_len=cut, sampling=greedy()
        )
        assert got["token_ids"] == alone(client, ids, tokens[:cut])["token_ids"]
    # The parent's blocks were not touched: it still generates what it did.
    reference = alone(client, ids, tokens)["token_ids"]
    assert generate(client, context_id=parent, sampling=greedy())["token_ids"] == reference


def test_fork_from_a_parent_that_is_still_running(client, ids, engine_server):
    """A fork at a length waits only until those tokens are computed, not for the parent's
    whole job: it can join while the parent still generates."""
    tokens = tokenize(client, PROMPT)
    parent = next(ids)
    result: dict = {}

    def long_generation() -> None:
        with httpx.Client(base_url=engine_server.url, timeout=120) as c:
            result["parent"] = generate(
                c, context_id=parent, parent_context_id=None, token_ids=tokens, sampling=greedy(120)
            )

    thread = threading.Thread(target=long_generation)
    thread.start()
    try:
        while client.get("/ping").json()["num_running"] == 0:
            pass
        child = generate(
            client,
            context_id=next(ids),
            parent_context_id=parent,
            parent_len=len(tokens) - 3,
            token_ids=tokens[-3:],
            sampling=greedy(4),
        )
        assert "parent" not in result, "the fork waited for the parent's whole generation"
    finally:
        thread.join()
    assert child["token_ids"] == result["parent"]["token_ids"][:4]


def test_checkpoints_keep_prefixes_as_contexts_that_share_blocks(client, ids):
    tokens = tokenize(client, PROMPT * 2 + "Gulls, terns and puffins.")
    cp_a, cp_b, main = next(ids), next(ids), next(ids)
    before = client.get("/ping").json()
    generate(
        client,
        context_id=main,
        parent_context_id=None,
        token_ids=tokens,
        sampling=greedy(4),
        checkpoints=[{"context_id": cp_a, "length": 32}, {"context_id": cp_b, "length": 21}],
    )
    after = client.get("/ping").json()
    # Two more contexts, sharing the full blocks: only the partial one of cp_b is a copy.
    assert after["num_contexts"] == before["num_contexts"] + 3
    assert after["kv_blocks_used"] - before["kv_blocks_used"] <= -(-(len(tokens) + 4) // 16) + 1
    # Each checkpoint is a context of exactly its length that forks like any other.
    for cp, length in ((cp_a, 32), (cp_b, 21)):
        got = generate(
            client, context_id=next(ids), parent_context_id=cp, token_ids=tokens[length:], sampling=greedy()
        )
        assert got["token_ids"] == alone(client, ids, tokens)["token_ids"]
        assert client.post("/free_context", json={"context_id": cp}).json()["freed_tokens"] == length
    client.post("/free_context", json={"context_id": main})


def test_a_checkpoint_is_forked_as_soon_as_its_prefix_is_computed(client, ids, engine_server, engine_config):
    """A prompt chunked over three steps with a checkpoint inside its first chunk: a fork of
    the checkpoint sent with it (users behind one long system prompt) runs in the second
    step, while the rest of the prompt is computed, and answers before the prompt's own
    request (it used to wait for the whole prompt: a step later, after it)."""
    budget = engine_config.scheduler.max_batched_tokens
    tokens = tokenize(client, "A long report on the harbour lights. " * 300)[: 3 * budget - 100]
    cp, main, child = next(ids), next(ids), next(ids)
    tail = tokenize(client, " So, what is it about?")
    finished: list[str] = []

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=engine_server.url, timeout=120) as c:

            async def post(name: str, body: dict) -> None:
                r = await c.post("/generate", json=body)
                assert r.status_code == 200, r.text
                finished.append(name)

            checkpoints = [{"context_id": cp, "length": budget // 2}]
            await asyncio.gather(
                post("prompt", {"context_id": main, "token_ids": tokens, "checkpoints": checkpoints,
                                "sampling": greedy(1)}),
                # (with its length: a fork that arrives before its parent waits for it, as the
                # ServeCore's do; without it, it was refused when it came first: CI once)
                post("fork", {"context_id": child, "parent_context_id": cp, "parent_len": budget // 2,
                              "token_ids": tail, "parent_timeout_ms": 30_000, "priority": 1,
                              "sampling": greedy(1)}),
            )  # fmt: skip

    asyncio.run(scenario())
    assert finished == ["fork", "prompt"]


def test_checkpoints_of_a_failed_job_are_never_made(client, ids):
    cp = next(ids)
    r = client.post(
        "/generate",
        json={
            "context_id": next(ids),
            "parent_context_id": 999_999_123,  # unknown: the request fails
            "token_ids": [1, 2, 3],
            "checkpoints": [{"context_id": cp, "length": 2}],
            "sampling": greedy(),
        },
    )
    assert r.status_code == 404
    assert client.post("/free_context", json={"context_id": cp}).json()["freed_tokens"] == 0


def test_abort_stops_running_and_queued_jobs_and_frees_their_contexts(client, ids, engine_server):
    tokens = tokenize(client, PROMPT)
    running, queued = next(ids), next(ids)

    async def scenario() -> list:
        async with httpx.AsyncClient(base_url=engine_server.url, timeout=120) as c:
            body = {"parent_context_id": None, "token_ids": tokens, "sampling": greedy(400)}
            jobs = [
                asyncio.create_task(c.post("/generate", json={"context_id": cid, **body}))
                for cid in (running, queued)
            ]
            await until(lambda: jobs_running(c), what="a job running")
            r = await c.post("/abort", json={"context_ids": [running, queued, next(ids)]})
            assert r.status_code == 200 and r.json() == {"aborted_jobs": 2, "freed_contexts": 2}
            return await asyncio.gather(*jobs)

    for response in asyncio.run(scenario()):
        assert response.status_code == 409 and response.json()["error"]["code"] == "aborted"
    assert client.post("/free_context", json={"context_id": running}).json()["freed_tokens"] == 0
    assert client.get("/ping").json()["num_running"] == 0


async def jobs_running(c: httpx.AsyncClient) -> bool:
    return (await c.get("/ping")).json()["num_running"] > 0


def test_higher_priority_jobs_are_admitted_first(engine):
    """With every slot taken, a waiting job of priority 1 runs before older ones of 0."""
    from parrot.engines.builtin.jobs import Job, JobKind
    from parrot.engines.builtin.local_scheduler import LocalScheduler, SchedulerConfig

    class Ctx:  # only what the queue looks at
        busy = False
        parent = None

    sched = LocalScheduler(SchedulerConfig(), engine.core.pool)
    jobs = [Job(JobKind.FILL, Ctx(), None, seq, priority=p) for seq, p in enumerate([0, 0, 1, 0, 1])]
    for job in jobs:
        sched.add(job)
    assert [j.seq for j in sched.waiting] == [2, 4, 0, 1, 3]


def test_a_fork_after_a_partial_block_adopts_cached_blocks(client, ids):
    """A prompt forked from a parent whose last block is partial reuses the blocks that the
    same tokens left in the prefix cache (before, such a fork recomputed them)."""
    tokens = tokenize(client, PROMPT * 4)  # > 3 blocks
    first = alone(client, ids, tokens)  # leaves its full blocks in the prefix cache
    parent = next(ids)
    client.post("/fill", json={"context_id": parent, "token_ids": tokens[:21]})  # 1 block + 5
    got = generate(
        client, context_id=next(ids), parent_context_id=parent, token_ids=tokens[21:], sampling=greedy()
    )
    assert got["token_ids"] == first["token_ids"]
    assert got["cached_tokens"] >= (len(tokens) // 16 - 1) * 16 - 21


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"parent_len": 3, "token_ids": [1]}, 400, "parent_len needs parent_context_id"),
        ({"parent_context_id": "FILLED", "parent_len": 10_000, "token_ids": [1]}, 400, "cannot fork"),
        ({"parent_context_id": "FILLED", "parent_len": 0, "token_ids": [1]}, 400, "parent_len"),
        ({"token_ids": [1, 2], "checkpoints": [{"context_id": "SELF", "length": 1}]}, 409, "already exists"),
        (
            {"token_ids": [1, 2], "checkpoints": [{"context_id": "NEW", "length": 3}]},
            400,
            "outside the prompt",
        ),
        ({"token_ids": [1], "text": "x"}, 400, "not both"),
        ({"token_ids": [1], "priority": 99}, 400, "priority"),
    ],
)
def test_bad_fork_and_checkpoint_requests(client, ids, body, status, words):
    filled = next(ids)
    client.post("/fill", json={"context_id": filled, "token_ids": [5, 6, 7]})
    target = next(ids)
    subst = {"FILLED": filled, "SELF": target, "NEW": next(ids)}
    body = {k: subst.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    if "checkpoints" in body:
        body["checkpoints"] = [{**c, "context_id": subst[c["context_id"]]} for c in body["checkpoints"]]
    body.setdefault("parent_context_id", None)
    r = client.post("/generate", json={"context_id": target, "sampling": greedy(), **body})
    assert r.status_code == status, r.text
    assert words in r.text
    assert client.get("/ping").status_code == 200
    assert client.post("/free_context", json={"context_id": target}).json()["freed_tokens"] == 0


def test_a_fork_may_arrive_before_its_parent(client, ids, engine_server):
    """A ServeCore pipelines dependent requests: a fork that reaches the engine before the
    request creating its parent waits for it (up to ``parent_timeout_ms``)."""
    tokens = tokenize(client, PROMPT)
    parent, child = next(ids), next(ids)

    async def scenario() -> list:
        async with httpx.AsyncClient(base_url=engine_server.url, timeout=120) as c:
            fork = asyncio.create_task(
                c.post(
                    "/generate",
                    json={
                        "context_id": child,
                        "parent_context_id": parent,
                        "parent_len": len(tokens) - 2,
                        "parent_timeout_ms": 20_000,
                        "token_ids": tokens[-2:],
                        "sampling": greedy(),
                    },
                )
            )
            # the fork is parked on the engine: its job waits for the parent
            await until(lambda: jobs_waiting(c), what="the fork parked on the engine")
            assert not fork.done()
            made = await c.post("/fill", json={"context_id": parent, "token_ids": tokens})
            return [made, await fork]

    made, forked = asyncio.run(scenario())
    assert made.status_code == forked.status_code == 200, forked.text
    assert forked.json()["token_ids"] == alone(client, ids, tokens)["token_ids"]


async def jobs_waiting(c: httpx.AsyncClient) -> bool:
    return (await c.get("/ping")).json()["num_waiting"] > 0


def test_a_parent_that_never_comes_fails_the_fork_after_its_wait(client, ids):
    body = {"context_id": next(ids), "parent_context_id": 987_654_321, "parent_len": 3, "token_ids": [1]}
    r = client.post("/generate", json={**body, "sampling": greedy()})  # no wait: at once
    assert r.status_code == 404 and "does not exist" in r.text
    r = client.post(
        "/generate", json={**body, "context_id": next(ids), "parent_timeout_ms": 300, "sampling": greedy()}
    )
    assert r.status_code == 404 and "does not exist" in r.text
    assert client.get("/ping").json()["num_waiting"] == 0
