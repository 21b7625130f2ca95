"""The real ``openai`` client against the engine's /v1 routes: plain, streaming, completions, chat."""

from __future__ import annotations

import openai
import pytest
from conftest import assert_event_streams

SYSTEM = "You are a terse assistant for the lighthouse museum. " * 12


@pytest.fixture
def oai(engine_server):
    with openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_lists_the_served_model(oai, engine):
    assert [m.id for m in oai.models.list()] == [engine.model_name]


def test_completions_plain_and_streaming_agree(oai):
    prompt = "The three primary colors are"
    plain = oai.completions.create(model="", prompt=prompt, max_tokens=12, temperature=0)
    assert plain.object == "text_completion"
    assert plain.choices[0].text and plain.choices[0].finish_reason in {"stop", "length"}
    assert plain.usage.prompt_tokens > 0 and plain.usage.completion_tokens <= 12
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    chunks = list(
        oai.completions.create(
            model="",
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    )


def test_chat_plain_and_streaming_agree(oai):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a planet."},
    ]
    plain = oai.chat.completions.create(model="", messages=messages, max_tokens=16, temperature=0)
    assert plain.object == "chat.completion"
    message = plain.choices[0].message
    assert message.role == "assistant" and message.content
    stream = oai.chat.completions.create(
        model="", messages=messages, max_tokens=16, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_repeated_system_prompt_is_served_from_the_prefix_cache(oai):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Opening hours?"}]
    first = oai.chat.completions.create(model="", messages=messages, max_tokens=4, temperature=0)
    messages[1]["content"] = "Ticket price?"
    second = oai.chat.completions.create(model="", messages=messages, max_tokens=4, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 * ((first.usage.prompt_tokens - 40) // 16)  # the shared system prompt
    assert cached < second.usage.prompt_tokens


def test_n_choices_fork_one_prompt(oai):
    r = oai.completions.create(
        model="", prompt="Once upon a time", max_tokens=8, temperature=0.9, n=3, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.text for c in r.choices)


def test_seeded_sampling_is_reproducible(oai):
    kwargs = dict(model="", prompt="My favourite animal is", max_tokens=10, temperature=1.0, seed=1234)
    assert (
        oai.completions.create(**kwargs).choices[0].text == oai.completions.create(**kwargs).choices[0].text
    )


def test_openai_errors_are_4xx_with_messages(oai):
    with pytest.raises(openai.BadRequestError, match="not served here"):
        oai.completions.create(model="gpt-unknown", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oai.completions.create(model="", prompt="hi", max_tokens=2, temperature=50)
    with pytest.raises(openai.BadRequestError, match="context length"):
        oai.completions.create(model="", prompt="hi", max_tokens=100_000)
    with pytest.raises(openai.BadRequestError, match="empty"):
        oai.completions.create(model="", prompt="", max_tokens=2)
    ok = oai.completions.create(model="", prompt="hi", max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in {"stop", "length"}


def test_streams_are_labelled_event_streams(engine_server):
    assert_event_streams(engine_server.url)


@pytest.mark.parametrize("stream", [False, True])
def test_a_one_choice_request_gets_its_first_token_in_the_prompt_step(oai, engine, stream):
    """The generate job fills the prompt itself: one model step for prompt and first token
    (a separate fill job made it two, the token waiting a step behind the prompt)."""
    before = engine.stats_now()["steps"]
    created = oai.completions.create(
        model="", prompt="A lighthouse keeper counts", max_tokens=1, temperature=0, stream=stream
    )
    if stream:
        text = "".join(c.choices[0].text for c in created if c.choices)
    else:
        text = created.choices[0].text
        assert created.usage.completion_tokens == 1
    assert text
    assert engine.stats_now()["steps"] - before == 1
