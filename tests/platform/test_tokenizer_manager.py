"""The ServeCore's tokenizer: the engine's own tokens for whole texts, token spans, a cache."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from parrot.platform.serve.engines.client import HttpEngine
from parrot.platform.serve.engines.tokenizers import INLINE_CHARS, Encoding, TokenizerManager

pytestmark = pytest.mark.asyncio(loop_scope="function")

TEXTS = [
    "<|im_start|>user\nÜnïcode 😀 and {{braces}}<|im_end|>\n<|im_start|>assistant\n",
    "  two spaces\n\n  and more   ",
    "Summarize:  the  sea.\n\n Summary:",
    "日本語のテキスト and 🦜🦜",
]


async def test_each_text_is_tokenized_once_per_model():
    asked: list[str] = []

    async def fetch(text: str) -> list[int]:
        asked.append(text)
        return [len(w) for w in text.split()]

    manager = TokenizerManager()
    for _ in range(3):
        assert (await manager.encode("m1", "a bb ccc", fetch)).ids == (1, 2, 3)
    await manager.encode("m2", "a bb ccc", fetch)  # another model: its own tokens
    assert asked == ["a bb ccc", "a bb ccc"] and (manager.hits, manager.misses) == (2, 2)
    assert (await manager.encode("m1", "a bb ccc", fetch)).ends is None  # an engine gives no spans


async def test_the_cache_is_bounded_and_evicts_the_least_recently_used():
    async def fetch(text: str) -> list[int]:
        return [1]

    manager = TokenizerManager(max_chars=10)
    for text in ("aaaa", "bbbb", "aaaa", "cccc"):  # "aaaa" used again: "bbbb" is the oldest
        await manager.encode("m", text, fetch)
    assert len(manager) == 2
    await manager.encode("m", "aaaa", fetch)
    assert manager.misses == 3  # "aaaa" stayed cached
    await manager.encode("m", "x" * 11, fetch)  # larger than the whole cache: not kept
    assert len(manager) == 2
    with pytest.raises(ValueError):
        TokenizerManager(max_chars=-1)
    with pytest.raises(LookupError):
        await TokenizerManager().encode("unknown", "text")


async def test_the_models_tokenizer_gives_the_engines_tokens_here(engine_server, engine):
    client = HttpEngine(engine_server.url)
    try:
        manager = TokenizerManager()
        manager.load("smol", await client.tokenizer_json())
        for text in [*TEXTS, "x" * (INLINE_CHARS + 10) + " tail"]:  # the long one in a thread
            encoding = await manager.encode("smol", text)
            assert list(encoding.ids) == engine.tokenize(text)
            assert len(encoding.ends) == len(encoding.ids)
    finally:
        await client.aclose()


async def test_token_spans_place_boundaries_that_are_prefixes(engine_server, engine):
    """``tokens_within(c)`` tokens of a text decode to a prefix of its first c characters,
    and at a message boundary they are exactly what the prefix alone tokenizes to."""
    client = HttpEngine(engine_server.url)
    try:
        manager = TokenizerManager()
        manager.load("smol", await client.tokenizer_json())
        text = TEXTS[0] + "Hello there.<|im_end|>\n"
        encoding = await manager.encode("smol", text)
        for chars in range(len(text) + 1):
            n = encoding.tokens_within(chars)
            assert text[:chars].startswith(
                engine.tokenizer.decode(list(encoding.ids[:n]), skip_special_tokens=False)
            )
        boundary = len(TEXTS[0])
        n = encoding.tokens_within(boundary)
        assert list(encoding.ids[:n]) == engine.tokenize(TEXTS[0])
        with pytest.raises(ValueError):
            Encoding((1, 2), None).tokens_within(1)
    finally:
        await client.aclose()


PROMPTS = [
    "<|im_start|>system\nYou are a careful team.<|im_end|>\n<|im_start|>user\n  Hi 12345 über ☃<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n What's 2+2?\n\n<|eot_id|>",
    "<s>[INST] Tell me  a  joke. [/INST] Sure</s>[INST] again\n[/INST]",
    "no added token at all, just text  with  spaces\n\n",
    "<|im_end|><|im_end|>\n<|im_start|>",
]


def _family_tokenizers() -> dict[str, str]:
    """tokenizer.json texts of the families whose vocabularies `make test` extracts."""
    from tool_models import ASSETS, FAMILIES, missing_assets

    if missing_assets():
        pytest.skip(missing_assets())
    import transformers

    vocabs = {f.vocab for f in FAMILIES.values()}
    return {
        vocab: transformers.AutoTokenizer.from_pretrained(
            str(ASSETS), gguf_file=vocab
        ).backend_tokenizer.to_str()
        for vocab in sorted(vocabs)
    }


async def test_prompts_cut_at_added_tokens_get_the_tokens_and_spans_of_the_whole(engine_server):
    """Each family's tokenizer: a prompt tokenized piece by piece (cached pieces reused) has
    exactly the tokens and token ends of the prompt tokenized whole; a tokenizer whose tokens
    could change at a cut (Llama 2's SentencePiece) is not cut."""
    client = HttpEngine(engine_server.url)
    try:
        texts = {"smol": await client.tokenizer_json(), **_family_tokenizers()}
    finally:
        await client.aclose()
    cut_ones = set()
    for name, text in texts.items():
        manager = TokenizerManager()
        manager.load(name, text)
        whole = Tokenizer.from_str(text)
        if name in manager._cutters:
            cut_ones.add(name)
        for prompt in PROMPTS * 2:  # the second time, its pieces are cached
            manager._cache.pop((name, prompt), None)  # not the whole prompt
            encoding = await manager.encode(name, prompt)
            expected = whole.encode(prompt, add_special_tokens=False)
            assert list(encoding.ids) == expected.ids, (name, prompt)
            assert list(encoding.ends) == [end for _, end in expected.offsets], (name, prompt)
    assert {"smol", "ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf"} <= cut_ones
    assert "ggml-vocab-llama-spm.gguf" not in cut_ones


async def smol_manager(url: str) -> TokenizerManager:
    """A manager with the bundled model's tokenizer, fetched from its engine."""
    client = HttpEngine(url)
    try:
        manager = TokenizerManager()
        manager.load("smol", await client.tokenizer_json())
    finally:
        await client.aclose()
    return manager


async def test_a_shared_system_prompt_is_tokenized_once(engine_server):
    manager = await smol_manager(engine_server.url)
    system = "<|im_start|>system\n" + "A long shared system prompt. " * 50 + "<|im_end|>\n"
    for user in ("one", "two", "three"):
        await manager.encode("smol", f"{system}<|im_start|>user\n{user}<|im_end|>\n")
    misses = manager.misses
    await manager.encode("smol", f"{system}<|im_start|>user\nfour<|im_end|>\n")
    assert manager.misses - misses == 2  # the whole prompt and its one new piece


async def test_texts_of_many_pieces_or_long_ones_are_tokenized_whole(engine_server, engine):
    """A text of more pieces than MAX_PIECES (a loop over them would hold the event loop),
    or longer than CUT_MAX_CHARS, is tokenized whole, off the loop when long; the tokens
    are the same either way."""
    from parrot.platform.serve.engines.tokenizers import CUT_MAX_CHARS, MAX_PIECES

    manager = await smol_manager(engine_server.url)
    many = "<|im_start|>a" * (MAX_PIECES + 1)
    long = "<|im_start|>user\n" + "word " * (CUT_MAX_CHARS // 5) + "<|im_end|>"
    for text in (many, long):
        assert list((await manager.encode("smol", text)).ids) == engine.tokenize(text)
    assert len(manager) == 2  # the two texts, none of their pieces
