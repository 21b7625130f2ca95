"""Bodies of the routes that framework adapters use (:mod:`parrot.platform.api.adapter_routes`):
the server encodes them, the SDK decodes them. msgspec only, like ``responses.py``."""

from __future__ import annotations

from typing import Annotated

import msgspec

from parrot.wire.chat import ChatTurn


class RenderChat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A chat to render as one prompt text; ``model`` defaults to the first model served."""

    messages: Annotated[list[ChatTurn], msgspec.Meta(min_length=1, max_length=4096)]
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


class RenderedChat(msgspec.Struct, kw_only=True, frozen=True):
    """The chat in ``model``'s own chat template, with the assistant's generation prompt:
    ``prompt`` is the whole text, ``pieces`` the same text split at message boundaries
    (where the template allows). The text of each message is in it as it was sent, so a
    client may send ``{{placeholders}}`` as contents to get a semantic-call template."""

    model: str
    prompt: str
    pieces: list[str]


class CallUsage(msgspec.Struct, kw_only=True, frozen=True):
    """Tokens of one semantic call, summed over its generations (zeros until generated)."""

    call_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens found already on the engine
    finish_reason: str | None = None  # of its last generation: "stop" or "length"


class SessionUsage(msgspec.Struct, kw_only=True, frozen=True):
    session_id: str
    calls: list[CallUsage]
