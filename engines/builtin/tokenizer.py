"""The model's tokenizer (transformers' fast tokenizer from the model folder), with streaming
detokenization and the chat template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import transformers

from parrot.engines.builtin.model.loader import NAME_MARKER
from parrot.engines.builtin.model.model_config import read_eos_token_ids
from parrot.engines.protocol.errors import ModelLoadError
from parrot.wire.tool_syntax import GENERIC, TOKEN_TEXTS, syntax_of_template

REPLACEMENT = "\ufffd"  # what a partial UTF-8 sequence decodes to


class Tokenizer:
    """Text <-> token ids for one model folder; never touches the network."""

    def __init__(self, folder: Path, tool_format: str = "auto") -> None:
        """``tool_format``: as ``--tool-format`` (the model's own tool syntax, or generic)."""
        folder = Path(folder)
        try:
            self._tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"cannot load the tokenizer of {folder}: {error}") from error
        eos = set(read_eos_token_ids(folder))
        if self._tok.eos_token_id is not None:
            eos.add(self._tok.eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.vocab_size: int = len(self._tok)  # includes added tokens
        template = getattr(self._tok, "chat_template", None)
        self.has_chat_template = bool(template)
        # The template's source (its named variants joined): what its tool syntax is read from.
        joined = "\n".join(template.values()) if isinstance(template, dict) else template
        self.chat_template: str = joined or ""
        marker = folder / NAME_MARKER
        self.name: str = marker.read_text().strip() if marker.is_file() else folder.name
        self._hidden: frozenset[int] | None = None  # set by keep(): the special ids text leaves out
        if syntax_of_template(self.chat_template, tool_format) is not GENERIC:
            self.keep(TOKEN_TEXTS)  # the model writes calls in its own syntax: markers are text

    @property
    def hf(self) -> transformers.PreTrainedTokenizerBase:
        """The transformers tokenizer itself (the grammar library reads its vocabulary)."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens (templates add their own)."""
        return self._tok.encode(text, add_special_tokens=False)

    def keep(self, texts: Sequence[str]) -> None:
        """Special tokens whose text the decoded text keeps all the same: a tool syntax's
        markers (Mistral's ``[TOOL_CALLS]`` is a special token, and its answer's reader
        needs it)."""
        specials = {i for i, t in self._tok.added_tokens_decoder.items() if t.special}
        kept = {i for i in specials if self._tok.added_tokens_decoder[i].content in texts}
        self._hidden = frozenset(specials - kept) if kept else None

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``; special tokens (``<|im_end|>`` ...) are left out by default
        (but for those :meth:`keep` keeps)."""
        if skip_special_tokens and self._hidden is not None:
            shown = [i for i in token_ids if i not in self._hidden]
            return self._tok.decode(shown, skip_special_tokens=False)
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The prompt text for a chat (``tools``: OpenAI function tools, for a template that
        renders them); raises ValueError when the model has no template."""
        if not self.has_chat_template:
            raise ValueError(
                f"model {self.name!r} has no chat template; use /v1/completions with a plain prompt"
            )
        return self._tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )


def chat_pieces(tokenizer: Tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[str]:
    """The chat prompt split at message boundaries: piece i ends after message i, as long
    as the template renders each shorter chat as a prefix of the longer one (templates
    that rewrite earlier turns get fewer, longer pieces). ``"".join`` is the whole prompt."""
    full = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    pieces: list[str] = []
    done = ""
    for end in range(1, len(messages)):
        prefix = tokenizer.apply_chat_template(messages[:end], add_generation_prompt=False, tools=tools)
        if not (prefix.startswith(done) and full.startswith(prefix)):
            break
        if len(prefix) > len(done):
            pieces.append(prefix[len(done) :])
            done = prefix
    pieces.append(full[len(done) :])
    return pieces


class IncrementalDetokenizer:
    """Turns generated tokens into text deltas, holding back incomplete UTF-8 sequences.

    Each token is decoded together with a short window of preceding tokens (starting with
    the prompt's last few), and the delta is the text beyond the window's own decoding.
    For byte-level BPE tokenizers (Llama 3, Qwen2, SmolLM2) the deltas concatenate to
    ``tokenizer.decode(generated_ids)``; for SentencePiece ones they keep the leading space
    that the context implies, where a standalone decode would strip it.
    """

    def __init__(self, tokenizer: Tokenizer, prefix_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        prefix = list(prefix_ids)
        if REPLACEMENT in tokenizer.decode(prefix):
            # A prompt ending inside a character would mis-align the window; start clean.
            prefix = []
        self._ids = prefix
        self._prefix_offset = 0  # window start
        self._read_offset = len(prefix)  # end of the text already emitted
        self._prefix_text = tokenizer.decode(prefix)
        self._text = ""

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return self._text

    def add(self, token_id: int) -> str:
        """Text that ``token_id`` completes; "" while a character is still incomplete."""
        self._ids.append(token_id)
        full = self.tokenizer.decode(self._ids[self._prefix_offset :])
        if len(full) <= len(self._prefix_text) or full.endswith(REPLACEMENT):
            return ""  # nothing visible yet (special token) or a partial character
        return self._emit(full)

    def flush(self) -> str:
        """Text still held back at the end of a generation (a partial character as U+FFFD)."""
        full = self.tokenizer.decode(self._ids[self._prefix_offset :])
        return self._emit(full) if len(full) > len(self._prefix_text) else ""

    def _emit(self, full: str) -> str:
        delta = full[len(self._prefix_text) :]
        # Slide the window: the new tokens become the context of the next ones.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self.tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        self._text += delta
        return delta
