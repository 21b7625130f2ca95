"""How a text context becomes the ``messages`` of a chat completion request.

The rule (the same text always gives the same messages):

1. Text without a ChatML marker (``<|im_start|>``) is one ``user`` message: a Parrot
   template such as ``"You are terse. Q: {{q}} A: {{a}}"`` is sent as the user's turn,
   system prompt included (a piece boundary is never a message boundary).
2. Text with markers is read as ChatML, the rendering the ServeCore uses for chats on
   engines without a template of their own: ``<|im_start|>ROLE\\nCONTENT<|im_end|>``
   per message, ``ROLE`` one of system, developer, user, assistant. A message also ends
   at the next ``<|im_start|>``. Non-blank text outside messages (before the first, between
   two, after the last) becomes a ``user`` message of its own, stripped of surrounding
   whitespace. A system prompt filled as the first piece (``<|im_start|>system\\n...``)
   thus stays the ``system`` message, whatever follows it.
3. A final open ``<|im_start|>assistant\\n`` with nothing after it is the generation
   prompt: it is dropped (the endpoint adds its own). With text after it, that text is
   sent as a last ``assistant`` message (a prefill: endpoints that support it continue it,
   others answer after it).
4. An unknown role, or a marker without a role line, is a :class:`BadRequestError`;
   so is text with no message at all.

Generated text is appended to the context as is (no ``<|im_end|>`` is added).
"""

from __future__ import annotations

from typing import Final

from parrot.engines.protocol.errors import BadRequestError

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
ROLES: Final = frozenset({"system", "developer", "user", "assistant"})


def to_messages(text: str) -> list[dict[str, str]]:
    """The chat messages of a context's text (see the module docstring for the rule)."""
    if IM_START not in text:
        if not text.strip():
            raise BadRequestError("the context is empty: there is nothing to send as a message")
        return [{"role": "user", "content": text}]
    messages: list[dict[str, str]] = []
    pos = 0
    while pos < len(text):
        start = text.find(IM_START, pos)
        if start < 0:
            _loose(messages, text[pos:])
            break
        _loose(messages, text[pos:start])
        header_end = text.find("\n", start)
        if header_end < 0:
            raise BadRequestError(f"a {IM_START} marker at character {start} has no role line")
        role = text[start + len(IM_START) : header_end].strip()
        if role not in ROLES:
            raise BadRequestError(
                f"unknown chat role {role!r} at character {start}; expected one of {sorted(ROLES)}"
            )
        body_start = header_end + 1
        ends = [i for i in (text.find(IM_END, body_start), text.find(IM_START, body_start)) if i >= 0]
        body_end = min(ends) if ends else len(text)
        content = text[body_start:body_end]
        closed = text.startswith(IM_END, body_end)
        if not closed and body_end == len(text) and role == "assistant" and not content.strip():
            break  # the generation prompt
        messages.append({"role": role, "content": content})
        pos = body_end + len(IM_END) if closed else body_end
    if not messages:
        raise BadRequestError("the context holds no chat message, only a generation prompt")
    return messages


def _loose(messages: list[dict[str, str]], text: str) -> None:
    """Text outside ChatML messages: a user message if it is not blank."""
    if text.strip():
        messages.append({"role": "user", "content": text.strip()})
