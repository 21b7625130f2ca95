"""Tokenization and chat templates off the event loop, for the engine API and its routes.

A 4 MiB prompt takes seconds to tokenize; done on the event loop it stalls every other
request of the engine (``/ping`` included, so a ServeCore would mark the engine down).
Texts longer than :data:`INLINE_CHARS` are tokenized in a worker thread (the tokenizer's
Rust code runs without the GIL there), and chat templates, whose cost grows with the
messages, are always rendered in one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from parrot.engines.builtin.tokenizer import Tokenizer, chat_pieces
from parrot.engines.protocol.errors import BadRequestError
from parrot.wire.tool_syntax import Rendering

INLINE_CHARS = 8_192  # shorter texts are tokenized on the loop: a thread hop costs more


async def tokenize(tokenizer: Tokenizer, text: str) -> list[int]:
    if len(text) <= INLINE_CHARS:
        return tokenizer.encode(text)
    return await asyncio.to_thread(tokenizer.encode, text)


async def chat_prompt(tokenizer: Tokenizer, chat: Rendering) -> str:
    """The chat's prompt text in the model's template (a 400: see :func:`_template_errors`)."""
    with _template_errors():
        return await asyncio.to_thread(tokenizer.apply_chat_template, chat.messages, True, chat.tools)


async def chat_prompt_pieces(tokenizer: Tokenizer, chat: Rendering) -> list[str]:
    """The chat's prompt text split at message boundaries (see :func:`chat_pieces`)."""
    with _template_errors():
        return await asyncio.to_thread(chat_pieces, tokenizer, chat.messages, chat.tools)


@contextmanager
def _template_errors() -> Iterator[None]:
    """A model without a chat template, or a template that rejects the conversation (its
    ``raise_exception``: roles out of order, a tool call id of the wrong shape), is a 400."""
    try:
        yield
    except ValueError as error:  # no chat template
        raise BadRequestError(str(error)) from None
    except Exception as error:
        raise BadRequestError(f"the model's chat template rejects these messages: {error}") from None
