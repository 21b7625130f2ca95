"""Valid text: every string Parrot stores, tokenizes or sends is valid Unicode.

A Python ``str`` may hold lone surrogates (U+D800 to U+DFFF): JSON's ``"\\ud800"`` escape
decodes to one, and so does a JSON value a transform parses. Such a string has no UTF-8
form: the database driver, the tokenizer and the JSON encoder all fail on it, long after
the request that brought it was answered. So text is checked where it enters. Request
bodies: msgspec's JSON decoder refuses a lone surrogate escape itself (400). Text from an
OpenAI-compatible endpoint (decoded by the ``json`` module, which lets them through): each
is replaced by U+FFFD, as the builtin engine does with bytes that are not UTF-8, so the
streamed text and the final value agree. Values a transform produces: the transform fails
with the reason. And the ServeCore's variables take no invalid value whatever its source
(the call fails with the reason).

U+0000 (NUL) is valid Unicode but no text a store keeps: PostgreSQL's text types cannot
hold it. So it is refused (or replaced) wherever a lone surrogate is, and a deployment
keeps working when it moves from SQLite to PostgreSQL.
"""

from __future__ import annotations

import re

SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_at(text: str) -> int | None:
    """Where the first lone surrogate of ``text`` is (None: the text is valid)."""
    if text.isascii():  # the common case, checked in C without a scan of the characters
        return None
    found = SURROGATE.search(text)
    return None if found is None else found.start()


def problem(text: str) -> str | None:
    """Why ``text`` is not valid text (None: it is)."""
    nul = text.find("\x00")
    if nul >= 0:
        return f"NUL character (U+0000) at character {nul} (no text may hold U+0000)"
    at = surrogate_at(text)
    if at is None:
        return None
    return (
        f"lone surrogate U+{ord(text[at]):04X} at character {at} "
        "(text must be valid Unicode: a JSON \\ud800-\\udfff escape must be half of a pair)"
    )


def replace_invalid(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, as a decoder replaces bytes that
    are not UTF-8 (how the builtin engine's detokenizer treats a broken character)."""
    text = text.replace("\x00", "\ufffd")
    return text if surrogate_at(text) is None else SURROGATE.sub("\ufffd", text)


def printable(text: str) -> str:
    """``text`` made storable as is: any lone surrogate written as its escape (for reasons
    and messages, which may quote what they were given)."""
    text = text.replace("\x00", "\\x00")
    return text if surrogate_at(text) is None else text.encode("utf-8", "backslashreplace").decode("utf-8")
