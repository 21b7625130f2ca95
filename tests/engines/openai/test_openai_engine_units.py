"""The OpenAI engine's parts without an endpoint: config, text contexts, the chat mapping,
and the inputs the engine refuses before any request (retries and their backoff are the
``openai`` client's: tests/engines/openai/test_openai_engine_failures.py)."""

from __future__ import annotations

import pytest

from parrot.engines.openai.chat_messages import to_messages
from parrot.engines.openai.config import OpenAIEngineConfig
from parrot.engines.openai.contexts import ContextStore
from parrot.engines.openai.engine import OpenAIEngine
from parrot.engines.openai.request import build_request
from parrot.engines.protocol.errors import BadRequestError, ContextConflictError, UnknownContextError
from parrot.wire.sampling import SamplingParams

URL = "http://127.0.0.1:9/v1"  # nothing listens: these tests must not reach the network


def test_config_defaults_describe_and_hidden_key():
    config = OpenAIEngineConfig(
        base_url=" https://user:pw@api.example.com/v1/?x=1 ", model="gpt", api_key="sk-abcdef"
    )
    assert config.base_url == "https://user:pw@api.example.com/v1/?x=1"
    # No capacity: a llama.cpp server's slots once its first ping says, else the default.
    assert (config.api, config.capacity, config.default_capacity) == ("chat", None, 16)
    assert (config.timeout_s, config.max_retries, config.plan_slots) == (60.0, 4, True)
    assert config.describe() == {
        "base_url": "https://api.example.com/v1",  # no credentials, query or trailing slash
        "model": "gpt",
        "api": "chat",
        "capacity": None,
    }
    assert OpenAIEngine(config).describe()["capacity"] == 16
    assert "sk-abcdef" not in repr(config) and "pw" not in str(config.describe())
    assert OpenAIEngineConfig(base_url=URL, model="m").key == "none"
    assert OpenAIEngineConfig(base_url=URL, model="m", api_key="").key == "none"
    assert OpenAIEngineConfig(base_url=URL + "/", model="m").base_url == URL


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"api": "foo"}, "api must be one of"),
        ({"model": ""}, "non-empty 'model'"),
        ({"model": "  "}, "non-empty 'model'"),
        ({"base_url": "ftp://host/v1"}, "http:// or https://"),
        ({"base_url": "127.0.0.1:8000/v1"}, "http:// or https://"),
        ({"base_url": "http:///v1"}, "with a host"),
        ({"base_url": "http://host:99999/v1"}, "not a valid URL"),
        ({"base_url": "http://ho st/v1"}, "http:// or https://"),
        ({"capacity": 0}, "capacity must be an integer >= 1"),
        ({"capacity": 2.5}, "capacity must be an integer"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout_s": 0}, "timeout_s must be a positive number"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"cooldown_s": -1}, "cooldown_s"),
        ({"api_key": 123}, "api_key must be a string"),
    ],
)
def test_bad_config_is_a_bad_request(fields, message):
    with pytest.raises(BadRequestError, match=message):
        OpenAIEngineConfig(**{"base_url": URL, "model": "m", **fields})


def test_text_contexts_fork_by_reference_and_survive_a_freed_parent():
    store = ContextStore()
    root = store.context_for(1, None)
    root.append("System. ")
    child = store.context_for(2, 1)
    child.append("Q1")
    root.append("later text")  # the child saw the root as it was at the fork
    grandchild = store.context_for(3, 2)
    grandchild.append(" A1")
    assert (child.text(), grandchild.text(), len(grandchild)) == ("System. Q1", "System. Q1 A1", 13)
    assert store.free(1) == len("System. later text") and store.get(1) is None
    assert grandchild.text() == "System. Q1 A1" and store.free(1) == 0
    assert store.context_for(2, None) is child and store.context_for(2, 1) is child
    with pytest.raises(ContextConflictError, match="already exists with parent 1, not 3"):
        store.context_for(2, 3)
    with pytest.raises(UnknownContextError, match="parent context 99"):
        store.context_for(4, 99)
    with pytest.raises(BadRequestError, match="its own parent"):
        store.context_for(5, 5)
    with pytest.raises(UnknownContextError, match="fill it first"):
        store.existing(6, None)
    assert store.own_chars() == len("Q1") + len(" A1")


def test_a_fork_shorter_than_its_parents_view_of_the_grandparent_sees_only_its_own_length():
    """The ServeCore forks a prompt from a checkpoint at the length matched, which may fall
    inside the text the checkpoint sees of its own parent (two system prompts sharing their
    first words). Before: the fork saw the checkpoint's whole view, and the endpoint got the
    other system prompt before this one's (measured: 2,312 characters sent for 1,192)."""
    store = ContextStore()
    first = store.context_for(1, None)
    first.append("<|im_start|>system\nYou are librarian 0. word0 word0 word0")
    store.checkpoint(2, first, len(first))  # the constant system prompt of the first call
    second = store.context_for(3, 2, parent_len=len("<|im_start|>system\nYou are librarian "))
    second.append("1. word1 word1 word1")
    assert second.text() == "<|im_start|>system\nYou are librarian 1. word1 word1 word1"
    assert len(second.text()) == len(second)
    assert store.context_for(4, 2, parent_len=3).text() == "<|i"


@pytest.mark.parametrize(
    ("text", "messages"),
    [
        ("You are terse. Q: what is a tide? A:", [("user", "You are terse. Q: what is a tide? A:")]),
        (
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            [("system", "Be brief."), ("user", "Hi")],
        ),
        (  # a prefill: the open assistant message is kept
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nWell,",
            [("user", "Hi"), ("assistant", "Well,")],
        ),
        (  # loose text around messages, and a message ended by the next start marker
            "Preamble\n<|im_start|>system\nS<|im_start|>user\nU<|im_end|>\ntrailing words",
            [("user", "Preamble"), ("system", "S"), ("user", "U"), ("user", "trailing words")],
        ),
        (  # a multi-turn history
            "<|im_start|>user\nA<|im_end|><|im_start|>assistant\nB<|im_end|><|im_start|>user\nC<|im_end|>",
            [("user", "A"), ("assistant", "B"), ("user", "C")],
        ),
    ],
)
def test_chat_mapping(text, messages):
    assert to_messages(text) == [{"role": r, "content": c} for r, c in messages]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<|im_start|>wizard\nhi<|im_end|>", "unknown chat role 'wizard'"),
        ("<|im_start|>user", "has no role line"),
        ("<|im_start|>assistant\n", "only a generation prompt"),
        ("   \n", "the context is empty"),
    ],
)
def test_chat_mapping_refuses_what_is_not_a_chat(text, message):
    with pytest.raises(BadRequestError, match=message):
        to_messages(text)


def test_sampling_defaults_give_a_plain_openai_request():
    config = OpenAIEngineConfig(base_url=URL, model="m", api="completions")
    body = build_request(config, "Hello", SamplingParams())
    assert body == {"model": "m", "max_tokens": 128, "temperature": 0.0, "prompt": "Hello"}
    extended = build_request(
        config, "Hello", SamplingParams(repetition_penalty=1.2, ignore_eos=True, stop_token_ids=[7])
    )
    assert extended["extra_body"] == {"repetition_penalty": 1.2, "ignore_eos": True, "stop_token_ids": [7]}


@pytest.mark.asyncio(loop_scope="function")
async def test_inputs_refused_before_any_request():
    engine = OpenAIEngine(OpenAIEngineConfig(base_url=URL, model="m", api="completions", max_retries=0))
    try:
        with pytest.raises(BadRequestError, match="contexts are text: fill with text, not token_ids"):
            await engine.fill(1, token_ids=[1, 2, 3])
        with pytest.raises(BadRequestError, match="fill needs text"):
            await engine.fill(1)
        with pytest.raises(UnknownContextError, match="parent context 7 does not exist"):
            await engine.fill(1, text="x", parent_context_id=7)
        with pytest.raises(UnknownContextError, match="context 2 does not exist: fill it first"):
            await engine.generate(2, SamplingParams())
        with pytest.raises(UnknownContextError, match="parent context 8"):
            await engine.generate(2, SamplingParams(), parent_context_id=8)
        assert (await engine.fill(1, text="")).context_len == 0  # an empty fill creates the context
        with pytest.raises(BadRequestError, match="context 3 is empty"):
            await engine.generate(3, SamplingParams(), parent_context_id=1)
        assert engine.stats()["num_contexts"] == 1  # the failed generation's fork is gone
        assert (await engine.fill(1, text="abc")).context_len == 3  # fills append
        assert (await engine.fill(4, text="de", parent_context_id=1)).context_len == 5
        with pytest.raises(ContextConflictError):
            await engine.fill(4, text="x", parent_context_id=99)
        assert engine.stats()["requests_done"] == 0 and engine.stats()["requests_failed"] == 0
        assert not hasattr(engine, "tokenize") and not hasattr(engine, "render_chat")  # text in, ChatML
    finally:
        await engine.aclose()
