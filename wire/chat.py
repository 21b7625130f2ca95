"""One turn of a chat, as a client sends it to be rendered with a model's chat template
(``POST /v1/render_chat`` of the ServeCore, ``/render_chat`` of an engine)."""

from __future__ import annotations

from typing import Annotated

import msgspec


class ChatTurn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    role: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    content: str
