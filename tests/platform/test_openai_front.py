"""The ServeCore's OpenAI-compatible API with the real ``openai`` client: plain and
streaming completions and chat, one shared system prompt held once, keys, bad requests."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from conftest import ServerThread, assert_event_streams

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url

SYSTEM = "You are the harbour master's assistant. Answer briefly and name the tide tables. " * 24


@pytest.fixture(scope="module")
def front(engine_server, tmp_path_factory):
    core = ServeCore(store=Store(sqlite_url(tmp_path_factory.mktemp("front-db"))))
    app = create_app(core, engine_urls=(engine_server.url,))
    with ServerThread(app) as server:
        yield server, core


@pytest.fixture(scope="module")
def oai(front):
    server, _ = front
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def model_name(oai) -> str:
    (model,) = [m.id for m in oai.models.list().data]
    return model


def test_completions_match_the_engine_and_stream_the_same_text(oai, engine_server):
    model = model_name(oai)
    prompt = "The three primary colors are"
    ours = oai.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    with openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key="x") as direct:
        theirs = direct.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    assert ours.choices[0].text == theirs.choices[0].text and ours.choices[0].text
    assert ours.usage.completion_tokens == 8 and ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    chunks = list(
        oai.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ours.choices[0].text
    assert chunks[-1].usage.completion_tokens == 8


def test_chat_plain_and_streaming(oai):
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Sky color?"},
    ]
    plain = oai.chat.completions.create(model=model_name(oai), messages=messages, max_tokens=6, temperature=0)
    text = plain.choices[0].message.content
    assert text and plain.choices[0].message.role == "assistant" and plain.usage.total_tokens > 6
    stream = oai.chat.completions.create(
        messages=messages, model=model_name(oai), max_tokens=6, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    several = oai.chat.completions.create(
        model=model_name(oai), messages=messages, max_tokens=4, temperature=1.0, seed=3, n=3
    )
    assert [c.index for c in several.choices] == [0, 1, 2]


def test_sixteen_chats_with_one_system_prompt_hold_it_once(front, engine_server):
    """Acceptance 3 (issue 6): 16 concurrent chat requests, one long system prompt."""
    server, core = front
    engine = httpx.Client(base_url=engine_server.url, timeout=60)
    before = engine.get("/ping").json()["kv_blocks_used"]

    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
            model = (await client.models.list()).data[0].id
            answers = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=model,
                        messages=[
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"Question {n}: when is high tide at pier {n}?"},
                        ],
                        max_tokens=4,
                        temperature=0,
                    )
                    for n in range(16)
                )
            )
            return [a.choices[0].message.content for a in answers]

    answers = asyncio.run(ask_all())
    assert len(answers) == 16 and all(answers)
    held = engine.get("/ping").json()["kv_blocks_used"] - before
    system_tokens = len(engine.post("/tokenize", json={"text": SYSTEM}).json()["token_ids"])
    system_blocks = system_tokens // 16
    assert system_blocks >= 20
    # The system prompt once, plus a few blocks of each request's own (not 16 copies of it).
    assert held <= system_blocks + 16 * 4 < 16 * system_blocks, (held, system_blocks)
    # One context shared by every session ends at the system message; every request forked it.
    (slot,) = core.engines.slots()
    (system_piece, _) = engine.post(
        "/render_chat",
        json={"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}]},
    ).json()["pieces"]
    length = len(engine.post("/tokenize", json={"text": system_piece}).json()["token_ids"])
    shared = [c for c in core.contexts.tree(slot).contexts.values() if c.owner is None and c.length == length]
    assert len(shared) == 1
    assert core.views.stats().reused_tokens >= 15 * (length - 1)
    engine.close()


@pytest.mark.parametrize(
    ("route", "body", "status", "message"),
    [
        ("/v1/completions", {"prompt": ""}, 400, "empty"),
        ("/v1/completions", {"prompt": [1, 2, 3]}, 400, "token ids"),
        ("/v1/completions", {"prompt": "x", "logprobs": 2}, 400, "logprobs"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "not served"),
        ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "temperature": 50},
            400,
            "temperature",
        ),
    ],
)
def test_bad_requests_get_4xx(front, route, body, status, message):
    server, _ = front
    r = httpx.post(f"{server.url}{route}", json=body, timeout=60)
    assert r.status_code == status and message in r.json()["error"]["message"], r.text
    assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"


def test_api_keys_guard_the_front_when_configured(engine_server):
    app = create_app(ServeCore(), engine_urls=(engine_server.url,), openai_api_keys=("k-1", "k-2"))
    with ServerThread(app) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="k-2", max_retries=0) as good:
            assert good.models.list().data
        bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
        with bad, pytest.raises(openai.PermissionDeniedError):
            bad.models.list()
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        # The Parrot API itself does not take these keys: sessions have their own auth.
        assert httpx.post(f"{server.url}/v1/session").status_code == 201


def test_streams_are_labelled_event_streams(front, oai):
    assert_event_streams(front[0].url, model_name(oai))


def test_a_client_that_gives_up_stops_its_generation(front, engine_server):
    """Issue 14 item 3 through the ServeCore: a plain completion whose client gave up kept
    the engine generating all its tokens for nobody."""
    server, _ = front

    def engine_stats() -> dict:
        return httpx.get(f"{engine_server.url}/ping", timeout=10).json()

    before = engine_stats()["tokens_generated"]
    body = {"prompt": "Tell me a very long story.", "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):  # 300 tokens never come back in half a second
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.5)
    deadline = time.monotonic() + 30
    # On a loaded machine the request may still be queued on the engine when the client
    # gives up: wait until it is neither running nor waiting, then count what it generated.
    while time.monotonic() < deadline:
        stats = engine_stats()
        if not stats["num_running"] and not stats["num_waiting"]:
            break
        time.sleep(0.1)
    stats = engine_stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["tokens_generated"] - before < 150
