"""The engine as `make run` serves it: the default weights on the CPU, the bundled GGUF's own
Q4_1 blocks (and its Q8_0 embedding as the LM head).

The other engine tests share an engine pinned to the exact weights, which they compare
token for token; here the default mode runs the same kinds of work (greedy and sampled
generation, every output format, forks with shared-prefix attention, /v1 routes) and is
held to what it promises: valid outputs, repeatable greedy text, its top tokens close to
the exact model's (test_weight_formats.py bounds its logits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import httpx
import pytest
from test_constrained import FORMATS, SAMPLINGS, generate, matches, params

from parrot.engines.builtin.fused_decode import MAX_ITEM_TOKENS
from parrot.engines.builtin.model.quant import Int4Linear, Int8Linear
from parrot.wire.sampling import SamplingParams

PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
ids = itertools.count(500_000)


@pytest.fixture(scope="module")
def default_engine(engine_config):
    from parrot.engines.builtin.engine import BuiltinEngine

    eng = BuiltinEngine(dataclasses.replace(engine_config, weights="auto"))  # as `parrot engine` does
    eng.check_running()
    yield eng
    asyncio.run(eng.check_integrity())
    eng.stop()


@pytest.fixture(scope="module")
def default_client(default_engine):
    from conftest import ServerThread

    from parrot.engines.builtin.server.app import create_app

    server = ServerThread(create_app(default_engine, manage_engine=False))
    with server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def test_it_runs_the_gguf_blocks(default_engine):
    assert default_engine.config.weights == "gguf"
    assert isinstance(default_engine.model.layers[0].self_attn.qkv_proj, Int4Linear)
    assert isinstance(default_engine.model.packed_head, Int8Linear)  # the GGUF's Q8_0 embedding


def test_greedy_text_is_repeatable_and_starts_as_the_exact_models(default_engine, engine):
    greedy = params(None, 24, temperature=0.0)

    async def twice(eng) -> list[list[int]]:
        return [(await generate(eng, next(ids), greedy, PROMPT)).token_ids for _ in range(2)]

    first, second = asyncio.run(twice(default_engine))
    assert first == second and len(first) > 0
    exact = asyncio.run(twice(engine))[0]
    assert first == exact  # measured: the same 11 tokens ("1. Red\n2. Blue\n3. Green") here


def test_its_decode_steps_run_fused_and_say_what_eager_steps_say(default_engine, engine_config):
    """The fused CPU step (fused_decode.py) decodes; an engine without it, the same tokens."""
    from parrot.engines.builtin.engine import BuiltinEngine

    greedy = params(None, 24, temperature=0.0)
    before = asyncio.run(default_engine.stats())["fused_steps"]
    fused = asyncio.run(generate(default_engine, next(ids), greedy, PROMPT)).token_ids
    # every step after the prompt's (which samples the first token) decodes one token, the
    # last one sampling the end of text, which the reply leaves out; a short prompt's step
    # runs fused too (a few tokens an item: fused_decode.MAX_ITEM_TOKENS)
    short = len(default_engine.tokenize(PROMPT)) <= MAX_ITEM_TOKENS
    assert asyncio.run(default_engine.stats())["fused_steps"] - before == len(fused) + short > 0
    eager_engine = BuiltinEngine(dataclasses.replace(engine_config, weights="auto", fused_decode=False))
    try:
        eager = asyncio.run(generate(eager_engine, next(ids), greedy, PROMPT)).token_ids
        assert asyncio.run(eager_engine.stats())["fused_steps"] == 0
    finally:
        eager_engine.stop()
    assert fused == eager


def test_its_bfloat16_kv_cache_holds_twice_the_tokens_and_says_the_same(default_engine, engine_config):
    """The default's bfloat16 KV cache: the same memory holds twice the blocks of a float32
    cache (--kv-dtype float32), decode steps run fused on both, the greedy text is the same."""
    from parrot.engines.builtin.engine import BuiltinEngine

    greedy = params(None, 24, temperature=0.0)
    got = asyncio.run(generate(default_engine, next(ids), greedy, PROMPT)).token_ids
    stats = asyncio.run(default_engine.stats())
    wide = BuiltinEngine(dataclasses.replace(engine_config, weights="auto", kv_dtype="float32"))
    try:
        before = asyncio.run(wide.stats())["fused_steps"]
        expected = asyncio.run(generate(wide, next(ids), greedy, PROMPT)).token_ids
        wide_stats = asyncio.run(wide.stats())
    finally:
        wide.stop()
    assert (stats["kv_dtype"], wide_stats["kv_dtype"]) == ("bfloat16", "float32")
    blocks = wide_stats["kv_blocks_total"]
    assert stats["kv_blocks_total"] in (2 * blocks, 2 * blocks + 1)  # (each count rounded down)
    short = len(default_engine.tokenize(PROMPT)) <= MAX_ITEM_TOKENS  # (its step fused too)
    assert wide_stats["fused_steps"] - before == len(expected) + short > 0
    assert got == expected


def test_every_output_matches_its_format(default_engine):
    async def all_formats():
        jobs = [generate(default_engine, next(ids), params(f, **s)) for f in FORMATS for s in SAMPLINGS]
        return await asyncio.gather(*jobs)

    combos = [(f, s) for f in FORMATS for s in SAMPLINGS]
    for (fmt, sampling), result in zip(combos, asyncio.run(all_formats()), strict=True):
        assert result.finish_reason == "stop", (fmt, sampling, result.text)
        assert matches(fmt, result.text), (fmt, sampling, result.text)


def test_forks_decode_on_the_shared_prefix_path(default_engine):
    """Eight forks of an 880-token parent decode together, attending its blocks once."""
    prefix = default_engine.tokenize("The lighthouse keeper wrote in his log every night. " * 80)
    sampling = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

    async def run():
        parent = next(ids)
        await default_engine.fill(parent, prefix)
        children = [next(ids) for _ in range(8)]
        before = default_engine.stats_now()["shared_prefix_steps"]
        tails = [default_engine.tokenize(f" Night {i}:") for i in range(8)]
        results = await asyncio.gather(
            *(
                default_engine.generate(c, sampling, parent, token_ids=t)
                for c, t in zip(children, tails, strict=True)
            )
        )
        steps = default_engine.stats_now()["shared_prefix_steps"] - before
        for c in [*children, parent]:
            await default_engine.free_context(c)
        return results, steps

    results, shared_steps = asyncio.run(run())
    assert [len(r.token_ids) for r in results] == [16] * 8
    assert shared_steps > 0


def test_ping_says_what_it_serves(default_client, client):
    assert {k: default_client.get("/ping").json()[k] for k in ("weights", "dtype", "kv_dtype")} == {
        "weights": "gguf",
        "dtype": "float32",
        "kv_dtype": "bfloat16",
    }
    assert client.get("/ping").json()["weights"] == "exact"  # the tests' shared engine
    cpu = default_client.get("/ping").json()["cpu"]  # what the CPU offers, what prompts run on
    assert cpu["isa"] and cpu["dense_copy"]["reason"] == "timed"
    assert cpu["dense_copy"]["dtype"] in ("bfloat16", "float32")
    assert cpu["int8_activations"]["reason"] == "timed" and cpu["int8_activations"]["rows"] >= 0
    exact = client.get("/ping").json()["cpu"]
    assert exact["dense_copy"] is None and exact["int8_activations"] is None  # exact weights: neither


def test_its_packed_layers_take_the_paths_it_chose(default_engine):
    model = default_engine.model
    layers = [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    assert layers and {m.dense.dtype for m in layers} == {model.dense_choice.dtype}
    assert {m.int_rows for m in layers} == {model.int_dot_choice.rows}  # the bundled model's all fit


def test_the_openai_routes(default_client):
    r = default_client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "stream": True}
    with default_client.stream("POST", "/v1/chat/completions", json=body) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert "[DONE]" in stream.read().decode()
