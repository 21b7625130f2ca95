"""Tokenization on the ServeCore, once per model and text.

Prompt pieces are turned into token ids here, so builtin engines get ``Fill(token_ids)``
and spend no time tokenizing. A constant system prompt shared by a thousand sessions is
tokenized once per model, whichever engine of that model the pieces go to: the token
ids of a text depend only on the model's tokenizer. Tokens come from an engine of the
model (its ``/tokenize``, the same tokenizer its ``fill`` uses), cached least recently
used up to a bound on the cached text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Tokenize = Callable[[str], Awaitable[list[int]]]


@dataclass
class TokenizerManager:
    max_chars: int = 64 * 2**20  # cached text, summed over entries
    hits: int = 0
    misses: int = 0
    _cache: OrderedDict[tuple[str, str], tuple[int, ...]] = field(default_factory=OrderedDict)
    _chars: int = 0

    def __post_init__(self) -> None:
        if self.max_chars < 0:
            raise ValueError("max_chars must not be negative")

    async def tokenize(self, model: str, text: str, fetch: Tokenize) -> list[int]:
        """The token ids of ``text`` under ``model``'s tokenizer; ``fetch`` asks an engine of
        that model when the text is not cached."""
        key = (model, text)
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return list(cached)
        self.misses += 1
        tokens = await fetch(text)
        if len(text) <= self.max_chars:
            self._cache[key] = tuple(tokens)
            self._chars += len(text)
            while self._chars > self.max_chars:
                (_, old), _ = self._cache.popitem(last=False)
                self._chars -= len(old)
        return tokens

    def for_engine(self, model: str, fetch: Tokenize) -> Tokenize:
        """A tokenizer for one engine's context tree."""

        async def tokenize(text: str) -> list[int]:
            return await self.tokenize(model, text, fetch)

        return tokenize

    def __len__(self) -> int:
        return len(self._cache)
