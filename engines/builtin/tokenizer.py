"""The model's tokenizer (transformers' fast tokenizer from the model folder), with streaming
detokenization and the chat template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import transformers


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        self._tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        eos = {self._tok.eos_token_id} if self._tok.eos_token_id is not None else set()
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.vocab_size = len(self._tok)
        self.has_chat_template = bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens (templates add their own)."""
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.has_chat_template:
            raise ValueError("this model has no chat template; use /v1/completions with a plain prompt")
        return self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )


class IncrementalDetokenizer:
    """Turns generated tokens into text deltas, holding back incomplete UTF-8 sequences.

    Decoding is done over a short window of preceding tokens so that tokenizers which
    merge or strip spaces at sequence starts produce the same text as a full decode.
    """

    def __init__(self, tokenizer: Tokenizer, prefix_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prefix_ids)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""
