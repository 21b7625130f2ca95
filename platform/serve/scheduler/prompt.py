"""A completion chain's prompt on a model: the tokens of its whole rendered text.

The prompt of a chain is its call's text up to its generation: constant template text,
input values and, for a later output of a call, the earlier outputs. It is tokenized as a
whole, exactly as a plain server tokenizes the same text, so greedy outputs equal the
engine's ``/v1/completions`` on that text. Two refinements:

- A later output of a multi-output call continues from what the earlier one generated: its
  prompt is the earlier prompt, the generated tokens as they are in the KV cache, then the
  text in between. (Re-tokenizing the generated text could give other tokens and would
  compute the generation again; when a stop string cut the text, the whole text is
  tokenized instead.)
- ``shared`` marks the lengths at which the prompt's leading constant text ends (a system
  prompt, the messages of a chat): prefixes every session may share, worth keeping as
  contexts of their own.

The known prefix of a chain that still waits for an input (its text up to that input) is
what the ServeCore fills ahead; its last token is left out, as it may merge with the text
that follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parrot.platform.serve.calls.graph import CompletionChain, ConstantFill, Node, PlaceholderFill
from parrot.platform.serve.contexts.radix import common_prefix
from parrot.platform.serve.engines.tokenizers import Tokenize, TokenizerManager
from parrot.platform.serve.variables.formats import FieldError


@dataclass(frozen=True)
class Prompt:
    symbols: tuple[int, ...] | str  # token ids, or text for engines whose contexts are text
    shared: tuple[int, ...] = ()  # lengths of prefixes of constant text only, shortest first

    def __len__(self) -> int:
        return len(self.symbols)


@dataclass(frozen=True)
class Part:
    text: str
    constant: bool  # template text, the same for every session


def node_part(node: Node) -> Part:
    """A node's text: template text, an input's value (or the field it reads: raises
    ``FieldError`` when missing), or an earlier output of the call."""
    if isinstance(node, ConstantFill):
        return Part(node.text, True)
    if isinstance(node, PlaceholderFill):
        return Part(node.text or "", False)
    return Part(node.var.value or "", False)


def chain_parts(chain: CompletionChain) -> list[Part]:
    """The text before the chain's generation, from the call's start, in parts."""
    return [node_part(node) for node in chain.prompt_nodes()]


def known_parts(chain: CompletionChain) -> list[Part] | None:
    """The parts of a waiting first chain up to its first input without a value (None: it
    waits for nothing, or is a later chain of its call, whose prompt waits on a generation)."""
    if chain.index:
        return None
    parts = []
    for node in chain.fills:
        if isinstance(node, PlaceholderFill) and not node.var.ready:
            return parts
        try:
            parts.append(node_part(node))
        except FieldError:  # the call fails when it runs; nothing to fill ahead past it
            return parts
    return None


def constant_ends(parts: Sequence[Part]) -> list[int]:
    """Character offsets where each part of the leading run of constant parts ends."""
    ends, offset = [], 0
    for part in parts:
        if not part.constant:
            break
        offset += len(part.text)
        if part.text:
            ends.append(offset)
    return ends


class PromptBuilder:
    def __init__(self, tokenizers: TokenizerManager) -> None:
        self.tokenizers = tokenizers

    async def build(self, chain: CompletionChain, model: str, fetch: Tokenize | None, text: bool) -> Prompt:
        """The chain's prompt for an engine of ``model`` (``text``: its contexts are text)."""
        parts = chain_parts(chain)
        continued = None if text else self._continuation(chain, model)
        if continued is not None:
            tail = "".join(node_part(n).text for n in chain.fills)
            ids = continued + (await self.tokenizers.encode(model, tail, fetch)).ids if tail else continued
            return Prompt(tuple(ids))
        return await self._render(parts, model, fetch, text, drop_last=False)

    async def known_prefix(
        self, chain: CompletionChain, model: str, fetch: Tokenize | None, text: bool
    ) -> Prompt | None:
        parts = known_parts(chain)
        if not parts:
            return None
        return await self._render(parts, model, fetch, text, drop_last=True)

    def _continuation(self, chain: CompletionChain, model: str) -> tuple[int, ...] | None:
        """Prompt + generated tokens of the chain before this one, when kept as they are."""
        previous = chain.previous
        if previous is None or previous.result is None:
            return None
        before = previous.prompt_ids_by_model.get(model)
        result = previous.result
        if before is None or not result.token_ids or getattr(result, "stop_string", False):
            return None
        return tuple(before) + tuple(result.token_ids)

    async def _render(
        self, parts: Sequence[Part], model: str, fetch: Tokenize | None, text: bool, drop_last: bool
    ) -> Prompt:
        whole = "".join(p.text for p in parts)
        ends = constant_ends(parts)
        if text:
            return Prompt(whole, tuple(e for e in ends if e < len(whole) or not drop_last))
        encoding = await self.tokenizers.encode(model, whole, fetch)
        ids = encoding.ids[:-1] if drop_last else encoding.ids
        shared: list[int] = []
        for end in ends:
            if encoding.ends is not None:
                n = encoding.tokens_within(end)
            else:  # no token spans: the prefix's own tokens, as far as they agree
                n = common_prefix((await self.tokenizers.encode(model, whole[:end], fetch)).ids, ids)
            n = min(n, len(ids))
            if n and (not shared or n > shared[-1]):
                shared.append(n)
        return Prompt(tuple(ids), tuple(shared))
