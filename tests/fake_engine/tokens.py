"""The fake model's tokens: one per byte (a text's tokens are its UTF-8 bytes), ``EOS`` 256;
its ``tokenizer.json`` (which a ServeCore runs with HF ``tokenizers``, as it runs a real
model's); and what it generates after a context: a letter or a space picked by a CRC of the
context's tokens (so a text depends on its prompt, and on nothing else)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

MODEL = "fake-model"
EOS = 256
VOCAB_SIZE = 257
LETTERS = b"abcdefghijklmnopqrstuvwxyz    "  # a space one token in ~8: words
BLOCK_SIZE = 16


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable character for each byte (byte-level BPE's alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update((b, chr(256 + n)) for n, b in enumerate(extra))
    return chars


def tokenizer_json() -> str:
    """The fake model's ``tokenizer.json``: one token per byte (id = byte value), ``<eos>`` 256.
    The ServeCore runs it (HF ``tokenizers``), as it runs a real model's."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    chars = _byte_chars()
    tokenizer = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    return tokenizer.to_str()


class FakeTokenizer:
    """The same tokens in Python, and a chat template."""

    name = MODEL
    eos_token_ids = frozenset({EOS})
    has_chat_template = True

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return "".join(self.chat_pieces(messages, add_generation_prompt))

    def chat_pieces(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[str]:
        """The chat's prompt in message-boundary pieces (what ``/render_chat`` answers)."""
        pieces = [f"<|{m['role']}|>{m['content']}\n" for m in messages]
        if add_generation_prompt:
            pieces[-1] += "<|assistant|>"
        return pieces


def next_token(tokens: bytes | bytearray) -> int:
    """The token the fake model generates after ``tokens``."""
    return LETTERS[zlib.crc32(tokens) % len(LETTERS)]


class StopStrings:
    """Where a stop string cuts the text, and how much of the text's end to hold back."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = list(stops)

    def cut(self, text: str) -> int | None:
        found = [i for s in self.stops if (i := text.find(s)) >= 0]
        return min(found) if found else None

    def holdback(self, text: str) -> int:
        return max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
