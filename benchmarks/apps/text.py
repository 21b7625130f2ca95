"""The benchmark text and fresh prompts for every run.

The text is *The Devil's Dictionary* (public domain, see ``benchmarks/data/README.md``),
cut into passages of a given number of tokens with the engine's own tokenizer (fetched
from its ``GET /tokenizer``). Every run takes its passages from another place in the book,
and every side of every run puts a tag of its own at the start of its system prompts, so
neither the engine's prefix cache nor a ServeCore's context tree can reuse what an
earlier run (or the other side) computed. Within one run the system prompt is the same
for all the calls of that side: that sharing is deliberate.
"""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import httpx
from tokenizers import Tokenizer

TEXT = Path(__file__).resolve().parents[1] / "data" / "devils_dictionary.txt"
HEADWORD = re.compile(r"^([A-Z][A-Z'\- ]+[A-Z]), (?:n|v|adj|adv|pp|pron|prep|conj|x)\b", re.M)


def new_tag() -> str:
    """Six random digits: a side's tag for one run, at the start of its system prompts."""
    return str(100_000 + secrets.randbelow(900_000))


def run_rng(workload: str, config: str, run: int) -> random.Random:
    """The choice of passages and words of one run: the same for both sides of the run,
    different for every run."""
    return random.Random(f"{workload}/{config}/{run}")


@dataclass(frozen=True)
class Document:
    """The book, tokenized once; passages are cut from it at word boundaries."""

    text: str
    offsets: tuple[tuple[int, int], ...]  # character span of every token
    headwords: tuple[str, ...]

    @classmethod
    def load(cls, engine_url: str) -> Document:
        """The book, tokenized with the tokenizer of the engine at ``engine_url``."""
        response = httpx.get(f"{engine_url}/tokenizer", timeout=60)
        response.raise_for_status()
        return cls.tokenized_with(response.text)

    @classmethod
    def tokenized_with(cls, tokenizer_json: str) -> Document:
        """The book, tokenized with this ``tokenizer.json``."""
        tokenizer = Tokenizer.from_str(tokenizer_json)
        text = TEXT.read_text()
        offsets = tuple(tokenizer.encode(text, add_special_tokens=False).offsets)
        words = tuple(dict.fromkeys(m.group(1).title() for m in HEADWORD.finditer(text)))
        return cls(text, offsets, words)

    @property
    def num_tokens(self) -> int:
        return len(self.offsets)

    def passages(self, rng: random.Random, count: int, tokens: int) -> list[str]:
        """``count`` consecutive passages of about ``tokens`` tokens each (at most that
        many, cut back to a word boundary), from a place in the book chosen by ``rng``."""
        span = count * tokens
        if span >= self.num_tokens:
            raise ValueError(
                f"{count} passages of {tokens} tokens need more than the book's {self.num_tokens}"
            )
        first = rng.randrange(self.num_tokens - span)
        return [self._passage(first + n * tokens, tokens) for n in range(count)]

    def _passage(self, first: int, tokens: int) -> str:
        start = self.offsets[first][0]
        end = self.offsets[first + tokens - 1][1]
        piece = self.text[start:end]
        head = re.search(r"\s", piece)  # begin and end at word boundaries
        tail = max(piece.rfind(" "), piece.rfind("\n"))
        if head is not None and tail > head.start():
            piece = piece[head.start() : tail]
        return piece.strip()

    def words(self, rng: random.Random, count: int) -> list[str]:
        """``count`` headwords of the book (with repeats only when it has too few)."""
        if count <= len(self.headwords):
            return rng.sample(self.headwords, count)
        return [rng.choice(self.headwords) for _ in range(count)]
