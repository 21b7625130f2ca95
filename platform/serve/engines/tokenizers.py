"""Tokenization on the ServeCore, with the model's own tokenizer.

A call's prompt is the tokens of its whole rendered text, exactly what a plain server
tokenizes for the same text (the engine's ``/v1/completions``), so greedy outputs match it.
The tokenizer is the model's ``tokenizer.json``, fetched once from an engine of the model
and run here, with the character span of every token (to place context boundaries at
message and template-text boundaries). For a model whose engine has no ``tokenizer.json``,
the engine's ``/tokenize`` is asked instead (no spans then). Long texts are tokenized in a
worker thread, never on the event loop, the Rust tokenizer running without the GIL there.
Results are cached least recently used up to a bound on the cached text; a text longer than
``max_entry_chars`` is not cached (a 4 MiB prompt's token ids and offsets are ~150 MB of
Python objects, which the cache would otherwise keep).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import tokenizers
from tokenizers import Tokenizer

from parrot.platform.serve.engines.token_pieces import Ends, JoinedEnds, cut, piece_cutter

Tokenize = Callable[[str], Awaitable[list[int]]]
INLINE_CHARS = 8_192  # shorter texts are tokenized on the loop: a thread hop costs more
# Longer texts, or texts of more pieces, are tokenized whole (token_pieces): a text of many
# special tokens would otherwise be a long Python loop on the event loop.
CUT_MAX_CHARS, MAX_PIECES = 256 * 1024, 256


class TokenEnds(Ends):
    """The ends of a text's tokens, read one token at a time from the tokenizer's own
    encoding. Building them all as Python objects (a list of a million tuples for a 4 MiB
    prompt) held the GIL for a quarter of a second, and freeing them as long again, on the
    event loop: only the few that a prompt's boundaries need are read."""

    def __init__(self, encoding: tokenizers.Encoding) -> None:
        super().__init__(len(encoding))
        self._encoding = encoding

    def _end(self, index: int) -> int:
        return self._encoding.token_to_chars(index)[1]


@dataclass(frozen=True)
class Encoding:
    ids: tuple[int, ...]
    ends: Sequence[int] | None  # character offset where each token's text ends (None: unknown)

    def tokens_within(self, chars: int) -> int:
        """How many leading tokens lie wholly within the first ``chars`` characters."""
        if self.ends is None:
            raise ValueError("no token spans for this tokenizer")
        lo, hi = 0, len(self.ends)
        while lo < hi:  # the first token ending after ``chars``
            mid = (lo + hi) // 2
            if self.ends[mid] <= chars:
                lo = mid + 1
            else:
                hi = mid
        return lo


@dataclass
class TokenizerManager:
    max_chars: int = 64 * 2**20  # cached text, summed over entries
    max_entry_chars: int = 2**20  # longer texts are tokenized each time, never kept
    big_at: float | None = None  # time.monotonic() of the last text longer than that
    hits: int = 0
    misses: int = 0
    _cache: OrderedDict[tuple[str, str], Encoding] = field(default_factory=OrderedDict)
    _chars: int = 0
    _local: dict[str, Tokenizer] = field(default_factory=dict)  # model -> its tokenizer
    _cutters: dict[str, re.Pattern[str]] = field(default_factory=dict)  # model -> its cuts (token_pieces)

    def __post_init__(self) -> None:
        if self.max_chars < 0:
            raise ValueError("max_chars must not be negative")

    def load(self, model: str, tokenizer_json: str) -> None:
        """Tokenize ``model``'s text here from now on (``tokenizer.json`` contents)."""
        tokenizer = Tokenizer.from_str(tokenizer_json)
        self._local[model] = tokenizer
        cutter = piece_cutter(tokenizer, tokenizer_json)
        if cutter is not None:
            self._cutters[model] = cutter

    def has_local(self, model: str) -> bool:
        return model in self._local

    async def encode(self, model: str, text: str, fetch: Tokenize | None = None) -> Encoding:
        """The tokens of ``text`` under ``model``'s tokenizer: cached, else computed here
        (its pieces between added tokens each on its own, most of them cached: see
        token_pieces), else asked of an engine of that model (``fetch``)."""
        cached = self._cached(model, text)
        if cached is not None:
            return cached
        local = self._local.get(model)
        cutter = self._cutters.get(model)
        pieces = [text]
        if local is not None and cutter is not None and len(text) <= CUT_MAX_CHARS:
            pieces = cut(cutter, text)
            if len(pieces) > MAX_PIECES:  # a loop over them would stall the event loop
                pieces = [text]
        if len(pieces) == 1:
            encoding = await self._compute(model, text, local, fetch)
        else:
            assert local is not None
            known = {piece: self._cached(model, piece) for piece in pieces}
            missing = [piece for piece, part in known.items() if part is None]
            for piece, part in zip(missing, await _encode_all(local, missing), strict=True):
                known[piece] = self._keep(model, piece, part)
            parts, ids, chars = [], [], 0
            for piece in pieces:
                part = known[piece]
                assert part is not None
                parts.append((len(ids), chars, part.ends))
                ids += part.ids
                chars += len(piece)
            encoding = Encoding(tuple(ids), JoinedEnds(parts, len(ids)))
        return self._keep(model, text, encoding)

    def _cached(self, model: str, text: str) -> Encoding | None:
        key = (model, text)
        cached = self._cache.get(key)
        if cached is None:
            self.misses += 1
            return None
        self.hits += 1
        self._cache.move_to_end(key)
        return cached

    async def _compute(
        self, model: str, text: str, local: Tokenizer | None, fetch: Tokenize | None
    ) -> Encoding:
        if local is not None:
            return (await _encode_all(local, [text]))[0]
        if fetch is not None:
            return Encoding(tuple(await fetch(text)), None)
        raise LookupError(f"no tokenizer for model {model!r}")

    def _keep(self, model: str, text: str, encoding: Encoding) -> Encoding:
        """Cache ``encoding`` of ``text`` (a text too long is not kept) and return it."""
        if len(text) > self.max_entry_chars:
            self.big_at = time.monotonic()  # its memory is worth giving back (serve.memory)
        elif len(text) <= self.max_chars:
            self._cache[(model, text)] = encoding
            self._chars += len(text)
            while self._chars > self.max_chars:
                (_, old), _ = self._cache.popitem(last=False)
                self._chars -= len(old)
        return encoding

    def __len__(self) -> int:
        return len(self._cache)


async def _encode_all(tokenizer: Tokenizer, texts: list[str]) -> list[Encoding]:
    """The encodings of ``texts``: here when they are short, else in a worker thread."""
    if sum(map(len, texts)) <= INLINE_CHARS:
        return _encode(tokenizer, texts)
    return await asyncio.to_thread(_encode, tokenizer, texts)


def _encode(tokenizer: Tokenizer, texts: list[str]) -> list[Encoding]:
    # Templates carry their own special tokens; nothing is added (as the engine does).
    # encode_batch, not encode: it runs without the GIL (measured: a 2 MiB prompt held the
    # GIL for 2-3 s through encode in a worker thread, /healthz waiting all along)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
    return [Encoding(tuple(e.ids), TokenEnds(e)) for e in encodings]
