"""The ServeCore's tokenizer cache: once per (model, text), bounded, same ids as the engine."""

from __future__ import annotations

import pytest

from parrot.platform.serve.engine_client import HttpEngine
from parrot.platform.serve.tokenizer_manager import TokenizerManager

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_each_text_is_tokenized_once_per_model():
    asked: list[str] = []

    async def fetch(text: str) -> list[int]:
        asked.append(text)
        return [len(w) for w in text.split()]

    manager = TokenizerManager()
    for _ in range(3):
        assert await manager.tokenize("m1", "a bb ccc", fetch) == [1, 2, 3]
    await manager.tokenize("m2", "a bb ccc", fetch)  # another model: its own tokens
    assert asked == ["a bb ccc", "a bb ccc"] and (manager.hits, manager.misses) == (2, 2)


async def test_the_cache_is_bounded_and_evicts_the_least_recently_used():
    async def fetch(text: str) -> list[int]:
        return [1]

    manager = TokenizerManager(max_chars=10)
    await manager.tokenize("m", "aaaa", fetch)
    await manager.tokenize("m", "bbbb", fetch)
    await manager.tokenize("m", "aaaa", fetch)  # used again: "bbbb" is now the oldest
    await manager.tokenize("m", "cccc", fetch)
    assert len(manager) == 2
    await manager.tokenize("m", "aaaa", fetch)
    assert manager.misses == 3  # "aaaa" stayed cached
    await manager.tokenize("m", "x" * 11, fetch)  # larger than the whole cache: not kept
    assert len(manager) == 2
    with pytest.raises(ValueError):
        TokenizerManager(max_chars=-1)


async def test_cached_tokens_are_those_the_engine_fills(engine_server, engine):
    client = HttpEngine(engine_server.url)
    try:
        manager = TokenizerManager()
        text = "<|im_start|>system\nYou are a careful assistant.<|im_end|>\n"
        first = await manager.tokenize("smol", text, client.tokenize)
        assert first == engine.tokenize(text)
        assert await manager.tokenize("smol", text, client.tokenize) == first and manager.hits == 1
    finally:
        await client.aclose()


async def test_the_models_tokenizer_runs_here_once_loaded(engine_server, engine):
    client = HttpEngine(engine_server.url)
    try:
        manager = TokenizerManager()
        manager.load("smol", await client.tokenizer_json())
        asked: list[str] = []

        async def fetch(text: str) -> list[int]:
            asked.append(text)
            return await client.tokenize(text)

        texts = ["<|im_start|>user\nÜnïcode 😀 and {{braces}}<|im_end|>\n", "  two spaces\n\n", "Topic: "]
        for text in texts:
            assert await manager.tokenize("smol", text, fetch) == engine.tokenize(text)
        assert asked == []  # no request per piece
    finally:
        await client.aclose()
