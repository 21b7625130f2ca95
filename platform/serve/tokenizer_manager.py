"""Tokenization on the ServeCore, once per model and text.

Prompt pieces are turned into token ids here, so builtin engines get ``Fill(token_ids)``
and spend no time tokenizing. A constant system prompt shared by a thousand sessions is
tokenized once per model, whichever engine of that model the pieces go to: the token
ids of a text depend only on the model's tokenizer. The tokenizer is the model's own
``tokenizer.json``, fetched once from an engine of the model and run here (no request per
piece); for a model whose engine has none, the engine's ``/tokenize`` is asked instead.
Results are cached least recently used up to a bound on the cached text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tokenizers import Tokenizer

Tokenize = Callable[[str], Awaitable[list[int]]]


@dataclass
class TokenizerManager:
    max_chars: int = 64 * 2**20  # cached text, summed over entries
    hits: int = 0
    misses: int = 0
    _cache: OrderedDict[tuple[str, str], tuple[int, ...]] = field(default_factory=OrderedDict)
    _chars: int = 0
    _local: dict[str, Tokenizer] = field(default_factory=dict)  # model -> its tokenizer

    def __post_init__(self) -> None:
        if self.max_chars < 0:
            raise ValueError("max_chars must not be negative")

    def load(self, model: str, tokenizer_json: str) -> None:
        """Tokenize ``model``'s text here from now on (``tokenizer.json`` contents)."""
        self._local[model] = Tokenizer.from_str(tokenizer_json)

    def has_local(self, model: str) -> bool:
        return model in self._local

    async def tokenize(self, model: str, text: str, fetch: Tokenize) -> list[int]:
        """The token ids of ``text`` under ``model``'s tokenizer: cached, else computed
        here, else asked of an engine of that model (``fetch``)."""
        key = (model, text)
        cached = self._cache.get(key)
        if cached is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return list(cached)
        self.misses += 1
        local = self._local.get(model)
        if local is not None:
            # Templates add their own special tokens; a piece is plain text.
            tokens = local.encode(text, add_special_tokens=False).ids
        else:
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
