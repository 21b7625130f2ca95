"""Constrained decoding on the real engine and model (issue 21): every output matches its
format across sampling settings and batch compositions, EOS only where the value is
complete, ``max_tokens`` inside a structure is ``length``, bad formats are 4xx through the
engine's HTTP API, jump-forward gives the same greedy text in fewer steps."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema_rs
import pytest
from httpx_sse import connect_sse

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.grammars import GrammarCompiler, GrammarLimits
from parrot.engines.builtin.kv_cache import bytes_per_block
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.protocol.errors import BadFormatError
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams

PROMPT = "<|im_start|>user\nDescribe a person (name, age, city) as JSON.<|im_end|>\n<|im_start|>assistant\n"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 16},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
# Fixed keys, booleans and enums: most of the text is forced (jump-forward's case).
PROFILE = {
    "type": "object",
    "properties": {
        "first_name": {"type": "string", "maxLength": 12},
        "is_student": {"type": "boolean"},
        "country": {"enum": ["France", "Germany", "Japan", "United States of America"]},
        "favourite_colour": {"enum": ["red", "green", "blue"]},
        "has_pets": {"type": "boolean"},
    },
    "required": ["first_name", "is_student", "country", "favourite_colour", "has_pets"],
    "additionalProperties": False,
}
LARK = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/'
FORMATS = [
    OutputFormat(json_schema=PERSON),
    OutputFormat(json_object=True),
    OutputFormat(regex=r"[A-Z][a-z]{2,9} (is|was) [0-9]{1,2}"),
    OutputFormat(choice=["yes", "no", "it depends on the weather"]),
    OutputFormat(grammar=LARK),
]
SAMPLINGS = [
    {"temperature": 0.0},
    {"temperature": 0.9, "seed": 7},
    {"temperature": 1.0, "top_p": 0.9, "seed": 11},
]


def matches(fmt: OutputFormat, text: str) -> bool:
    if fmt.json_schema is not None:
        return jsonschema_rs.validator_for(fmt.json_schema).is_valid(json.loads(text))
    if fmt.json_object:
        return isinstance(json.loads(text), dict)
    if fmt.regex is not None:
        return re.fullmatch(fmt.regex, text) is not None
    if fmt.choice is not None:
        return text in fmt.choice
    return re.fullmatch(r"The answer is [0-9]{1,3}\.", text) is not None


def params(fmt: OutputFormat | None, max_tokens: int = 64, **sampling) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, format=fmt, **sampling)


async def generate(eng: BuiltinEngine, cid: int, sampling: SamplingParams, prompt: str = PROMPT):
    try:
        return await eng.generate(cid, sampling, token_ids=eng.tokenize(prompt))
    finally:
        await eng.free_context(cid)


def test_every_output_matches_its_format_with_free_rows_in_the_batch(engine, ids):
    free_prompts = [PROMPT, "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n"]

    async def free_alone() -> list[str]:
        return [(await generate(engine, next(ids), params(None, 24), p)).text for p in free_prompts]

    async def mixed():
        jobs = [generate(engine, next(ids), params(f, **s)) for f in FORMATS for s in SAMPLINGS]
        jobs += [generate(engine, next(ids), params(None, 24), p) for p in free_prompts]
        return await asyncio.gather(*jobs)

    alone = asyncio.run(free_alone())
    results = asyncio.run(mixed())
    combos = [(f, s) for f in FORMATS for s in SAMPLINGS]
    for (fmt, sampling), result in zip(combos, results, strict=False):
        assert result.finish_reason == "stop", (fmt.kind, sampling, result.text)
        assert matches(fmt, result.text), (fmt.kind, sampling, result.text)
        assert result.text == engine.tokenizer.decode(result.token_ids)
    # The free rows beside constrained ones: as when they ran alone (greedy).
    assert [r.text for r in results[len(combos) :]] == alone


def test_greedy_with_a_constraint_is_deterministic_alone_and_in_a_batch(engine, ids):
    fmt = OutputFormat(json_schema=PERSON)

    async def run():
        alone = await generate(engine, next(ids), params(fmt))
        batch = await asyncio.gather(
            generate(engine, next(ids), params(fmt)),
            generate(engine, next(ids), params(OutputFormat(json_object=True), temperature=1.0, seed=3)),
            generate(engine, next(ids), params(None, 16)),
        )
        return alone, batch[0]

    alone, batched = asyncio.run(run())
    assert alone.token_ids == batched.token_ids and matches(fmt, alone.text)


def test_eos_comes_only_when_the_value_is_complete(engine, ids):
    """ignore_eos is off and a free-length regex: the model's EOS is masked until the text
    matches, so each text matches whole (sampled, so EOS is tried at many points)."""
    fmt = OutputFormat(regex=r"[a-z]+( [a-z]+){2,4}\.")

    async def run():
        jobs = [generate(engine, next(ids), params(fmt, temperature=1.2, seed=s)) for s in range(6)]
        return await asyncio.gather(*jobs)

    for result in asyncio.run(run()):
        if result.finish_reason == "stop":
            assert matches(fmt, result.text), result.text
        else:  # ran out of tokens inside the value
            assert result.finish_reason == "length" and len(result.token_ids) == 64


def test_max_tokens_inside_a_structure_ends_with_length(engine, ids):
    result = asyncio.run(generate(engine, next(ids), params(OutputFormat(json_schema=PERSON), max_tokens=5)))
    assert result.finish_reason == "length" and len(result.token_ids) == 5
    assert result.text.startswith('{"name": "')
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.text)


def test_a_choice_ends_as_soon_as_it_is_complete(engine, ids):
    fmt = OutputFormat(choice=["Paris, the capital of France", "London"])
    result = asyncio.run(generate(engine, next(ids), params(fmt, max_tokens=32)))
    assert result.finish_reason == "stop" and result.text in fmt.choice


def test_forked_children_keep_their_own_grammars(engine, ids):
    parent = next(ids)

    async def run():
        await engine.fill(parent, token_ids=engine.tokenize(PROMPT))
        children = [next(ids) for _ in FORMATS]
        try:
            return await asyncio.gather(
                *(engine.generate(c, params(f), parent) for c, f in zip(children, FORMATS, strict=True))
            )
        finally:
            for cid in (parent, *children):
                await engine.free_context(cid)

    for fmt, result in zip(FORMATS, asyncio.run(run()), strict=True):
        assert result.finish_reason == "stop" and matches(fmt, result.text), (fmt.kind, result.text)


def test_stream_of_a_constrained_generation_adds_up_to_its_text(client, ids):
    cid = next(ids)
    body = {
        "context_id": cid,
        "text": PROMPT,
        "sampling": {"max_tokens": 64, "format": {"json_schema": PROFILE}},
    }
    with connect_sse(client, "POST", "/generate_stream", json=body) as source:
        assert source.response.status_code == 200
        events = [(event.event, event.json()) for event in source.iter_sse()]
    client.post("/free_context", json={"context_id": cid})
    tokens = [e for kind, e in events if kind == "token"]
    (end,) = [e for kind, e in events if kind == "end"]
    assert end["finish_reason"] == "stop" and matches(OutputFormat(json_schema=PROFILE), end["text"])
    assert "".join(t["text"] for t in tokens) == end["text"]
    assert [t["token_id"] for t in tokens] == end["token_ids"]


BAD_FORMATS = [
    ({"json_schema": {"type": "foo"}}, "foo"),
    ({"json_schema": {"type": "string", "pattern": "(?<=a)b"}}, "look-around"),
    ({"regex": "(ab"}, "unclosed group"),
    ({"grammar": "start: foo"}, "unknown name"),
]


@pytest.mark.parametrize(("fmt", "words"), BAD_FORMATS)
def test_a_bad_format_is_a_400_through_the_http_api_and_changes_nothing(client, ids, fmt, words):
    before = client.get("/ping").json()["num_contexts"]
    cid = next(ids)
    body = {"context_id": cid, "text": PROMPT, "sampling": {"max_tokens": 8, "format": fmt}}
    r = client.post("/generate", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "bad_format" and words in error["message"]
    assert client.get("/ping").json()["num_contexts"] == before
    with connect_sse(client, "POST", "/generate_stream", json=body) as source:
        assert source.response.status_code == 400


def test_a_format_over_the_size_limit_is_a_413_naming_its_flag(client, ids):
    body = {
        "context_id": next(ids),
        "text": PROMPT,
        "sampling": {"max_tokens": 8, "format": {"choice": ["a" * 40_000, "b" * 40_000]}},
    }
    r = client.post("/generate", json=body)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "format_too_large"
    assert "--max-format-chars" in r.json()["error"]["message"]


def test_the_compile_cache_is_bounded_and_keeps_no_bad_format(engine):
    eos = frozenset(engine.tokenizer.eos_token_ids)
    vocab = engine.model_config.vocab_size
    compiler = GrammarCompiler(engine.tokenizer.hf, vocab, eos, GrammarLimits(cache_size=2))

    async def run():
        for n in range(4):
            await compiler.compile(OutputFormat(regex=f"[0-9]{{{n + 1}}}"))
        assert len(compiler) == 2
        again = await compiler.compile(OutputFormat(regex="[0-9]{4}"))  # cached: the same template
        assert again is await compiler.compile(OutputFormat(regex="[0-9]{4}"))
        with pytest.raises(BadFormatError):
            await compiler.compile(OutputFormat(regex="(ab"))
        assert len(compiler) == 2

    try:
        asyncio.run(run())
    finally:
        compiler.close()


def test_a_compile_over_the_time_limit_is_a_400_naming_its_flag(engine):
    eos = frozenset(engine.tokenizer.eos_token_ids)
    limits = GrammarLimits(compile_timeout_s=1e-4)  # the tokenizer alone takes longer to read
    compiler = GrammarCompiler(engine.tokenizer.hf, engine.model_config.vocab_size, eos, limits)
    try:
        with pytest.raises(BadFormatError, match="--format-compile-timeout"):
            asyncio.run(compiler.compile(OutputFormat(json_schema=PERSON)))
    finally:
        compiler.close()


@pytest.fixture(scope="module")
def plain_engine(engine_config):
    """An engine that decodes forced tokens one by one (--no-jump-forward)."""
    eng = BuiltinEngine(
        EngineConfig(
            cache_dir=engine_config.cache_dir,
            kv_cache_bytes=64 * 2**20,
            scheduler=SchedulerConfig(max_batched_tokens=512, max_running=8),
            jump_forward=False,
        )
    )
    yield eng
    eng.stop()


def test_jump_forward_gives_the_same_greedy_text_in_fewer_steps(engine, plain_engine, ids):
    fmt = OutputFormat(json_schema=PROFILE)

    async def run(eng: BuiltinEngine):
        before = eng.stats_now()
        result = await generate(eng, next(ids), params(fmt, max_tokens=96))
        after = eng.stats_now()
        return result, after["steps"] - before["steps"], after["tokens_forced"] - before["tokens_forced"]

    jumped, jumped_steps, forced = asyncio.run(run(engine))
    plain, plain_steps, none_forced = asyncio.run(run(plain_engine))
    assert jumped.finish_reason == plain.finish_reason == "stop"
    assert jumped.text == plain.text and matches(fmt, jumped.text)
    assert len(jumped.token_ids) >= jumped_steps  # forced tokens count as generated
    assert jumped_steps * 1.5 <= plain_steps, (jumped_steps, plain_steps)
    assert forced > len(jumped.token_ids) / 2 and none_forced == 0


@pytest.fixture(scope="module")
def small_engine(engine, engine_config):
    """An engine whose cache holds 24 blocks (384 tokens) in all: jobs get preempted."""
    per_block = bytes_per_block(ModelConfig.from_folder(engine.model_folder), 16, engine.dtype)
    eng = BuiltinEngine(
        EngineConfig(
            weights=engine_config.weights,  # as the engine it is compared with
            cache_dir=engine_config.cache_dir,
            kv_cache_bytes=24 * per_block,
            scheduler=SchedulerConfig(max_batched_tokens=256, max_running=16),
        )
    )
    yield eng
    eng.stop()


def test_preempted_constrained_jobs_resume_with_their_grammar_state(small_engine, engine, ids):
    """Six long constrained generations in a cache for about four: the preempted ones resume
    with their matchers where they were, and give the text they give unpreempted (greedy)."""
    schema = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 2000}},
        "required": ["story"],
    }
    fmt = OutputFormat(json_schema=schema)
    prompts = [
        f"<|im_start|>user\nTell story number {i} as JSON.<|im_end|>\n<|im_start|>assistant\n"
        for i in range(6)
    ]

    async def run(eng: BuiltinEngine):
        jobs = [generate(eng, next(ids), params(fmt, max_tokens=72), p) for p in prompts]
        return [r.text for r in await asyncio.gather(*jobs)]

    before = small_engine.stats_now()["preemptions"]
    squeezed = asyncio.run(run(small_engine))
    assert small_engine.stats_now()["preemptions"] > before
    assert squeezed == asyncio.run(run(engine))
    assert all(text.startswith('{"story": "') for text in squeezed)
