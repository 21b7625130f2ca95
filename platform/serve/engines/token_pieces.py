"""Prompts cut at their added tokens, each piece tokenized (and cached) on its own.

A chat prompt is made of the same pieces again and again: the system prompt every user of
an application shares, the role headers, the template's text. Tokenizing each prompt whole
was a third of the ServeCore's event loop under concurrent agent applications (py-spy,
tiny proxy); its pieces between special tokens are mostly cached ones.

The cut is exact where the tokenizer cuts there itself: Hugging Face ``tokenizers`` first
splits a text at its added tokens matched on the raw text (``normalized: false``), then
normalizes, pre-tokenizes and encodes each piece between them alone. So the tokens of a text
are the tokens of its pieces one after another, provided nothing reaches across a cut: the
added tokens take no whitespace beside them (``lstrip``, ``rstrip``, ``single_word`` off),
the normalizer is per character, and the pre-tokenizer adds no prefix space (a
SentencePiece-style ``Metaspace`` puts one before the first piece only). Other tokenizers
are not cut (:func:`piece_cutter` gives None) and texts are tokenized whole, as before; a
sample is also tokenized both ways when a tokenizer is loaded, and any difference turns the
cutting off for it.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from collections.abc import Sequence

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

PER_CHARACTER_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}
PIECEWISE_PRE_TOKENIZERS = {"Split", "Digits", "Punctuation", "ByteLevel"}


def piece_cutter(tokenizer: Tokenizer, tokenizer_json: str) -> re.Pattern[str] | None:
    """The pattern of the texts a prompt may be cut at (its added tokens), or None when a cut
    could change the tokens."""
    spec = json.loads(tokenizer_json)
    if not (_normalizer_ok(spec.get("normalizer")) and _pre_tokenizer_ok(spec.get("pre_tokenizer"))):
        return None
    added = list(tokenizer.get_added_tokens_decoder().values())
    if not added or any(a.lstrip or a.rstrip or a.single_word or a.normalized for a in added):
        return None
    # Longest first: at one position the tokenizer takes the longest added token there.
    contents = sorted({a.content for a in added if a.content}, key=len, reverse=True)
    cutter = re.compile("(" + "|".join(re.escape(c) for c in contents) + ")")
    tokens = [a.content for a in added[:4]]
    sample = f"{tokens[0]}system\n  A 'b'  c.\n\n{tokens[-1]} über 12345 ☃{tokens[0]}\n x{tokens[-1]}"
    whole = tokenizer.encode(sample, add_special_tokens=False).ids
    pieces = [
        t for piece in cut(cutter, sample) for t in tokenizer.encode(piece, add_special_tokens=False).ids
    ]
    if whole != pieces:
        log.info("this tokenizer's tokens change where a prompt is cut: prompts are tokenized whole")
        return None
    return cutter


def cut(cutter: re.Pattern[str], text: str) -> list[str]:
    """``text`` in pieces: the added tokens, and the texts between them (none empty)."""
    return [piece for piece in cutter.split(text) if piece]


def _normalizer_ok(spec: dict | None) -> bool:
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_normalizer_ok(s) for s in spec.get("normalizers", []))
    return spec.get("type") in PER_CHARACTER_NORMALIZERS


def _pre_tokenizer_ok(spec: dict | None) -> bool:
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_pre_tokenizer_ok(s) for s in spec.get("pretokenizers", []))
    return spec.get("type") in PIECEWISE_PRE_TOKENIZERS and not spec.get("add_prefix_space", False)


class Ends(Sequence[int]):
    """Where each token of a text ends (a character offset), computed when read: a prompt's
    boundaries read a few of them."""

    def __init__(self, length: int) -> None:
        self._len = length

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if not -self._len <= index < self._len:
            raise IndexError("token index out of range")
        return self._end(index % self._len)

    def _end(self, index: int) -> int:
        raise NotImplementedError


class JoinedEnds(Ends):
    """The ends of a text cut in pieces: the pieces' own ends (``(first token, first
    character, ends)`` each), shifted."""

    def __init__(self, pieces: Sequence[tuple[int, int, Sequence[int]]], length: int) -> None:
        super().__init__(length)
        self._pieces = pieces
        self._starts = [first for first, _, _ in pieces]

    def _end(self, index: int) -> int:
        first, chars, ends = self._pieces[bisect.bisect_right(self._starts, index) - 1]
        return chars + ends[index - first]
