"""Tokenization and chat templates off the event loop, for the engine API and its routes.

A 4 MiB prompt takes seconds to tokenize; done on the event loop it stalls every other
request of the engine (``/ping`` included, so a ServeCore would mark the engine down).
Texts longer than :data:`INLINE_CHARS` are tokenized in a worker thread (the tokenizer's
Rust code runs without the GIL there), and chat templates, whose cost grows with the
messages, are always rendered in one.
"""

from __future__ import annotations

import asyncio

from parrot.engines.builtin.tokenizer import Tokenizer, chat_pieces

INLINE_CHARS = 8_192  # shorter texts are tokenized on the loop: a thread hop costs more


async def tokenize(tokenizer: Tokenizer, text: str) -> list[int]:
    if len(text) <= INLINE_CHARS:
        return tokenizer.encode(text)
    return await asyncio.to_thread(tokenizer.encode, text)


async def chat_prompt(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> str:
    """The chat's prompt text in the model's template (ValueError: it has none)."""
    return await asyncio.to_thread(tokenizer.apply_chat_template, messages, True)


async def chat_prompt_pieces(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[str]:
    """The chat's prompt text split at message boundaries (see :func:`chat_pieces`)."""
    return await asyncio.to_thread(chat_pieces, tokenizer, messages)
