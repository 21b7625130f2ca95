"""Lark string literals that are the model's own tokens (issue 36 §2).

A tokenizer's added tokens (Qwen2.5's ``<tool_call>``, Qwen3's ``<think>``, Mistral's
``[TOOL_CALLS]``) are what the model writes for that text: its tokenizer turns the text
into the token, and the model was trained on it. llguidance matches an added token only as
a special token (``<[id]>`` in its Lark), never as the text of a string literal, so a
grammar that says ``"<tool_call>"`` masks out the very token the model means and leaves it
only the spelled-out text (``<``, ``tool``, ``_call``, ``>``), which it never saw. Here each
literal of a grammar *rule* whose text is exactly an added token's becomes "that text, or
that token": ``("<tool_call>" | <[151657]>)``. Terminals (upper-case definitions) are left
as they are (a lexeme cannot hold a special token), and so are literals inside regexes,
comments and ``%json`` / ``%regex`` blocks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

_DEFINITION = re.compile(r"\s*(\??[A-Za-z_][A-Za-z0-9_]*)(\.-?\d+)?\s*:")
_BLOCK = re.compile(r"%[a-z]+\s*\{")  # %json { ... }, %regex { ... }: JSON inside


def with_token_literals(grammar: str, added: Mapping[str, int]) -> str:
    """``grammar`` (llguidance's Lark) with each rule literal whose text is an added token's
    (``added``: text -> id) also matching that token."""
    if not added:
        return grammar
    out: list[str] = []
    i, n = 0, len(grammar)
    terminal = False  # inside the definition of a terminal (its literals stay text)
    line_start = True
    while i < n:
        c = grammar[i]
        if line_start:
            line_start = False
            head = _DEFINITION.match(grammar, i)
            if head is not None:
                terminal = head.group(1).lstrip("?").isupper()
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
        elif grammar.startswith("//", i):
            end = grammar.find("\n", i)
            end = n if end < 0 else end
            out.append(grammar[i:end])
            i = end
        elif c == "/":
            end = _skip_quoted(grammar, i, "/")
            out.append(grammar[i:end])
            i = end
        elif c == "%" and (block := _BLOCK.match(grammar, i)):
            end = _skip_braces(grammar, block.end() - 1)
            out.append(grammar[i:end])
            i = end
        elif c == '"':
            end = _skip_quoted(grammar, i, '"')
            literal = grammar[i:end]
            flagged = end < n and grammar[end] == "i"  # case-insensitive: not one token
            out.append(_token_or_text(literal, added) if not (terminal or flagged) else literal)
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _token_or_text(literal: str, added: Mapping[str, int]) -> str:
    try:
        text = json.loads(literal)  # a Lark string literal's escapes are JSON's
    except ValueError:
        return literal
    token = added.get(text) if isinstance(text, str) else None
    return literal if token is None else f"({literal} | <[{token}]>)"


def _skip_quoted(text: str, start: int, quote: str) -> int:
    """The index after the literal opened by ``quote`` at ``start`` (escapes honoured)."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return len(text)


def _skip_braces(text: str, start: int) -> int:
    """The index after the JSON object that opens at ``start`` (strings honoured)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _skip_quoted(text, i, '"')
            continue
        depth += (c == "{") - (c == "}")
        i += 1
        if depth == 0:
            return i
    return len(text)
